"""Console view of ``hacrl-fed simulate``: a rich progress display fed by the coordinator's metrics lines
and the workers' status files.

:class:`SimulationView` shows one live line per agent with what its worker is doing (loading, generating
with tokens/s, verifying, training with mini-batch k/M, evaluating, exporting — :func:`agent_line`), the
held-out evaluations, and one bar over the run's steps; once the models are loaded it prints the disk the
run will write (:func:`disk_line`); every finished step prints one line (per agent: rollout accuracy,
capability P̂, capability ratios r_{j→k} it trained with, wire bytes), so the scroll-back is the run's
log. It reads nothing itself: :mod:`hacrl_fed.launch.simulate` calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
import math
import time

from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from hacrl_fed.config import SimulateConfig
from hacrl_fed.report.formats import format_bytes

__all__ = ["SimulationView", "agent_line", "disk_line", "step_line"]


def _num(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _held_out(data) -> str:
    """``16 held out``; for a task suite ``24 held out per task, 4 tasks + 2 held-out families``."""
    if data.source != "reasoning_gym":
        return f"{data.eval_size} held out"
    return (f"{data.eval_size} held out per task, {len(data.tasks)} task{'s' * (len(data.tasks) != 1)}"
            + (f" + {len(data.eval_tasks)} held-out famil{'ies' if len(data.eval_tasks) != 1 else 'y'}"
               if data.eval_tasks else ""))


class _Count(ProgressColumn):
    """``completed/total`` for tasks with a total; nothing for the open-ended ones (an agent's phase line)."""

    def render(self, task) -> Text:
        return Text("" if task.total is None else f"{task.completed:.0f}/{task.total:.0f}")


def agent_line(name: str, status: dict[str, Any], now: float | None = None, *, unit: str = "problems") -> str:
    """What agent ``name``'s worker is doing, from its status file (:mod:`hacrl_fed.status`). ``unit`` names
    what the held-out evaluation counts ("episodes" on a multi-turn run)."""
    phase = status.get("phase", "?")
    step = status.get("step")
    seconds = max(0.0, (now if now is not None else time.time()) - float(status.get("since", 0) or 0))
    rate = (f" — {status['tokens']} tokens, {status.get('tokens_per_s', 0):.1f} tokens/s"
            if status.get("tokens") else "")
    if phase == "loading":
        text = f"loading {status.get('model', 'the model')} on {status.get('device', '?')}"
    elif phase == "generating":
        text = f"generating step {step} ({status.get('rollouts', '?')} rollouts){rate}"
    elif phase == "verifying":
        text = f"verifying step {step} ({status.get('rollouts', '?')} answers)"
    elif phase == "training":
        mb = f" — mini-batch {status['update']}/{status['updates']}" if status.get("updates") else ""
        text = f"training step {step}{mb}"
    elif phase == "evaluating":
        text = f"evaluating the model of step {step} ({status.get('problems', '?')} {unit}){rate}"
    elif phase == "idle":
        text = f"waiting for the coordinator (last step trained: {step or 0})"
    else:
        text = f"{phase} (step {step})"
    return f"{name}: {text} · {seconds:.0f} s"


def disk_line(cfg: SimulateConfig, disk: dict[str, dict[str, int]], *, keep_checkpoints: int = 3) -> str:
    """The disk the run will write: every agent's exported model, plus its checkpoints (at most
    ``keep_checkpoints`` kept, one per ``run.checkpoint_every`` steps). ``disk[agent]`` = the worker's
    ``{"export": bytes, "checkpoint": bytes}``."""
    run = cfg.run
    kept = 0 if run.checkpoint_every == 0 else min(keep_checkpoints, math.ceil(run.steps / run.checkpoint_every))
    exports = sum(d.get("export", 0) for d in disk.values())
    checkpoints = kept * sum(d.get("checkpoint", 0) for d in disk.values())
    per_agent = ", ".join(f"{n} {format_bytes(d.get('export', 0))}" for n, d in sorted(disk.items()))
    ckpt = ("no checkpoints (run.checkpoint_every = 0)" if not kept else
            f"checkpoints {format_bytes(checkpoints)} ({kept} kept per agent, every {run.checkpoint_every} step(s))")
    return (f"disk: this run will write ≈ {format_bytes(exports + checkpoints)}: exported models "
            f"{format_bytes(exports)} ({per_agent}), {ckpt}")


def step_line(rec: dict[str, Any], steps: int) -> str:
    """One line for a finished step record (``event = "step"`` of ``metrics.jsonl``)."""
    parts = [f"step {rec['step']}/{steps}", f"{rec['timing'].get('step_s', 0.0):.0f} s"]
    if not rec.get("trained"):
        parts.append("SKIPPED")
    if rec.get("interrupted"):
        parts.append("INTERRUPTED (the coordinator restarted during its train phase; counted as done)")
    for name, a in rec["agents"].items():
        ratios = " ".join(f"r({src}→{name}) {_num(m.get('capability_ratio'))}"
                          for src, m in sorted(a.get("per_source", {}).items()) if src != name)
        wire = format_bytes((a.get("bytes_in") or 0) + (a.get("bytes_out") or 0))
        status = "" if a.get("status") == "trained" else f" [{a.get('status')}: {a.get('reason')}]"
        parts.append(f"{name} acc {_num(a.get('accuracy'))} P̂ {_num(a.get('capability'))} {ratios} "
                     f"wire {wire}{status}".replace("  ", " "))
    return " | ".join(parts)


def update_line(rec: dict[str, Any], steps: int) -> str:
    """One line for one site's update of an asynchronous run (``event = "update"`` of ``metrics.jsonl``)."""
    peers = ", ".join(f"{src} {n}" for src, n in sorted(rec.get("peer_rows", {}).items())) or "none"
    dropped = sum(n for per in rec.get("dropped_rows", {}).values() for n in per.values())
    lags = " ".join(f"{lag}:{n}" for lag, n in rec.get("staleness_rows", {}).items()) or "-"
    status = "" if rec.get("status") == "trained" else f" [{rec.get('status')}: {rec.get('reason')}]"
    return (f"{rec.get('agent')} update {rec.get('own_step')}/{steps} (plan {rec.get('plan')}, "
            f"{rec.get('order_s', 0.0):.0f} s): peer rows {peers}; staleness {lags}; dropped as stale {dropped}{status}")


@dataclass(frozen=True)
class RowLabels:
    """How the progress view speaks of a run's rows: one-shot problems, or multi-turn episodes (docs/multi-turn.md).
    One of :data:`ONE_SHOT_LABELS` and :data:`EPISODE_LABELS`, picked once per run by :func:`row_labels`."""

    unit: str
    """What the held-out evaluation counts (``problems``, ``episodes``)."""
    score: str
    """What avg@1 measures (``accuracy``; ``success``: the share of episodes solved)."""
    budget_column: str
    """The header of the per-agent token budget column."""
    budget: Callable[[Any], int]
    """A ``ModelConfig`` → the token budget of one row (an episode row is a whole episode: ``max_episode_tokens``)."""
    per_turn: Callable[[Any], str]
    """A ``DataConfig`` → what the caption adds after ``max_new_tokens`` (the turn limit of an episode)."""
    eval_detail: Callable[[dict], str]
    """An agent's evaluation metrics → what follows its avg@1 (an episode's mean reward)."""


ONE_SHOT_LABELS = RowLabels(unit="problems", score="accuracy", budget_column="max resp tokens",
                            budget=lambda model: model.max_response_tokens, per_turn=lambda data: "",
                            eval_detail=lambda m: "")
EPISODE_LABELS = RowLabels(unit="episodes", score="success", budget_column="max episode tokens",
                           budget=lambda model: model.max_episode_tokens,
                           per_turn=lambda data: f" per turn, at most {data.max_turns} turns",
                           eval_detail=lambda m: f" (mean reward {_num(m.get('reward_mean'), '.3f')})")
_LABELS_OF_SOURCE = {"episodes": EPISODE_LABELS}


def row_labels(source: str) -> RowLabels:
    """The labels of a run whose ``data.source`` is ``source``: :data:`EPISODE_LABELS` for ``episodes``, else
    :data:`ONE_SHOT_LABELS`."""
    return _LABELS_OF_SOURCE.get(source, ONE_SHOT_LABELS)


class SimulationView:
    """Progress display of one simulated run (a context manager; ``enabled=False`` prints lines only)."""

    def __init__(self, cfg: SimulateConfig, run_dir: Path, *, console: Console | None = None,
                 enabled: bool = True) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.console = console or Console()
        self.steps = cfg.run.steps
        self.rows = row_labels(cfg.run.data.source)
        self.unit = self.rows.unit
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
                                 TimeElapsedColumn(), console=self.console, disable=not enabled)
        self.tasks: dict[str, TaskID] = {}
        self.disks: dict[str, dict[str, int]] = {}

    def __enter__(self) -> SimulationView:
        self.console.print(self._header())
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _header(self) -> Table:
        run = self.cfg.run
        table = Table(title=f"hacrl-fed simulate → {self.run_dir}", title_justify="left")
        for col in ("agent", "model", "device", "algo", "lr", self.rows.budget_column):
            table.add_column(col)
        for a in self.cfg.agents:
            table.add_row(a.name, a.model.name_or_path, a.model.device, a.algo.name, f"{a.optim.lr:g}",
                          str(self.rows.budget(a.model)))
        per_turn = self.rows.per_turn(run.data)
        table.caption = (f"{run.steps} steps · B={run.prompts_per_step} prompts × G={run.samples_per_prompt} samples · "
                         f"max_new_tokens {run.sampling.max_new_tokens}{per_turn} · T={run.sampling.temperature:g} · data "
                         f"{run.data.source} ({_held_out(run.data)}) · {'TLS' if self.cfg.tls else 'insecure'} loopback")
        return table

    def _task(self, key: str, description: str, total: float | None = None, completed: float = 0) -> None:
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(description, total=total, completed=completed)

    def _done(self, key: str, description: str | None = None) -> None:
        if key in self.tasks:
            kw = {"description": description} if description else {}
            self.progress.update(self.tasks[key], total=1, completed=1, **kw)

    def message(self, text: str) -> None:
        self.progress.console.print(text)

    def loading(self, name: str, device: str, model: str) -> None:
        self._task(f"agent/{name}", f"{name}: loading {model} on {device}")

    def loaded(self, name: str, seconds: float) -> None:
        self.message(f"{name} ready after {seconds:.0f} s")

    def status(self, name: str, status: dict[str, Any]) -> None:
        """The worker of ``name`` reported ``status`` (its status file): its line shows the phase."""
        self._task(f"agent/{name}", name)
        self.progress.update(self.tasks[f"agent/{name}"], description=agent_line(name, status, unit=self.unit))
        if isinstance(status.get("disk"), dict):
            self.disks[name] = status["disk"]

    def disk(self, *, keep_checkpoints: int = 3) -> None:
        """Print the disk the run will write (once every worker reported its model's size)."""
        if self.disks:
            self.message(disk_line(self.cfg, self.disks, keep_checkpoints=keep_checkpoints))

    def exporting(self, name: str) -> None:
        self._task(f"export/{name}", f"exporting {name} (Hugging Face directory)")

    def exported(self, name: str, path: str) -> None:
        self._done(f"export/{name}")
        self._done(f"agent/{name}", f"{name}: done, model exported")
        self.message(f"{name} exported to {path}")

    def record(self, rec: dict[str, Any]) -> None:
        """One metrics line of the coordinator."""
        event = rec.get("event")
        if event in ("run_start", "resume") and rec.get("step", 0) == 0:
            self._task("eval/0", "held-out evaluation before training")
        elif event == "resume":
            self._task("steps", "steps", total=self.steps, completed=rec.get("step", 0))
        elif event == "eval":
            self._eval(rec)
        elif event == "update":
            self.message(update_line(rec, self.steps))
        elif event == "step":
            self._task("steps", "steps", total=self.steps)
            self.progress.update(self.tasks["steps"], completed=rec["step"])
            self.message(step_line(rec, self.steps))
            if rec["step"] >= self.steps:
                self._task("eval/end", "held-out evaluation after training")

    def _eval(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        key = "eval/0" if step == 0 else "eval/end" if step >= self.steps else f"eval/{step}"
        self._done(key)
        accs = " | ".join(f"{n} {m['error']}" if "error" in m else f"{n} {_num(m.get('avg@1'), '.3f')}"
                          + self.rows.eval_detail(m)
                          for n, m in sorted(rec.get("agents", {}).items()))
        when = "before training" if step == 0 else f"after step {step}"
        self.message(f"held-out {self.rows.score} {when} ({rec.get('prompts', 0)} {self.unit}, greedy, "
                     f"{rec.get('eval_s', 0):.0f} s): {accs}")
        if step < self.steps:
            self._task("steps", "steps", total=self.steps, completed=step)

    def summary(self, report: dict[str, Any]) -> None:
        """Print the report's summary table and where the files are."""
        from hacrl_fed.report.run_report import summary_table

        self.console.print(summary_table(report))
        self.console.print(f"report: {self.run_dir / 'report.md'} (+ report.json, plot.png)")
