"""A small process pool with a hard per-item deadline: a worker that overruns is killed and replaced.

``concurrent.futures.ProcessPoolExecutor`` cannot cancel a running task, and ``signal.alarm``
works only in a process's main thread, so neither bounds a hung sympy call made from a gRPC
servicer thread. Here each worker is a ``spawn``-ed process on its own pipe; the caller thread
dispatches items to idle workers, waits on the pipes with a timeout, and on a deadline
``SIGKILL``\\ s the worker and starts a fresh one. The deadline counts from dispatch: a worker only
receives items after it reported ready (imports done), so start-up never eats into an item's time.

Safe to use from any thread; concurrent :meth:`KillablePool.map` calls are serialized. Like every
``spawn`` user, a script that creates a pool at import time needs the ``if __name__ == "__main__":``
guard.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["KillablePool", "Outcome"]

Outcome = tuple[str, Any]
"""``("ok", value)``, ``("timeout", None)``, ``("crash", exit_code)`` or ``("error", exception_type_name)``."""

_READY = ("ready",)


def _worker_main(conn: Connection, fn: Callable[[Any], Any], memory_limit_mb: int | None) -> None:
    """Worker loop: warm up, report ready, then answer ``(index, item)`` with ``(index, outcome)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if memory_limit_mb:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warm = getattr(fn, "warm_up", None)
    if callable(warm):
        warm()
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, item = msg
        try:
            out: Outcome = ("ok", fn(item))
        except BaseException as exc:  # noqa: BLE001 - report, never die; str(exc) may be huge, keep the type
            out = ("error", type(exc).__name__)
        conn.send((index, out))


class _Slot:
    """One worker process, its pipe, and the item it is working on."""

    def __init__(self, ctx, fn, memory_limit_mb: int | None) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, fn, memory_limit_mb), daemon=True,
                                name="hacrl-verifier")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.index: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _kill_all(slots: list[_Slot]) -> None:
    for s in slots:
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            s.kill()


class KillablePool:
    """Apply ``fn`` to items in ``workers`` processes, each item under a hard ``timeout_s``.

    Args:
        fn: picklable callable (module-level function or callable-class instance) run in the
            workers; an optional ``fn.warm_up()`` runs once per worker before it reports ready.
        workers: number of processes (≥ 1).
        timeout_s: wall-clock seconds one item may take before its worker is killed.
        memory_limit_mb: address-space limit per worker (``RLIMIT_AS``); ``None`` = unlimited.
            An item that exhausts it fails with ``("error", "MemoryError")``.
        start_timeout_s: seconds a worker may take to start; raises ``RuntimeError`` beyond.

    Raises ``ValueError`` for non-positive ``workers``/``timeout_s``.
    """

    def __init__(self, fn: Callable[[Any], Any], *, workers: int = 2, timeout_s: float = 5.0,
                 memory_limit_mb: int | None = 2048, start_timeout_s: float = 120.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn, self.workers, self.timeout_s = fn, workers, float(timeout_s)
        self.memory_limit_mb, self.start_timeout_s = memory_limit_mb, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None
        self.restarts = 0
        """Workers replaced after a timeout or crash (for metrics)."""

    def start(self) -> None:
        """Start the workers (idempotent); returns without waiting for them to be ready."""
        with self._lock:
            if not self._slots:
                self._slots = [self._spawn() for _ in range(self.workers)]
                self._finalizer = weakref.finalize(self, _kill_all, self._slots)

    def _spawn(self) -> _Slot:
        return _Slot(self._ctx, self.fn, self.memory_limit_mb)

    def _replace(self, i: int) -> None:
        self._slots[i].kill()
        self._slots[i] = self._spawn()
        self.restarts += 1

    def map(self, items: Sequence[Any]) -> list[Outcome]:
        """Outcomes in item order. Raises ``RuntimeError`` if a worker cannot start at all."""
        self.start()
        with self._lock:
            return self._map(items)

    def _dispatch(self, pending: deque[int], items: Sequence[Any], results: list[Outcome | None]) -> int:
        done = 0
        for i, s in enumerate(self._slots):
            if s.ready and s.index is None and pending:
                index = pending.popleft()
                try:
                    s.conn.send((index, items[index]))
                except (OSError, ValueError):  # worker gone between items
                    results[index] = ("crash", s.proc.exitcode)
                    done += 1
                    self._replace(i)
                    continue
                s.index, s.deadline = index, time.monotonic() + self.timeout_s
        return done

    def _map(self, items: Sequence[Any]) -> list[Outcome]:
        for i, s in enumerate(self._slots):
            if s.index is not None:  # left busy by an interrupted call (KeyboardInterrupt): its result is stale
                self._replace(i)
        results: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        remaining = len(items)
        while remaining:
            remaining -= self._dispatch(pending, items, results)
            now = time.monotonic()
            busy = [s.deadline for s in self._slots if s.index is not None]
            wait_s = max(0.0, min(busy) - now) if busy else 0.5
            ready = set(wait([s.conn for s in self._slots], timeout=wait_s))
            for i, s in enumerate(self._slots):
                if s.conn in ready:
                    remaining -= self._receive(i, results)
            now = time.monotonic()
            for i, s in enumerate(self._slots):
                if s.index is not None and now >= s.deadline:
                    results[s.index] = ("timeout", None)
                    remaining -= 1
                    self._replace(i)
                elif not s.ready and now - s.started > self.start_timeout_s:
                    self._replace(i)
                    raise RuntimeError(f"verifier worker did not start within {self.start_timeout_s:.0f} s")
        return results  # type: ignore[return-value]

    def _receive(self, i: int, results: list[Outcome | None]) -> int:
        s = self._slots[i]
        try:
            msg = s.conn.recv()
        except (EOFError, OSError):
            s.proc.join(5)
            if s.index is None and not s.ready:
                code = s.proc.exitcode
                self._replace(i)
                raise RuntimeError(f"verifier worker exited during start-up (exit code {code}); "
                                   "is math-verify installed?") from None
            if s.index is not None:
                results[s.index] = ("crash", s.proc.exitcode)
                self._replace(i)
                return 1
            self._replace(i)
            return 0
        if msg == _READY:
            s.ready = True
            return 0
        index, outcome = msg
        if index == s.index:
            results[index] = outcome
            s.index = None
            return 1
        return 0

    def close(self) -> None:
        """Stop the workers (idempotent): ask politely, then kill after 2 s."""
        with self._lock:
            for s in self._slots:
                with contextlib.suppress(OSError, ValueError):
                    s.conn.send(None)
            deadline = time.monotonic() + 2.0
            for s in self._slots:
                s.proc.join(max(0.0, deadline - time.monotonic()))
                s.kill()
            self._slots = []
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None

    def __enter__(self) -> KillablePool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
