"""Coordinator state that survives a restart, and the per-step metrics log (ARCHITECTURE.md §8 "Resume").

After every step the coordinator writes ``state.json`` atomically (temporary file in the same
folder, fsync, ``os.replace``): the number of steps done, the capability windows, the prompt
sampler's position and RNG state, the byte length of ``metrics.jsonl`` at that moment and
cumulative per-agent counters. A restarted coordinator loads it, truncates ``metrics.jsonl`` back
to that length (dropping the lines of a step that did not finish) and continues at ``step + 1``.
The state is saved twice per step: once before the train phase (the step counts as done from
then on, so no site is asked to train a step twice) and once after its metrics line is written.

``config_digest`` fingerprints the settings a resumed run must share with the original
(:func:`run_digest`); a mismatch is refused with a message saying what to do.

Nothing read back is trusted: every field of ``state.json`` is checked (type, range, size) and a bad one is
refused in one line naming the file and the field; a ``next_plan`` that is not this run's plan of the next step is
dropped. ``metrics.jsonl`` lines that are not records are skipped with a warning, an offset inside a line moves back
to the last whole line, history that a state does not record is never truncated, and neither file may lead out of
the run directory through a link.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hacrl_fed.atomic import atomic_write_text, outside, read_bounded

__all__ = ["MAX_TRAINED_STEPS", "STATE_VERSION", "CoordinatorState", "MetricsLog", "StateError", "load_state",
           "restore_error", "run_digest", "save_state"]

log = logging.getLogger("hacrl_fed.coordinator")

STATE_VERSION = 1

MAX_STATE_BYTES = 64 << 20
"""Largest ``state.json`` read back."""
MAX_LINE_BYTES = 16 << 20
"""Longest ``metrics.jsonl`` line read back (a longer one is skipped)."""
MAX_STEP = 2**40
MAX_METRICS_OFFSET = 2**50
MAX_AGENTS = 10_000
"""Agents in ``totals`` and ``trained_steps``."""
MAX_COUNTERS = 1_000
"""Counters per agent in ``totals``."""
MAX_COUNT = 1e18
"""Largest magnitude of a counter in ``totals``."""
MAX_NAME_CHARS = 256
MAX_NEXT_PLAN_CHARS = 16 << 20
MAX_TRAINED_STEPS = 1000
"""Steps kept per agent in :attr:`CoordinatorState.trained_steps` (a roll-back deeper than that is not counted)."""


class StateError(ValueError):
    """``state.json`` is unreadable, malformed, or belongs to a different run configuration."""


@dataclass
class CoordinatorState:
    """Everything the coordinator needs to continue a run. Plain JSON types only."""

    run_id: str
    config_digest: str
    step: int = 0
    """Steps finished or skipped so far; the next plan is for step ``step + 1`` (steps count from 1)."""
    sampler: dict[str, Any] = field(default_factory=dict)
    """Prompt sampler state (position and RNG), as the sampler's ``state_dict()`` returns it."""
    capability: dict[str, Any] = field(default_factory=dict)
    """``CapabilityTracker.state_dict()``; empty before the first step."""
    metrics_offset: int = 0
    """Byte length of ``metrics.jsonl`` after the last finished step."""
    totals: dict[str, dict[str, float]] = field(default_factory=dict)
    """Cumulative per-agent counters: steps, rows, rejections, reward disagreements."""
    elapsed_s: float = 0.0
    """Wall-clock seconds spent in finished steps, across restarts."""
    restarts: int = 0
    """How many times the coordinator resumed this run."""
    last_eval_step: int = -1
    """Step count at the last held-out evaluation (-1: none yet)."""
    next_plan: str = ""
    """Base64 of the serialized RoundPlan of step ``step + 1`` when it was already sent out (pipelined
    with the train phase); a resumed coordinator reuses it instead of sampling again."""
    trained_steps: dict[str, list[int]] = field(default_factory=dict)
    """Per agent, the latest steps the coordinator recorded as trained there (ascending), compared with the
    step each site reports its weights hold, so roll-backs and late trainings are found and counted."""
    pending: dict[str, Any] | None = None
    """Metrics line of a step whose train phase was in flight (the step already counts as done:
    a site that trained must not be asked to train it again). Written out, marked
    ``interrupted``, when a restarted coordinator finds it."""
    version: int = STATE_VERSION

    def add_totals(self, agent: str, **counts: float) -> None:
        """Add ``counts`` to the agent's cumulative counters."""
        mine = self.totals.setdefault(agent, {})
        for key, value in counts.items():
            mine[key] = mine.get(key, 0) + value


def run_digest(settings: dict[str, Any]) -> str:
    """SHA-256 (hex, 16 chars) of the JSON of the settings a resumed run must not change."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def save_state(path: str | Path, state: CoordinatorState) -> None:
    """Write ``state`` atomically as strict JSON. A NaN or infinity in the parts that hold what sites reported
    (``pending``, ``totals``) is written as null; in the coordinator's own fields it raises ValueError.
    Raises OSError when writing fails."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = asdict(state)
    data["pending"], data["totals"] = _finite(data["pending"]), _finite(data["totals"])
    data["trained_steps"] = {k: [int(x) for x in v] for k, v in data["trained_steps"].items()}
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False)
    atomic_write_text(Path(path), text + "\n")


def load_state(path: str | Path, *, run_id: str, config_digest: str, steps: int | None = None,
               root: str | Path | None = None) -> CoordinatorState | None:
    """Load the state of run ``run_id``; None if there is no state file yet.

    Every field is validated (types, ranges, sizes; ``step`` at most ``steps`` when given; ``trained_steps``
    ascending within ``1..step``; ``pending`` the record of step ``step``); a ``next_plan`` that is not a
    RoundPlan of ``run_id`` for step ``step + 1`` is dropped with a warning (the next plan is sampled again).
    The content of ``sampler`` and ``capability`` is left to their owners (:func:`restore_error` words
    their errors). Raises :class:`StateError`, one line naming the file and the field, if the file is
    unreadable, not a regular file, larger than :data:`MAX_STATE_BYTES`, leads out of ``root`` (a link),
    is malformed, belongs to another run id, or was written with different run settings (``config_digest``).
    """
    p = Path(path)
    if root is not None:
        _inside(p, root)
    try:
        data = json.loads(read_bounded(p, MAX_STATE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StateError(f"{p}: unreadable coordinator state ({err.strerror})") from None
    except (ValueError, RecursionError) as err:  # bad UTF-8, bad JSON, a number of over 4300 digits
        raise StateError(f"{p}: unreadable coordinator state ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(data, dict):
        raise StateError(f"{p}: malformed coordinator state: a JSON object expected, not {type(data).__name__}")
    known = {f.name for f in fields(CoordinatorState)}
    unknown = sorted(str(k)[:40] for k in data if k not in known)
    missing = sorted(k for k in ("run_id", "config_digest") if k not in data)
    if unknown or missing:
        raise StateError(f"{p}: malformed coordinator state: " + (f"unknown field(s) {', '.join(map(repr, unknown))}"
                                                                   if unknown else f"missing field {missing[0]!r}"))
    state = CoordinatorState(**data)
    _validate(state, p, steps)
    if state.run_id != run_id:
        raise StateError(f"{p}: state of run {state.run_id!r}, not {run_id!r}; use another output_dir or run_id")
    if state.config_digest != config_digest:
        raise StateError(
            f"{p}: run {run_id!r} was started with different settings (prompts, samples, data, seed, window or "
            f"sampling changed); restore them, or start a new run with another run_id"
        )
    problem = _next_plan_problem(state.next_plan, run_id, state.step + 1)
    if problem:
        log.warning("%s: next_plan dropped (%s); the plan of step %d is sampled again", p, problem, state.step + 1)
        state.next_plan = ""
    return state


def restore_error(path: str | Path, part: str, err: Exception) -> StateError:
    """The one-line StateError for a ``sampler`` or ``capability`` state (``part``) its owner refused."""
    return StateError(f"{path}: malformed coordinator state: field {part!r}: {' '.join(str(err).split())[:300]}")


def _inside(path: Path, root: str | Path) -> None:
    real = outside(path, root)
    if real is not None:
        raise StateError(f"{path}: leads to {real}, outside the run directory {root}; remove the link (the "
                         f"coordinator reads and writes only inside its run directory)")


def _is_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _is_number(value: Any, lo: float, hi: float) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and lo <= value <= hi


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS


def _validate(state: CoordinatorState, p: Path, steps: int | None) -> None:
    """Raise StateError naming the first field of ``state`` (as read from ``p``) that is out of its type or range."""

    def bad(name: str, why: str) -> StateError:
        return StateError(f"{p}: malformed coordinator state: field {name!r}: {why}")

    if not _is_int(state.version, STATE_VERSION, STATE_VERSION):
        raise bad("version", f"{str(state.version)[:40]!r}, expected {STATE_VERSION}")
    for name in ("run_id", "config_digest"):
        if not _is_name(getattr(state, name)):
            raise bad(name, f"a string of 1..{MAX_NAME_CHARS} characters expected")
    if not _is_int(state.step, 0, MAX_STEP):
        raise bad("step", f"{str(state.step)[:40]!r} is not a step count (0..{MAX_STEP})")
    if steps is not None and state.step > steps:
        raise bad("step", f"{state.step} steps done, but run.steps is {steps}; raise run.steps to continue this "
                          f"run, or start a new run with another run_id")
    if not _is_int(state.metrics_offset, 0, MAX_METRICS_OFFSET):
        raise bad("metrics_offset", f"{str(state.metrics_offset)[:40]!r} is not a byte offset "
                                    f"(0..{MAX_METRICS_OFFSET})")
    if not _is_number(state.elapsed_s, 0.0, 1e12):
        raise bad("elapsed_s", f"{str(state.elapsed_s)[:40]!r} is not a number of seconds")
    if not _is_int(state.restarts, 0, MAX_STEP):
        raise bad("restarts", f"{str(state.restarts)[:40]!r} is not a count")
    if not _is_int(state.last_eval_step, -1, state.step):
        raise bad("last_eval_step", f"{str(state.last_eval_step)[:40]!r} is not a step in -1..{state.step}")
    for name in ("sampler", "capability"):
        if not isinstance(getattr(state, name), dict):
            raise bad(name, "a JSON object expected")
    if not isinstance(state.next_plan, str) or len(state.next_plan) > MAX_NEXT_PLAN_CHARS:
        raise bad("next_plan", f"a base64 string of at most {MAX_NEXT_PLAN_CHARS} characters expected")
    _validate_totals(state.totals, bad)
    if not isinstance(state.trained_steps, dict) or len(state.trained_steps) > MAX_AGENTS:
        raise bad("trained_steps", f"a JSON object of at most {MAX_AGENTS} agents expected")
    for agent, done in state.trained_steps.items():
        if not _is_name(agent) or not isinstance(done, list) or len(done) > MAX_TRAINED_STEPS:
            raise bad("trained_steps", f"agent {str(agent)[:40]!r}: a list of at most {MAX_TRAINED_STEPS} steps "
                                       f"expected")
        if not all(_is_int(s, 1, state.step) for s in done) or any(a >= b for a, b in zip(done, done[1:])):
            raise bad("trained_steps", f"agent {agent!r}: steps must be ascending integers in 1..{state.step}")
    pending = state.pending
    if pending is not None:
        if not isinstance(pending, dict):
            raise bad("pending", "null or a metrics record expected")
        if pending.get("step") != state.step or isinstance(pending.get("step"), bool):
            raise bad("pending", f"the record of step {str(pending.get('step'))[:40]!r}, expected step {state.step}")
        agents = pending.get("agents", {})
        if not isinstance(agents, dict) or not all(isinstance(a, dict) for a in agents.values()):
            raise bad("pending", "'agents' must map agent names to records")


def _validate_totals(totals: Any, bad: Callable[[str, str], StateError]) -> None:
    """Turn the nulls :func:`save_state` writes for NaN back into NaN; raise for anything but bounded numbers."""
    if not isinstance(totals, dict) or len(totals) > MAX_AGENTS:
        raise bad("totals", f"a JSON object of at most {MAX_AGENTS} agents expected")
    for agent, counts in totals.items():
        if not _is_name(agent) or not isinstance(counts, dict) or len(counts) > MAX_COUNTERS:
            raise bad("totals", f"agent {str(agent)[:40]!r}: an object of at most {MAX_COUNTERS} counters expected")
        for key, value in counts.items():
            if value is None:
                counts[key] = math.nan
            elif not _is_name(key) or not _is_number(value, -MAX_COUNT, MAX_COUNT):
                raise bad("totals", f"agent {agent!r}: counter {str(key)[:40]!r} = {str(value)[:40]!r} is not a "
                                    f"number within ±{MAX_COUNT:g}")


def _next_plan_problem(text: str, run_id: str, step: int) -> str:
    """Why ``text`` (base64 of a serialized RoundPlan) is not the plan of ``run_id`` for ``step`` ('' if it is, or
    if there is none)."""
    if not text:
        return ""
    from google.protobuf.message import DecodeError

    from hacrl_fed.v1 import rollout_pb2 as pb

    try:
        plan = pb.RoundPlan.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError) as err:
        return f"not a serialized RoundPlan: {' '.join(str(err).split())[:120]}"
    if plan.run_id != run_id or plan.step != step:
        return f"a plan of run {plan.run_id[:80]!r} step {plan.step}, expected run {run_id!r} step {step}"
    if not plan.prompts:
        return "a plan without prompts"
    return ""


class MetricsLog:
    """Append-only JSON-lines metrics file that can be rolled back to a recorded byte offset.

    Each :meth:`append` writes one line, flushes and fsyncs, and returns the new file length,
    which the caller stores in :attr:`CoordinatorState.metrics_offset`.
    """

    def __init__(self, path: str | Path, *, offset: int = 0, root: str | Path | None = None,
                 mirror: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Open ``path`` and truncate it to ``offset`` bytes (lines of an unfinished step go). ``mirror(record)``
        receives every record after it is on disk (e.g. :class:`~hacrl_fed.coordinator.scalars.TensorBoardLog`).

        An ``offset`` inside a line is moved back to the end of the last whole line (a warning says so). With
        ``offset`` 0 (no state, or a state that records no metrics) the file may hold at most ``run_start``
        lines (a crash before the first state was saved); more history is refused rather than truncated.

        Raises StateError if the file leads out of ``root`` (default: its folder) through a link, is not a
        regular file, is shorter than ``offset`` (it was edited or replaced), or holds history ``offset`` 0
        would drop.
        """
        self.mirror = mirror
        self.path = Path(path)
        _inside(self.path, root if root is not None else self.path.parent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and not self.path.is_file():
            raise StateError(f"{self.path}: not a regular file; move it away (the coordinator writes its metrics "
                             f"there)")
        self.path.touch(exist_ok=True)
        size = self.path.stat().st_size
        if size < offset:
            raise StateError(f"{self.path}: {size} bytes, but the coordinator state expects at least {offset}")
        if offset == 0 and size > 0:
            self._check_nothing_lost()
        offset = self._line_end(offset)
        with open(self.path, "r+b") as f:
            f.truncate(offset)
        self.offset = offset

    def _check_nothing_lost(self) -> None:
        """Raise StateError unless every line of the file is a ``run_start`` record (a partial last line aside)."""
        records, bad = [], 0
        with open(self.path, "rb") as f:
            for _, line in _lines(f):
                record = _record(line)
                if record is None:
                    bad += 1
                else:
                    records.append(record)
        partial = _ends_inside_line(self.path)
        if any(r.get("event") != "run_start" for r in records) or bad > int(partial):
            raise StateError(f"{self.path}: {len(records) + bad} lines of metrics history, but the coordinator state "
                             f"records none (coordinator/state.json missing, or its metrics_offset is 0); move "
                             f"metrics.jsonl away to start this run over, or restore the state")

    def _line_end(self, offset: int) -> int:
        """``offset``, or the end of the last whole line before it when it falls inside a line (logged)."""
        if offset == 0:
            return 0
        with open(self.path, "rb") as f:
            start = max(0, offset - MAX_LINE_BYTES)
            f.seek(start)
            head = f.read(offset - start)
        if head.endswith(b"\n"):
            return offset
        cut = head.rfind(b"\n")
        back = start + cut + 1 if cut >= 0 else 0
        log.warning("%s: the coordinator state's offset %d is inside a line; rolled back to %d, the end of the last "
                    "whole line", self.path, offset, back)
        return back

    def append(self, record: dict[str, Any]) -> int:
        """Write ``record`` as one JSON line (NaN/inf written as null). Returns the new byte length."""
        line = json.dumps(_finite(record), sort_keys=False, separators=(",", ":")) + "\n"
        with open(self.path, "ab") as f:
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
            self.offset = f.tell()
        if self.mirror is not None:
            self.mirror(_finite(record))
        return self.offset

    def read(self) -> list[dict[str, Any]]:
        """Every record (JSON object) in the file. A line that is not one (garbage, longer than
        :data:`MAX_LINE_BYTES`) is skipped with a warning naming the file and line."""
        out = []
        with open(self.path, "rb") as f:
            for number, line in _lines(f):
                record = _record(line)
                if record is None:
                    log.warning("%s:%d: not a metrics record (skipped): %r", self.path, number, line[:80])
                else:
                    out.append(record)
        return out


def _lines(f: Any) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of the non-blank lines of binary file ``f``; a line longer than
    :data:`MAX_LINE_BYTES` is yielded as its first bytes only (never parsed, never held whole)."""
    number = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield number, b"\0" + line[:80]  # marked: never valid JSON
            continue
        if line.strip():
            yield number, line


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _ends_inside_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _finite(value: Any) -> Any:
    """Replace NaN/inf by None recursively (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value

