"""One line for the operator when a Flower run ends without completing: its status, the cause, how to go on.

Flower ends a run on its own when the run's ServerApp task stops sending heartbeats for
``HEARTBEAT_PATIENCE`` × ``HEARTBEAT_DEFAULT_INTERVAL`` = 60 s (``flwr/supercore/corestate/*_corestate.py``:
the task becomes ``finished:failed`` "No heartbeat received from the task", and the run with it, "Task
failed because the run expired"). ``flwr run`` then only says ``finished:failed``; the cause is in the
run's status details (``flwr list --format json``: ``status-details``) and in the ServerApp's log. The
coordinator's state survives (it is written after every step), so the same command resumes the run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["RESUME", "flower_cause", "run_end_line"]

RESUME = "run the same command to resume"

_FLOWER_DETAILS = {
    "No heartbeat received from the task": "Flower ended it: the ServerApp sent no heartbeat for 60 s (Flower's "
                                           "fixed limit) — this machine is too busy",
    "Task failed because the run expired": "Flower ended it: the ServerApp sent no heartbeat for 60 s (Flower's "
                                           "fixed limit) — this machine is too busy",
    "Task stopped because the run was stopped": "it was stopped (flwr stop)",
}
_ERROR_LINE = re.compile(r"^(?:\S+ \S+ ERROR hacrl_fed[\w.]*: |ERROR\s*:\s*)(.+)")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(?:Error|Exception)\b[^:]*: .+")


def flower_cause(details: str) -> str:
    """Plain words for Flower's status details of a run (``status-details``); '' for none, the details themselves
    when they are not known here."""
    details = details.strip()
    return _FLOWER_DETAILS.get(details, details)


def _log_cause(lines: Iterable[str]) -> str:
    """The last error the ServerApp logged: a ``hacrl_fed`` ERROR line, or an exception line after Flower's
    "ServerApp raised an exception"; '' if none."""
    cause = ""
    for raw in lines:
        line = raw.strip()
        if (m := _ERROR_LINE.match(line)) is not None and "raised an exception" not in m.group(1):
            cause = m.group(1)
        elif _EXCEPTION_LINE.match(line):
            cause = line
    return cause[:300]


def run_end_line(run_id: int | None, status: str, details: str = "", log_lines: Iterable[str] = (), *,
                 resume: str = RESUME) -> str | None:
    """The operator's line for a run that ended with Flower status ``status`` (e.g. ``finished:failed``), or None
    when it completed. The cause comes from ``details`` (Flower's status details) or else from the ServerApp's
    ``log_lines``; the line ends with ``resume`` (default :data:`RESUME`)."""
    if status.endswith(":completed"):
        return None
    cause = flower_cause(details) or _log_cause(log_lines) or "no cause was recorded (see logs/superlink.log)"
    run = run_id if run_id is not None else "?"
    return f"the Flower run {run} ended ({status or 'status unknown'}): {cause}; {resume}"
