"""A results directory of the collaboration benchmark: ``meta.json`` (:func:`merge_meta`, one contributor per
directory: :func:`check_contributor`) and the summary files rebuilt from ``before.json`` and ``cells/``
(:func:`summarize`: ``results.json``, ``results.md``, ``collab.png``)."""

from __future__ import annotations

import json
from pathlib import Path

from collab.plot import plot
from collab.render import render_markdown
from collab.summary import summary_of


STRONG = "strong:"
"""``--contributor strong:P``: the strong contributor of ``benchmarks/strong_contributor.py`` at accuracy P."""


def strong_accuracy(value: str) -> float | None:
    """P of ``strong:P`` (a float in [0, 1]); None for any other contributor. Raises ``ValueError`` for a bad P."""
    if not value.startswith(STRONG):
        return None
    try:
        p = float(value.removeprefix(STRONG))
    except ValueError:
        p = -1.0
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"--contributor {value}: P of strong:P must be a number in [0, 1]")
    return p


def contributor_source(value: str) -> str:
    """A contributor's identity as cells and ``meta.json`` record it: the URL, or the directory resolved."""
    if value.startswith(("http://", "https://")) or value.startswith(STRONG):
        return value
    return str(Path(value).expanduser().resolve())


def check_contributor(path: Path, name: str, source: str) -> None:
    """Raise ``ValueError`` when ``meta.json`` at ``path`` names another contributor (name or source) than
    ``name`` from ``source``: two contributors' cells would mix under one recipe name."""
    old = json.loads(path.read_text()).get("contributor") if path.exists() else None
    if old and (old.get("name"), old.get("source")) != (name, source):
        raise ValueError(f"{path.parent} holds cells of contributor {old.get('name')!r} from {old.get('source')!r}; "
                         f"this run's is {name!r} from {source!r}: use another --out")


def recorded_engines(path: Path, unrecorded: dict[str, str]) -> dict[str, str] | None:
    """The engines the results (cells or ``before.json``) in the directory of ``meta.json`` at ``path`` were made
    with: what ``meta.json`` records, or ``unrecorded`` for a ``meta.json`` written before engines were recorded;
    None when the directory holds no results."""
    if not path.exists() or not ((path.parent / "before.json").exists()
                                 or any((path.parent / "cells").glob("*.json"))):
        return None
    return json.loads(path.read_text()).get("engines") or unrecorded


def check_engines(path: Path, engines: dict[str, str], unrecorded: dict[str, str]) -> None:
    """Raise ``ValueError`` when the results directory of ``meta.json`` at ``path`` holds results (cells or
    ``before.json``) made with other rollout engines than ``engines`` (learner → ``model.engine``): engines are never
    mixed within one benchmark (greedy text, and so every outcome, may differ between engines). A ``meta.json``
    written before engines were recorded counts as made with ``unrecorded`` (the config's engines: the only way
    cells were made then)."""
    old = recorded_engines(path, unrecorded)
    if old is not None and old != engines:
        raise ValueError(f"{path.parent} holds cells made with engines {old}; this run's are {engines}: "
                         "engines are never mixed within one benchmark, use another --out")


def choose_engines(path: Path, cfg, requested: str | None) -> dict[str, str]:
    """Every learner's rollout engine for a run into the results directory of ``meta.json`` at ``path``
    (learner → a concrete ``model.engine``, ``auto`` resolved by :func:`hacrl_fed.worker.engines.resolve_engine`):

    * ``requested`` (``--engine``; ``auto`` allowed) when given;
    * otherwise the engines ``meta.json`` records when the directory holds results (a benchmark resumes as it
      began); a ``meta.json`` from before engines were recorded means the config's;
    * otherwise the config's ``model.engine`` (``hf`` unless it says otherwise). Not ``auto``: a task-suite cell
      with ``ct2`` float32 took 155 s against ``hf``'s 149 s, idle (docs/engines.md, "Which engine auto picks"):
      its rollouts pay a refresh per update and the teacher-forced log-probs, which eat the evaluation's gain.

    Raises ``ImportError`` (one line) when a chosen engine cannot run here, ``ValueError`` for an unknown name."""
    from hacrl_fed.registries import ROLLOUT_ENGINES
    from hacrl_fed.worker.engines import require_engine, resolve_engine

    learners = [a for a in cfg.agents if not a.rollout_only]
    recorded = recorded_engines(path, {a.name: a.model.engine for a in learners}) if requested is None else None
    if recorded is not None:
        return {a.name: recorded.get(a.name, a.model.engine) for a in learners}
    chosen = {}
    for a in learners:
        name = requested or a.model.engine
        ROLLOUT_ENGINES.check(name)
        chosen[a.name] = resolve_engine(name, a.model.device, a.model.behaviour_logprobs)
        require_engine(chosen[a.name])
    return chosen


def merge_meta(path: Path, meta: dict, contributor: dict | None) -> dict:
    """``meta.json`` of this run: ``meta``, with ``contributor`` (this run's record) under ``"contributor"``, or
    the one the existing file at ``path`` holds when this run has none (its ``+contrib`` cells stay described).

    ``"commands"``: every distinct command that added cells without a contributor to the directory, in order (a run
    with other recipes adds its command; the earlier ones stay, so every cell's command is on record);
    ``"command"`` is the latest of them and ``"seeds"`` the most any of them asked for. A run that adds
    contributor cells keeps the directory's ``"command"``, ``"commands"`` and ``"seeds"``; its own command is the
    contributor record's."""
    old = json.loads(path.read_text()) if path.exists() else {}
    site = contributor or old.get("contributor")
    extra = {"contributor": site} if site else {}
    if contributor and old.get("command"):
        return meta | {k: old[k] for k in ("command", "commands", "seeds") if k in old} | extra
    commands = list(old.get("commands") or ([old["command"]] if old.get("command") else []))
    if meta.get("command") and meta["command"] not in commands:
        commands.append(meta["command"])
    seeds = max(int(old.get("seeds") or 0), int(meta.get("seeds") or 0))
    return meta | {"commands": commands, "seeds": seeds} | extra


def summarize(out: Path) -> dict:
    """Rebuild the summary of the results directory ``out`` from its ``meta.json``, ``before.json`` and
    ``cells/*.json`` (:func:`collab.summary.summary_of`); write ``results.json``, ``results.md`` and, when
    matplotlib is installed, ``collab.png``; return the summary. Runs no cell."""
    before = json.loads((out / "before.json").read_text())
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    meta = json.loads((out / "meta.json").read_text())
    summary = summary_of(meta, before, cells)
    agents = sorted(before["agents"])
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(render_markdown(summary, agents))
    try:
        plot(summary, agents, out / "collab.png")
    except ImportError:
        pass
    return summary
