"""What a site's terminal shows: a few clear status lines distilled from the SuperNode and worker logs.

``hacrl-fed client`` keeps the full logs in ``runs/<agent>/logs/`` and prints only what a site
operator needs (ARCHITECTURE.md §1):

* :class:`SupernodeWatcher` reads ``flower-supernode``'s log lines as they are written and reports
  connection trouble once (then at most every ``repeat_s`` seconds) in plain words: the
  coordinator is unreachable, it refuses to activate this node (the key is not registered there, or
  a node with this key is still connected: what is known is said), the TLS certificate does not
  match, the node's own port is taken; and when the node is connected again;
* :class:`TaskWatcher` reads the output of the executor that runs this site's ClientApp tasks
  (:mod:`hacrl_fed.flower.executor`) and says, in one line, when an order from the coordinator was not
  carried out and why (Flower withdrew the task, the ClientApp failed, the reply could not be sent):
  the coordinator then leaves this site out of that step;
* :func:`worker_line_visible` selects the worker's own log lines (one per generated and trained
  step, evaluations, checkpoints, warnings) for the terminal.

Pure line parsing and a clock; the output goes to a callback.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

__all__ = ["TASK_FAILED", "TASK_STARTED", "SupernodeWatcher", "TaskWatcher", "worker_line_visible"]

_WORKER_LINE = re.compile(r"^\S+ \S+ (INFO|WARNING|ERROR|CRITICAL) hacrl_fed[\w.]*: ")
_FLOWER_EXIT = re.compile(r"Exit Code: (\d+)")
_RECEIVING = re.compile(r"Receiving: (\S+) message")
_ROUND = re.compile(r"\[RUN (\d+), ROUND ([^\]]*)\]")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b[^:]*: .+")

TASK_STARTED = "hacrl-fed executor: task started:"
"""Start of the line the executor prints when it starts a task process (then ``<task type> task <id> of run
<run id>``)."""
TASK_FAILED = "hacrl-fed executor: task failed:"
"""Start of the line the executor prints when a task process ends unsuccessfully (then ``<task type> task <id> of
run <run id> (exit code <n>)``); Flower's lines giving the cause come before it."""
WITHDRAWN = ("Flower withdrew the task before it ran: its process did not report to the SuperNode within Flower's "
             "deadline (first heartbeat 30 s after the task was claimed, then every 60 s) — this machine is too "
             "busy; lighten its load")


def worker_line_visible(line: str) -> bool:
    """True for the worker's ``hacrl_fed.*`` log lines at INFO and above (INFO of ``hacrl_fed.*.detail``
    loggers only at WARNING and above) and its one-line ``error:``."""
    m = _WORKER_LINE.match(line)
    if m is None:
        return line.startswith("error: ")
    return m.group(1) != "INFO" or ".detail:" not in line[: m.end()]


class TaskWatcher:
    """Turns the ClientApp executor's output into one site status line per order that was not carried out.

    Args:
        emit: ``emit(level, message)`` for each status line (``logging`` levels).

    A task whose token Flower refuses (``Runtime task-token authentication failed``, ``401 Unauthorized``:
    Flower withdrew it because the process missed a heartbeat deadline; the process then ends quietly, with
    exit code 0) is reported at once (:data:`WITHDRAWN`). A task process that ends unsuccessfully (the
    executor's :data:`TASK_FAILED` line) is reported with the cause its lines gave before: the last exception
    line of a traceback, else Flower's exit message (``Exit Code: <n>`` and the line after it). At most
    one line per task (a task's lines start after :data:`TASK_STARTED`). Thread-safe.
    """

    def __init__(self, emit: Callable[[int, str], None]) -> None:
        self.emit = emit
        self.missed = 0
        """Orders reported as not carried out so far."""
        self._cause = ""
        self._told = False
        self._after_exit = False
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        """Take one line of the executor's output (ANSI codes already stripped)."""
        with self._lock:
            self._feed(line.strip())

    def _tell(self, cause: str, what: str = "") -> None:
        if not self._told:
            self._told = True
            self.missed += 1
            self.emit(logging.WARNING, f"an order from the coordinator was not carried out: {cause}"
                                       f"{f' [{what}]' if what else ''}; the coordinator leaves this site out of "
                                       f"that step")

    def _feed(self, line: str) -> None:
        if line.startswith(TASK_STARTED):
            self._cause, self._told, self._after_exit = "", False, False
        elif line.startswith(TASK_FAILED):
            self._tell(self._cause or "the ClientApp process failed (see the executor's log)",
                       line.removeprefix(TASK_FAILED).strip())
        elif "task-token authentication failed" in line or "401 Unauthorized" in line:
            self._tell(WITHDRAWN)
        elif _FLOWER_EXIT.search(line):
            self._after_exit = True
        elif self._after_exit:
            text = re.sub(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s*", "", line)
            if text:
                self._after_exit = False
                self._cause = self._cause or f"Flower: {text}"  # an exception line seen before says more
        elif _EXCEPTION_LINE.match(line):
            self._cause = f"the ClientApp failed: {line[:300]}"


class SupernodeWatcher:
    """Turns ``flower-supernode`` log lines into site status lines.

    Args:
        superlink: the coordinator address the node connects to (for the messages).
        node_key: the node's private key file (named when the coordinator refuses the node).
        emit: ``emit(level, message)`` for each status line (``logging`` levels).
        clock: monotonic seconds (tests pass a fake one).
        repeat_s: a persisting problem is reported again after this many seconds.

    Thread-safe: :meth:`feed` runs in the log-copying thread, :meth:`exit_reason` in the supervisor's.
    """

    def __init__(self, superlink: str, node_key: str | None, emit: Callable[[int, str], None], *,
                 clock: Callable[[], float] = time.monotonic, repeat_s: float = 60.0) -> None:
        self.superlink = superlink
        self.node_key = node_key
        self.emit = emit
        self.clock = clock
        self.repeat_s = repeat_s
        self.connected = False
        self.was_connected = False
        self.run_id: str | None = None
        self.flower_exit: int | None = None
        self.reason = ""
        self.fatal = ""
        """Set when a restart cannot help (its ClientApp API port is taken): the site stops."""
        self._exiting = False
        self._reported: dict[str, float] = {}
        self._after_exit = 0
        self._lock = threading.Lock()

    def _report(self, key: str, level: int, message: str) -> None:
        """Emit ``message`` unless the same problem (``key``) was reported less than ``repeat_s`` ago."""
        now = self.clock()
        last = self._reported.get(key)
        if last is not None and now - last < self.repeat_s:
            return
        self._reported = {key: now}  # another problem (or success) resets the others
        self.emit(level, message)

    def feed(self, line: str) -> None:
        """Take one log line (ANSI codes already stripped)."""
        with self._lock:
            self._feed(line.strip())

    def _feed(self, line: str) -> None:
        if (m := _FLOWER_EXIT.search(line)) is not None:
            self.flower_exit, self.reason, self._after_exit, self._exiting = int(m.group(1)), "", 2, True
            return
        if self._after_exit:  # Flower's exit message: a generic line, then the specific reason
            self._after_exit -= 1
            if line and not line.startswith("Failed to initialize"):
                self.reason, self._after_exit = line, 0
                self._explain(line)
            return
        if "Connection attempt failed" in line:
            if not self._exiting:  # after Flower's exit message: its helper process losing the dying node
                self._lost()
            return
        if "SSL/TLS handshake error" in line or "CERTIFICATE_VERIFY_FAILED" in line or (
                "already in use" in line and "ort" in line):
            self._explain(line)
            return
        if (m := _ROUND.search(line)) is not None:
            self.run_id = m.group(1)
            return
        if (m := _RECEIVING.search(line)) is not None and not self.connected:
            self.connected = self.was_connected = True
            self._report("connected", logging.INFO, f"connected to the coordinator at {self.superlink} "
                         f"(Flower run {self.run_id or '?'}, first order: {m.group(1)})")

    def _lost(self) -> None:
        if self.connected:
            self.connected = False
            self._report("unreachable", logging.WARNING,
                         f"lost the connection to the coordinator at {self.superlink} (stopped or restarting, or the "
                         f"run has ended); retrying. This site keeps running after a run ends: stop it with Ctrl-C")
        else:
            again = " again" if self.was_connected else " yet"
            self._report("unreachable", logging.WARNING,
                         f"cannot reach the coordinator at {self.superlink}{again} (not started, restarting, or the "
                         f"address is wrong); retrying")

    def _explain(self, line: str) -> None:
        self.connected = False
        if "Failed to activate SuperNode" in line or "[code: 2004]" in line:
            key = self.node_key and self.node_key.removesuffix(".key") + ".pub"  # `hacrl-fed keys gen` naming
            if self.was_connected:  # the key was accepted before: it is registered
                why = ("this site was connected before with this key, so the key is registered: the coordinator "
                       "still holds this node's previous connection (released about a minute after its last "
                       "heartbeat), or another process or site now uses the same key")
            else:
                why = (f"either its key ({key or 'node key'}) is not registered there (the coordinator registers "
                       f"the roster's node keys when `hacrl-fed server` starts; check that your roster entry reached "
                       f"it), or a node with this key is still connected there (a SuperNode or client restarted "
                       f"less than about a minute ago, or another site uses the same key)")
            self._report("not_activated", logging.WARNING,
                         f"the coordinator at {self.superlink} refuses to activate this node (Flower code 2004): "
                         f"{why}; retrying")
        elif "already in use" in line and "ort" in line:
            self.fatal = f"flower-supernode cannot listen: {line}"
            self._report("port", logging.ERROR, self.fatal)
        elif any(k in line.lower() for k in ("connection refused", "connection attempts failed", "name or service",
                                              "timed out", "unreachable")):
            self._lost()
        elif "SSL" in line or "CERTIFICATE" in line or "certificate" in line:
            self._report("tls", logging.ERROR,
                         f"TLS handshake with {self.superlink} failed: root_certificates is not the coordinator's "
                         f"ca.crt, or its certificate does not name this address ({line}); retrying")
        else:
            self._report(f"other:{line}", logging.WARNING, f"flower-supernode: {line}")

    def exit_reason(self, returncode: int | None) -> str:
        """One-line reason for a SuperNode that exited with ``returncode`` (Flower's own exit code if logged)."""
        with self._lock:
            code = f"Flower exit code {self.flower_exit}" if self.flower_exit is not None else f"exit code {returncode}"
            reason = f": {self.reason}" if self.reason else ""
            self.flower_exit, self.reason, self.connected, self._exiting = None, "", False, False
            return f"{code}{reason}"
