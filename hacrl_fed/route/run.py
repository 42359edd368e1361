"""The body of ``hacrl-fed route eval``: data → every model's outcomes (cached) → policies → report + router.

Steps:

1. The routed queries (``--data``) and the calibration queries (``--calibration``, or a seeded split of
   ``--data`` stratified by task, ``calibration_frac`` of each task); a query in both is dropped from the routed
   ones (ids or texts).
2. Every model answers every query (:mod:`hacrl_fed.route.measure`). Each model's outcomes are cached in
   ``<out>/outcomes/<name>.json`` under a key of the model, the queries, the token cap and the prompt; a rerun
   with the same inputs reuses them (an interrupted run resumes at the next model).
3. Query embeddings (:mod:`hacrl_fed.route.embed`), the policies (:func:`hacrl_fed.route.evaluate.compare`),
   ``route.json`` / ``route.md`` / ``route.png``, and ``router.json`` (:mod:`hacrl_fed.route.router`) for
   ``route serve --router``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hacrl_fed.atomic import atomic_write_text, read_bounded
from hacrl_fed.data.problem import DataError, Problem
from hacrl_fed.route.measure import ModelSpec, Outcomes

__all__ = ["capability_from_report", "load_queries", "run_route_eval", "split_calibration"]

log = logging.getLogger("hacrl_fed.route")

MAX_REPORT_BYTES = 64 * 2**20
"""Largest ``report.json`` read for ``--capability``."""
MAX_OUTCOMES_BYTES = 64 * 2**20


def split_calibration(problems: Sequence[Problem], frac: float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """``(calibration, routed)``: ``frac`` of each task's problems (at least one when the task has two or more),
    chosen by a seeded shuffle. Raises ``ValueError`` unless 0 < frac < 1."""
    if not 0.0 < frac < 1.0:
        raise ValueError(f"calibration fraction must be in (0, 1), got {frac}")
    rng = random.Random(seed)
    cal, routed = [], []
    by_task: dict[str, list[Problem]] = {}
    for p in problems:
        by_task.setdefault(p.source, []).append(p)
    for task in sorted(by_task):
        items = list(by_task[task])
        rng.shuffle(items)
        n = max(1, round(frac * len(items))) if len(items) > 1 else 0
        cal += items[:n]
        routed += items[n:]
    return cal, routed


def load_queries(path: str | Path, eval_size: int | None = None) -> list[Problem]:
    """Queries from a data file (``.jsonl`` / ``.json`` / ``.parquet``), or — for a ``.toml`` run config (a
    ``simulate`` or ``server`` config) — that run's held-out problems, ``eval_size`` per task when given (each
    carries its task in ``source``). Raises :class:`DataError` or ``ConfigError`` (both ``ValueError``)."""
    from hacrl_fed.data.datasets import load_file, load_problems

    p = Path(path)
    if p.suffix != ".toml":
        return load_file(p)
    from hacrl_fed.config import ConfigError, ServerConfig, SimulateConfig, load_config

    try:
        cfg = load_config(p, SimulateConfig)
    except ConfigError as err:
        try:
            cfg = load_config(p, ServerConfig)
        except ConfigError:
            raise err from None
    data = cfg.run.data
    update: dict[str, Any] = {} if eval_size is None else {"eval_size": eval_size}
    if data.source == "reasoning_gym":          # only the held-out items are wanted: make few training items
        update["num_problems"] = len(data.tasks)
    return load_problems(data.model_copy(update=update))[1]


def capability_from_report(path: str | Path) -> dict[str, dict[str, float]]:
    """``{task: {agent: held-out accuracy after training}}`` from a run's ``report.json`` (its ``tasks`` section;
    for a single-task run ``{"": {agent: last evaluation accuracy}}``). Raises ``ValueError`` (one line)."""
    try:
        rec = json.loads(read_bounded(path, MAX_REPORT_BYTES))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable report.json: {' '.join(str(err).split())}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: not a report.json object")
    tasks = rec.get("tasks")
    out: dict[str, dict[str, float]] = {}
    if isinstance(tasks, dict) and tasks:
        for task, per in tasks.items():
            if isinstance(per, dict):
                out[str(task)] = {str(a): float(v["held_out_after"]) for a, v in per.items()
                                  if isinstance(v, dict) and isinstance(v.get("held_out_after"), (int, float))}
    else:
        evals = rec.get("evals")
        last = evals[-1] if isinstance(evals, list) and evals and isinstance(evals[-1], dict) else {}
        acc = last.get("accuracy") if isinstance(last.get("accuracy"), dict) else {}
        out[""] = {str(a): float(v) for a, v in acc.items() if isinstance(v, (int, float))}
    if not any(out.values()):
        raise ValueError(f"{path}: no per-agent held-out accuracy in it")
    return out


def _key(spec: ModelSpec, problems: Sequence[Problem], settings: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps([spec.target, spec.api_model, settings], sort_keys=True).encode())
    for p in problems:
        h.update(f"{p.id}\0{p.problem}\0{p.answer}\0{p.answer_style}\n".encode())
    return h.hexdigest()


def _cached(path: Path, key: str) -> Outcomes | None:
    if not path.is_file():
        return None
    try:
        rec = json.loads(read_bounded(path, MAX_OUTCOMES_BYTES))
        if rec.get("key") != key:
            return None
        return Outcomes.from_json(rec["outcomes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("route: ignoring unreadable cache %s: %s", path, err)
        return None


def _measure_all(specs: Sequence[ModelSpec], problems: Sequence[Problem], out: Path, *, verifier, settings: dict,
                 api_keys: dict[str, str], progress: Callable[[str, int, int], None] | None,
                 engine: str = "hf") -> list[Outcomes]:
    """Every model's outcomes on ``problems``: reused from ``out/outcomes/<name>.json`` when its key (model,
    problems, ``settings``) matches, else measured — a local model with the engine ``engine`` names (``auto``
    builds ``ct2`` or falls back to ``hf``)."""
    from hacrl_fed.route.measure import measure_endpoint, measure_local

    results = []
    for spec in specs:
        path = out / "outcomes" / f"{spec.name}.json"
        key = _key(spec, problems, settings)
        got = _cached(path, key)
        if got is None:
            tick = (lambda done, name=spec.name: progress(name, done, len(problems))) if progress else None
            if spec.is_endpoint:
                got = measure_endpoint(spec, problems, verifier=verifier, max_new_tokens=settings["max_new_tokens"],
                                       system_prompt=settings["system_prompt"] or _default_system_prompt(),
                                       timeout_s=settings["timeout_s"], api_key=api_keys.get(spec.name),
                                       on_progress=tick)
            else:
                got = measure_local(spec, problems, verifier=verifier, max_new_tokens=settings["max_new_tokens"],
                                    system_prompt=settings["system_prompt"], batch_size=settings["batch_size"],
                                    device=settings["device"], engine=engine,
                                    on_progress=tick)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"key": key, "outcomes": got.to_json()}))
        else:
            log.info("route: %s outcomes reused from %s", spec.name, path)
        results.append(got)
    return results


def _default_system_prompt() -> str:
    from hacrl_fed.config import ModelConfig

    return ModelConfig.model_fields["system_prompt"].default


def _matrix(outs: Sequence[Outcomes], field: str, rows: np.ndarray) -> np.ndarray:
    return np.array([[getattr(o, field)[i] for i in rows] for o in outs], dtype=float)


def run_route_eval(specs: Sequence[ModelSpec], problems: Sequence[Problem], calibration: Sequence[Problem] | None,
                   out: str | Path, *, calibration_frac: float = 0.5, seed: int = 0, k: int = 10,
                   embedder: str = "tfidf", cost_kind: str = "param_tokens", max_new_tokens: int = 64,
                   system_prompt: str | None = None, batch_size: int = 8, device: str = "cpu",
                   engine: str = "hf", timeout_s: float = 120.0, api_keys: dict[str, str] | None = None,
                   capability: dict[str, dict[str, float]] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Compare routing policies (module docstring). Returns the result of
    :func:`~hacrl_fed.route.evaluate.compare` plus ``files``. Raises :class:`DataError` for too few queries,
    ``ValueError`` for bad options, the model loaders' errors for a model that does not load."""
    from hacrl_fed.config import VerifierConfig
    from hacrl_fed.reward import Verifier
    from hacrl_fed.route.embed import cosine, load_embedder
    from hacrl_fed.route.evaluate import RouteData, compare
    from hacrl_fed.route.report import write_report
    from hacrl_fed.route.router import Router, check_calibration_size

    if calibration is None:
        cal, routed = split_calibration(problems, calibration_frac, seed)
    else:
        cal = list(calibration)
        seen = {p.id for p in cal} | {p.problem for p in cal}
        routed = [p for p in problems if p.id not in seen and p.problem not in seen]
    if len(cal) < 2 or len(routed) < 2:
        raise DataError(f"routing needs at least 2 calibration and 2 routed queries, got {len(cal)} and {len(routed)}")
    try:
        check_calibration_size([p.problem for p in cal])      # before measuring: router.json must hold them
    except ValueError as err:
        raise DataError(f"{err}: lower --calibration-frac or give a smaller --calibration") from None
    emb = load_embedder(embedder)
    out = Path(out)
    from hacrl_fed.worker.engines import resolve_engine

    requested, engine = engine, resolve_engine(engine, device)   # the cache key names the engine auto picks
    settings = {"max_new_tokens": max_new_tokens, "system_prompt": system_prompt, "batch_size": batch_size,
                "device": device, "timeout_s": timeout_s}
    if engine != "hf":       # part of the outcomes' cache key (seconds differ by engine); hf-era caches stay valid
        settings["engine"] = engine
    if engine == "ct2":      # its compute type too: ct2 outcomes cached while int8 was its default are not reused
        from hacrl_fed.rollout.ct2_engine import CT2Settings

        settings["compute_type"] = CT2Settings.compute_type
    everything = [*cal, *routed]
    with Verifier.from_config(VerifierConfig()) as verifier:
        outs = _measure_all(specs, everything, out, verifier=verifier, settings=settings, api_keys=api_keys or {},
                            progress=progress, engine=requested)
    c_rows, r_rows = np.arange(len(cal)), np.arange(len(cal), len(everything))
    emb.fit([p.problem for p in cal])
    e_cal, e_routed = emb.embed([p.problem for p in cal]), emb.embed([p.problem for p in routed])
    params = [o.params for o in outs]
    data = RouteData(
        models=[s.name for s in specs],
        correct_cal=_matrix(outs, "correct", c_rows), correct=_matrix(outs, "correct", r_rows),
        tokens_cal=_matrix(outs, "tokens", c_rows), tokens=_matrix(outs, "tokens", r_rows),
        seconds_cal=_matrix(outs, "seconds", c_rows), seconds=_matrix(outs, "seconds", r_rows),
        params=None if any(p is None for p in params) else np.array(params, dtype=float),
        tasks_cal=[p.source for p in cal], tasks=[p.source for p in routed],
        sim=cosine(e_routed, e_cal), sim_cal=cosine(e_cal, e_cal))
    result = compare(data, k=k, cost_kind=cost_kind, seed=seed, capability=capability)
    result["embedder"] = embedder
    result["engine"] = engine             # what generated the local models' responses (auto already resolved)
    files = write_report(result, out)
    router = Router(models=data.models, texts=[p.problem for p in cal], tasks=data.tasks_cal,
                    correct=data.correct_cal.tolist(),
                    cost=[result["predicted_cost"][m] for m in data.models], k=k, embedder=embedder)
    files["router"] = router.save(out / "router.json")
    result["files"] = {k_: str(v) for k_, v in files.items()}
    return result
