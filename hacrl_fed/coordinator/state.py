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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hacrl_fed.atomic import atomic_write_text

__all__ = ["STATE_VERSION", "CoordinatorState", "MetricsLog", "StateError", "load_state", "run_digest", "save_state"]

STATE_VERSION = 1


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


def load_state(path: str | Path, *, run_id: str, config_digest: str) -> CoordinatorState | None:
    """Load the state of run ``run_id``; None if there is no state file yet.

    Raises :class:`StateError` if the file is not valid state JSON, belongs to another run id, or
    was written with different run settings (``config_digest``).
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateError(f"{p}: unreadable coordinator state ({err})") from None
    try:
        state = CoordinatorState(**data)
        ok = (isinstance(state.step, int) and state.step >= 0 and isinstance(state.metrics_offset, int)
              and state.metrics_offset >= 0 and math.isfinite(float(state.elapsed_s)))
    except (TypeError, ValueError) as err:
        raise StateError(f"{p}: malformed coordinator state ({err})") from None
    if not ok or state.version != STATE_VERSION:
        raise StateError(f"{p}: malformed coordinator state (version {data.get('version')!r}, step {data.get('step')!r})")
    if state.run_id != run_id:
        raise StateError(f"{p}: state of run {state.run_id!r}, not {run_id!r}; use another output_dir or run_id")
    if state.config_digest != config_digest:
        raise StateError(
            f"{p}: run {run_id!r} was started with different settings (prompts, samples, data, seed, window or "
            f"sampling changed); restore them, or start a new run with another run_id"
        )
    return state


class MetricsLog:
    """Append-only JSON-lines metrics file that can be rolled back to a recorded byte offset.

    Each :meth:`append` writes one line, flushes and fsyncs, and returns the new file length,
    which the caller stores in :attr:`CoordinatorState.metrics_offset`.
    """

    def __init__(self, path: str | Path, *, offset: int = 0,
                 mirror: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Open ``path`` and truncate it to ``offset`` bytes (lines of an unfinished step go). ``mirror(record)``
        receives every record after it is on disk (e.g. :class:`~hacrl_fed.coordinator.scalars.TensorBoardLog`).

        Raises StateError if the file is shorter than ``offset`` (it was edited or replaced).
        """
        self.mirror = mirror
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        size = self.path.stat().st_size
        if size < offset:
            raise StateError(f"{self.path}: {size} bytes, but the coordinator state expects at least {offset}")
        with open(self.path, "r+b") as f:
            f.truncate(offset)
        self.offset = offset

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
        """All records currently in the file."""
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _finite(value: Any) -> Any:
    """Replace NaN/inf by None recursively (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value

