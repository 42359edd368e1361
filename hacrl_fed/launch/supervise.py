"""Process supervision for ``hacrl-fed server``, ``hacrl-fed client`` and ``hacrl-fed simulate``.

A :class:`Supervisor` starts child processes in their own sessions (process groups), logs each to
a file (optionally tee-ing selected lines to our stdout with a prefix, and handing every line to a
callback), and stops them all, last started first:
SIGTERM to the process group and to every descendant (Flower's ``flower-superexec`` starts its
own session, so the group alone is not enough), a grace period, then SIGKILL. On Linux every
child also gets ``PR_SET_PDEATHSIG`` = SIGTERM, so the children of a SIGKILLed supervisor stop too,
and a guardian process (:data:`_GUARDIAN`) stops everything their trees started — also processes in
sessions of their own, such as Flower's ServerApp — within about a second of the supervisor's death,
whatever killed it. :meth:`Supervisor.handle_signals` turns SIGINT/SIGTERM into :class:`Shutdown` in the
main thread, so ``with Supervisor(...)`` blocks unwind and clean up. ANSI colour codes (Flower
colours its log levels unconditionally) are stripped from every line before it reaches a file, the
terminal or a callback.

The Flower-specific starters (:mod:`hacrl_fed.launch.processes`) build on this; everything takes
explicit ports and flags.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
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

__all__ = ["ManagedProcess", "Shutdown", "Supervisor", "die_with_parent", "find_executable", "free_port",
           "port_problem", "strip_ansi", "wait_for_tcp"]

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


def die_with_parent() -> None:
    """``preexec_fn`` of a child process: runs between fork and exec and asks Linux to send the child SIGTERM when
    its parent dies, even of SIGKILL (``prctl(PR_SET_PDEATHSIG)``). A no-op elsewhere."""
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


def _listeners(port: int) -> list[psutil.Process]:
    """Processes with a listening TCP socket on ``port`` (those this user may see)."""
    found = []
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(conn.pid))
    return found


def _describe(procs: Sequence[psutil.Process]) -> str:
    names = []
    for p in procs[:3]:
        with contextlib.suppress(psutil.Error):
            names.append(f"pid {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})")
    return ", ".join(names) or "another process"


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (in use — by which process, when it can be told — or
    not an address of this machine), or None when it is free. ``0.0.0.0``/``::``/'' mean every interface."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no obstacle
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return f"{host}:{port} is already in use by {_describe(_listeners(port))}"
            return f"{host}:{port} cannot be listened on: {err.strerror}"
    return None


def wait_for_tcp(host: str, port: int, timeout_s: float, *, alive: Callable[[], bool] = lambda: True,
                 owner: int | None = None) -> None:
    """Wait until something accepts TCP connections on ``host:port`` — with ``owner``, until process
    ``owner`` or one of its descendants listens there (another program on that port does not count).

    Raises TimeoutError after ``timeout_s``; RuntimeError when ``alive()`` turns false first, or when the
    port answers but belongs to another process that ``owner`` never displaces.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            others = _listeners(port)
            raise RuntimeError(f"process exited before {host}:{port} accepted connections"
                               + (f" ({host}:{port} is in use by {_describe(others)})" if others else ""))
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            if owner is None or _owns(owner, port):
                return
        time.sleep(0.2)
    others = _listeners(port)
    if others and owner is not None:
        raise RuntimeError(f"{host}:{port} is in use by {_describe(others)}, not by the started process")
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:g} s")


def _owns(pid: int, port: int) -> bool:
    """``pid`` or a descendant listens on ``port`` (True as well when that cannot be inspected)."""
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return False
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for p in tree for c in p.net_connections(kind="tcp"))
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False


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


_GUARDIAN = r"""
import os, select, signal, sys
import psutil

grace = float(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
roots, seen, buf = {}, {}, b""

def look():
    for pid, born in list(roots.items()):
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != born:
                raise psutil.NoSuchProcess(pid)
            seen[pid] = born
            for child in proc.children(recursive=True):
                seen[child.pid] = child.create_time()
        except psutil.Error:
            roots.pop(pid, None)

while True:
    ready, _, _ = select.select([0], [], [], 0.5)
    if ready:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            pid, born = line.split()
            roots[int(pid)] = float(born)
    look()
look()
left = []
for pid, born in seen.items():
    try:
        proc = psutil.Process(pid)
        if proc.create_time() == born and pid != os.getpid():
            left.append(proc)
    except psutil.Error:
        pass
for proc in left:
    try:
        proc.terminate()
        proc.resume()  # a stopped process handles its SIGTERM only once it runs
    except psutil.Error:
        pass
_, left = psutil.wait_procs(left, timeout=grace)
for proc in left:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""
"""The guardian process of a :class:`Supervisor`: it learns every started child's pid on its stdin and
watches each child's process tree (twice a second). When its stdin closes — the supervisor exited, or
was killed, even by SIGKILL — it stops every process of those trees still alive (SIGTERM, a grace
period, SIGKILL), including those that left the tree in their own session (Flower's
``flower-superexec`` and its ServerApp processes)."""


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
        self._guardian: subprocess.Popen | None = None

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
                                     cwd=cwd, start_new_session=True, preexec_fn=die_with_parent)
        except OSError:
            log_file.close()
            raise
        self._guard(popen.pid)
        proc = ManagedProcess(name, list(argv), popen, log_path, grace_s=grace_s)
        pump = threading.Thread(target=_pump, args=(popen.stdout, log_file, echo, f"[{name}] ", echo_filter, on_line),
                                daemon=True, name=f"log-{name}")
        pump.start()
        proc._threads.append(pump)
        self.procs.append(proc)
        log.info("started %s (pid %d): %s", name, popen.pid, " ".join(argv))
        return proc

    def _guard(self, pid: int) -> None:
        """Tell the guardian (started with the first child) about ``pid``: should this process die without
        cleaning up, the guardian stops ``pid`` and everything it started."""
        try:
            if self._guardian is None:
                self._guardian = subprocess.Popen([sys.executable, "-c", _GUARDIAN, str(self.grace_s)],
                                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL, start_new_session=True)
            self._guardian.stdin.write(f"{pid} {psutil.Process(pid).create_time()!r}\n".encode())  # type: ignore[union-attr]
            self._guardian.stdin.flush()  # type: ignore[union-attr]
        except (OSError, psutil.Error) as err:  # the child already died, or no guardian: the normal stop remains
            log.warning("no guardian for pid %d: %s", pid, err)

    def _release_guardian(self) -> None:
        if self._guardian is not None:
            with contextlib.suppress(OSError):
                self._guardian.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guardian.wait(timeout=self.grace_s + 10)
            self._guardian = None

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
            self._release_guardian()
            self._restore_signals()
