"""TensorBoard copy of the coordinator's metrics lines (``run.report_to = ["tensorboard"]``; TRL ``report_to``).

Every numeric field of a metrics record becomes one scalar whose tag is the record's key path joined by
``/`` (``agents/smollm2/accuracy``, ``agents/gemma3/per_source/smollm2/capability_ratio``,
``timing/step_s``), at the record's ``step``; records of other events than ``step`` are prefixed with
their event (``eval/agents/smollm2/avg@1``). ``metrics.jsonl`` stays the record of the run: a step repeated
after a coordinator restart appears again in TensorBoard's (append-only) event files.

Writes event files with the ``tensorboard`` package alone (no TensorFlow, no torch), imported when the
log opens; without it :class:`TensorBoardLog` raises ``RuntimeError`` naming the extra to install.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["INSTALL_HINT", "TensorBoardLog", "scalars"]

INSTALL_HINT = 'run.report_to = ["tensorboard"] needs the tensorboard package: pip install "hacrl-fed[tensorboard]"'


def scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) for every int/float/bool leaf of ``record`` (nested dicts joined by ``/``), skipping
    ``step``, ``time`` and None."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, tag + "/")
        elif isinstance(value, (bool, int, float)) and not (prefix == "" and key in ("step", "time")):
            yield tag, float(value)


class TensorBoardLog:
    """Appends metrics records as scalar summaries to an event file under ``logdir``; call it with a record.

    Raises ``RuntimeError`` (:data:`INSTALL_HINT`) when the tensorboard package is missing.
    """

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise RuntimeError(INSTALL_HINT) from None
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(logdir))

    def __call__(self, record: Mapping[str, Any]) -> None:
        event = record.get("event", "step")
        values = [self._summary.Value(tag=tag, simple_value=value)
                  for tag, value in scalars(record, "" if event == "step" else f"{event}/")]
        if values:
            self._writer.add_event(self._event(wall_time=time.time(), step=int(record.get("step", 0)),
                                               summary=self._summary(value=values)))
            self._writer.flush()

    def close(self) -> None:
        self._writer.close()
