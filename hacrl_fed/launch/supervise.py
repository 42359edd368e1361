"""Process supervision for ``hacrl-fed server``, ``hacrl-fed client`` and ``hacrl-fed simulate``.

A :class:`Supervisor` starts child processes in their own sessions (process groups), logs each to
a file (optionally tee-ing selected lines to our stdout with a prefix, and handing every line to a
callback), and stops them all, last started first:
SIGTERM to the process group and to every descendant (Flower's ``flower-superexec`` starts its
own session, so the group alone is not enough), a grace period, then SIGKILL. On Linux every
child also gets ``PR_SET_PDEATHSIG`` = SIGTERM, so the children of a SIGKILLed supervisor stop too
(Flower's own helper processes watch their parent and follow). :meth:`Supervisor.handle_signals` turns SIGINT/SIGTERM into :class:`Shutdown` in the
main thread, so ``with Supervisor(...)`` blocks unwind and clean up. ANSI colour codes (Flower
colours its log levels unconditionally) are stripped from every line before it reaches a file, the
terminal or a callback.

The Flower-specific starters (:mod:`hacrl_fed.launch.processes`) build on this; everything takes
explicit ports and flags.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

__all__ = ["ManagedProcess", "Shutdown", "Supervisor", "find_executable", "free_port", "strip_ansi", "wait_for_tcp"]

log = logging.getLogger("hacrl_fed.supervise")

_PR_SET_PDEATHSIG = 1
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""CSI escape sequences (colours, cursor movement)."""


def strip_ansi(data: bytes) -> bytes:
    """``data`` without ANSI CSI escape sequences (``\\x1b[92m`` …)."""
    return _ANSI.sub(b"", data)


class Shutdown(Exception):
    """Raised in the main thread when SIGINT/SIGTERM asks the supervisor to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up once here: the child must not load libraries between fork and exec


def _child_setup() -> None:
    """Runs in the child between fork and exec: die (SIGTERM) when the supervisor dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def find_executable(name: str) -> str:
    """Path of a console script: next to the running interpreter first (same venv), then PATH.

    Raises FileNotFoundError naming the script.
    """
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name}: not found next to {sys.executable} nor on PATH (is flwr installed?)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_tcp(host: str, port: int, timeout_s: float, *, alive: Callable[[], bool] = lambda: True) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    Raises TimeoutError after ``timeout_s``; RuntimeError when ``alive()`` turns false first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process exited before {host}:{port} accepted connections")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:g} s")


@dataclass
class ManagedProcess:
    """A started child: its argv, Popen handle and log file."""

    name: str
    argv: list[str]
    popen: subprocess.Popen
    log_path: Path
    _threads: list[threading.Thread] = field(default_factory=list)
    grace_s: float | None = None
    """Seconds it gets between SIGTERM and SIGKILL when the supervisor stops it (None: the supervisor's)."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def tail(self, lines: int = 20) -> str:
        """Last ``lines`` lines of the log (for error messages)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group and all descendants, wait ``grace_s``, then SIGKILL what is left.

        Returns the exit code (negative: killed by that signal). Idempotent.
        """
        descendants = _descendants(self.pid)
        deadline = time.monotonic() + grace_s
        _signal_group(self.pid, signal.SIGTERM)
        for p in descendants:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        _, alive = psutil.wait_procs(descendants, timeout=max(0.0, deadline - time.monotonic()))
        if self.popen.poll() is None or alive:
            log.warning("%s: %d process(es) ignored SIGTERM for %g s; killing", self.name,
                        len(alive) + (self.popen.poll() is None), grace_s)
            _signal_group(self.pid, signal.SIGKILL)
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
            psutil.wait_procs(alive, timeout=5)
        for t in self._threads:
            t.join(timeout=2)
        return self.popen.returncode


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _pump(stream: IO[bytes], log_file: IO[bytes], echo: IO[str] | None, prefix: str,
          echo_filter: Callable[[str], bool] | None = None, on_line: Callable[[str], None] | None = None) -> None:
    """Copy the child's output line by line (ANSI codes stripped) to its log file, ``echo`` (lines
    ``echo_filter`` accepts) and ``on_line``. A failing callback never stops the copying."""
    for raw in iter(stream.readline, b""):
        line = strip_ansi(raw)
        log_file.write(line)
        log_file.flush()
        text = line.decode("utf-8", errors="replace")
        if echo is not None and (echo_filter is None or echo_filter(text)):
            echo.write(prefix + text if text.endswith("\n") else prefix + text + "\n")
            echo.flush()
        if on_line is not None:
            try:
                on_line(text.rstrip("\n"))
            except Exception:  # noqa: BLE001 - a status callback must not lose the log
                log.exception("line callback failed")
    stream.close()
    log_file.close()


class Supervisor:
    """Starts and stops a set of child processes; a context manager that always cleans up.

    Args:
        log_dir: where ``<name>.log`` files go (created).
        grace_s: seconds between SIGTERM and SIGKILL when stopping.
    """

    def __init__(self, log_dir: str | Path, *, grace_s: float = 10.0) -> None:
        self.log_dir = Path(log_dir)
        self.grace_s = grace_s
        self.procs: list[ManagedProcess] = []
        self._old_handlers: dict[int, object] = {}

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, echo: IO[str] | None = None,
              echo_filter: Callable[[str], bool] | None = None,
              on_line: Callable[[str], None] | None = None, grace_s: float | None = None) -> ManagedProcess:
        """Start ``argv`` in a new session; output to ``<log_dir>/<name>.log``, to ``echo`` (prefixed
        ``[name] ``; only lines ``echo_filter`` accepts, if given) and to ``on_line`` (each line without
        its newline, called from the copying thread). ``grace_s`` overrides the supervisor's grace period
        for this process (a worker saving its checkpoint on SIGTERM needs longer).

        Raises OSError when the program cannot be started.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by the pump thread or below
        try:
            popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=dict(env) if env is not None else None,
                                     cwd=cwd, start_new_session=True, preexec_fn=_child_setup)
        except OSError:
            log_file.close()
            raise
        proc = ManagedProcess(name, list(argv), popen, log_path, grace_s=grace_s)
        pump = threading.Thread(target=_pump, args=(popen.stdout, log_file, echo, f"[{name}] ", echo_filter, on_line),
                                daemon=True, name=f"log-{name}")
        pump.start()
        proc._threads.append(pump)
        self.procs.append(proc)
        log.info("started %s (pid %d): %s", name, popen.pid, " ".join(argv))
        return proc

    def stop(self, proc: ManagedProcess) -> int | None:
        """Stop one process (and its descendants); it is forgotten afterwards."""
        code = proc.stop(self.grace_s if proc.grace_s is None else proc.grace_s)
        if proc in self.procs:
            self.procs.remove(proc)
        log.info("stopped %s (exit code %s)", proc.name, code)
        return code

    def stop_all(self) -> None:
        """Stop every process, last started first."""
        for proc in reversed(list(self.procs)):
            self.stop(proc)

    def exited(self) -> ManagedProcess | None:
        """The first managed process that has exited, or None."""
        return next((p for p in self.procs if not p.alive()), None)

    def handle_signals(self) -> None:
        """Make the first SIGINT/SIGTERM raise :class:`Shutdown` in the main thread and ignore later ones
        while shutting down (the previous handlers are restored on exit)."""

        def handler(signum: int, _frame: object) -> None:
            for sig in self._old_handlers:  # one shutdown at a time: later signals must not interrupt it
                signal.signal(sig, signal.SIG_IGN)
            raise Shutdown(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old_handlers.clear()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        # a second Ctrl-C while cleaning up must not leave children behind
        for sig in self._old_handlers:
            signal.signal(sig, signal.SIG_IGN)
        try:
            self.stop_all()
        finally:
            self._restore_signals()
