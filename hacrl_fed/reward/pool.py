"""A small process pool with a hard per-item limit: a worker that overruns is killed and replaced.

``concurrent.futures.ProcessPoolExecutor`` cannot cancel a running task, and ``signal.alarm``
works only in a process's main thread, so neither bounds a hung sympy call made from a gRPC
servicer thread. Here each worker is a ``spawn``-ed process on its own pipe; the caller thread
dispatches items to idle workers, waits on the pipes, and when an item overruns ``SIGKILL``\\ s the
worker and starts a fresh one.

The limit is **CPU time**, so a verdict does not depend on machine load: an item may use
``timeout_s`` CPU seconds of its worker process (user + system, read with psutil), however long a
busy machine makes that take. A generous wall-clock backstop (``wall_timeout_s``) still kills a
worker that is stuck without computing. An item that overruns its CPU limit is retried once
(``retries``) in a fresh worker with both limits multiplied by ``retry_factor``; one that hits the
wall-clock backstop is not retried. Both limits count from dispatch: a worker only receives items
after it reported ready (imports done), so start-up never eats into an item's time.

A call may also bound the CPU each *group* of its items spends in all (``groups``, ``group_budget_s``: a
source's rows in one step): the CPU seconds of every finished, failed or killed item count against its group,
and once a group has spent its budget its items not yet dispatched are not run (outcome ``("budget", limit)``),
so one group cannot buy more than its budget plus one item's limits (×2 with a retry) per worker.

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
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is a dependency; without it the limit is wall-clock
    psutil = None

__all__ = ["KillablePool", "MapStats", "Outcome"]

Outcome = tuple[str, Any]
"""``("ok", value)``, ``("timeout", limit)``, ``("crash", exit_code)``, ``("error", exception_type_name)`` or
``("budget", limit)`` (not run: its group's CPU budget was spent); ``limit`` says which limit, e.g.
``"4 s CPU"`` or ``"60 s wall-clock"``."""

_READY = ("ready",)
_POLL_S = 0.5
"""Longest wait between two looks at the busy workers' CPU time (seconds)."""
_MIN_POLL_S = 0.01
_MIN_CHARGE_S = 0.001
"""CPU seconds an item counts against its group's budget at least."""


@dataclass(frozen=True)
class MapStats:
    """Timeout counts of one :meth:`KillablePool.map_with_stats` call.

    Attributes:
        timeouts: items whose final outcome is ``timeout`` (after any retry).
        retried: items that overran their CPU limit once and were run again with the longer limit
            (``retried - timeouts`` of them, at most, were rescued by the retry).
    """

    timeouts: int = 0
    retried: int = 0
    over_budget: int = 0
    """Items not run because their group's CPU budget was spent."""


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
        self._ps = None
        if psutil is not None:
            with contextlib.suppress(Exception):
                self._ps = psutil.Process(self.proc.pid)
        self.started = time.monotonic()
        self.ready = False
        self.index: int | None = None
        self.attempt = 0
        self.dispatched = 0.0
        self.cpu_start: float | None = None
        self.cpu_last = 0.0
        self.cpu_limit = 0.0
        self.wall_deadline = 0.0

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the worker process; ``None`` if they cannot be read."""
        if self._ps is None:
            return None
        try:
            t = self._ps.cpu_times()
        except Exception:  # noqa: BLE001 - gone or not permitted: the pipe tells the rest
            return None
        self.cpu_last = t.user + t.system
        return self.cpu_last

    def cpu_used(self) -> float:
        """CPU seconds the current item has used; wall-clock seconds since dispatch where the CPU
        time could not be read at dispatch, the last reading where it cannot be read now."""
        if self.cpu_start is None:
            return time.monotonic() - self.dispatched
        now = self.cpu_seconds()
        return (self.cpu_last if now is None else now) - self.cpu_start

    def assign(self, index: int, attempt: int, cpu_limit: float, wall_limit: float) -> None:
        """Record a dispatched item and its limits (CPU seconds, wall-clock seconds)."""
        self.cpu_start = self.cpu_seconds()
        self.index, self.attempt, self.cpu_limit = index, attempt, cpu_limit
        self.dispatched = time.monotonic()
        self.wall_deadline = self.dispatched + wall_limit

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
    """Apply ``fn`` to items in ``workers`` processes, each item under a hard CPU-time limit.

    Args:
        fn: picklable callable (module-level function or callable-class instance) run in the
            workers; an optional ``fn.warm_up()`` runs once per worker before it reports ready.
        workers: number of processes (≥ 1).
        timeout_s: CPU seconds (user + system of the worker process) one item may use before its
            worker is killed; machine load does not count against it.
        memory_limit_mb: address-space limit per worker (``RLIMIT_AS``); ``None`` = unlimited.
            An item that exhausts it fails with ``("error", "MemoryError")``.
        start_timeout_s: seconds a worker may take to start; raises ``RuntimeError`` beyond.
        wall_timeout_s: wall-clock backstop per item (seconds), for a worker stuck without using
            CPU; default ``max(60, 10 × timeout_s)``. Must be ≥ ``timeout_s``.
        retries: how many times an item that overran its CPU limit is run again (0 = never).
        retry_factor: each retry multiplies both limits by this (≥ 1).

    Raises ``ValueError`` for non-positive ``workers``/``timeout_s``, ``wall_timeout_s`` below
    ``timeout_s``, negative ``retries`` or ``retry_factor`` below 1. Where the worker's CPU time
    cannot be read (psutil missing or refused), ``timeout_s`` falls back to wall-clock seconds.
    """

    def __init__(self, fn: Callable[[Any], Any], *, workers: int = 2, timeout_s: float = 5.0,
                 memory_limit_mb: int | None = 2048, start_timeout_s: float = 120.0,
                 wall_timeout_s: float | None = None, retries: int = 1, retry_factor: float = 2.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        wall = max(60.0, 10.0 * float(timeout_s)) if wall_timeout_s is None else float(wall_timeout_s)
        if not wall >= timeout_s:
            raise ValueError(f"wall_timeout_s must be >= timeout_s ({timeout_s:g}), got {wall_timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if not retry_factor >= 1:
            raise ValueError(f"retry_factor must be >= 1, got {retry_factor}")
        self.fn, self.workers, self.timeout_s = fn, workers, float(timeout_s)
        self.wall_timeout_s, self.retries, self.retry_factor = wall, int(retries), float(retry_factor)
        self.memory_limit_mb, self.start_timeout_s = memory_limit_mb, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None
        self.restarts = 0
        """Workers replaced after a timeout or crash (for metrics)."""
        self.timeouts = 0
        """Items whose final outcome was ``timeout``, over all calls (for metrics)."""
        self.retried = 0
        """Items run again after overrunning their CPU limit, over all calls (for metrics)."""
        self._groups: list[Any] | None = None
        self._budget: float | None = None
        self._spent: dict[Any, float] = {}

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
        return self.map_with_stats(items)[0]

    def map_with_stats(self, items: Sequence[Any], *, groups: Sequence[Any] | None = None,
                       group_budget_s: float | None = None) -> tuple[list[Outcome], MapStats]:
        """:meth:`map` plus this call's :class:`MapStats` (timeouts and retries). ``groups``: one hashable per
        item; with ``group_budget_s`` (CPU seconds, > 0) a group's items stop being run once it has spent that
        much (module docstring). Raises ``ValueError`` for a ``groups`` of another length."""
        if groups is not None and len(groups) != len(items):
            raise ValueError(f"groups has {len(groups)} entries, expected {len(items)}")
        self.start()
        with self._lock:
            self._groups = list(groups) if groups is not None and group_budget_s else None
            self._budget, self._spent = group_budget_s, {}
            try:
                results, stats = self._map(items)
            finally:
                self._groups = None
        return results, stats

    def _charge(self, s: _Slot) -> None:
        """Count the CPU the slot's current item used against its group (at least :data:`_MIN_CHARGE_S`: the
        process's CPU times tick in 10 ms steps, so a cheap item can read as 0)."""
        if self._groups is not None and s.index is not None:
            group = self._groups[s.index]
            self._spent[group] = self._spent.get(group, 0.0) + max(_MIN_CHARGE_S, s.cpu_used())

    def _limits(self, attempt: int) -> tuple[float, float]:
        f = self.retry_factor ** attempt
        return self.timeout_s * f, self.wall_timeout_s * f

    def _dispatch(self, pending: deque[tuple[int, int]], items: Sequence[Any],
                  results: list[Outcome | None]) -> int:
        done = 0
        for i, s in enumerate(self._slots):
            while s.ready and s.index is None and pending and self._over_budget(pending[0][0]):
                index, _ = pending.popleft()
                results[index] = ("budget", f"{self._budget:g} s CPU")
                done += 1
            if s.ready and s.index is None and pending:
                index, attempt = pending.popleft()
                try:
                    s.conn.send((index, items[index]))
                except (OSError, ValueError):  # worker gone between items
                    results[index] = ("crash", s.proc.exitcode)
                    done += 1
                    self._replace(i)
                    continue
                s.assign(index, attempt, *self._limits(attempt))
        return done

    def _over_budget(self, index: int) -> bool:
        return self._groups is not None and self._spent.get(self._groups[index], 0.0) >= (self._budget or 0.0)

    def _wait_s(self) -> float:
        """How long to wait on the pipes before looking at the busy workers again."""
        now = time.monotonic()
        wait_s = _POLL_S
        for s in self._slots:
            if s.index is not None:
                # a single-threaded worker cannot use more CPU than the wall time that passes
                cpu_left = s.cpu_limit - s.cpu_used()
                wait_s = min(wait_s, max(_MIN_POLL_S, cpu_left), max(0.0, s.wall_deadline - now))
        return wait_s

    def _map(self, items: Sequence[Any]) -> tuple[list[Outcome], MapStats]:
        for i, s in enumerate(self._slots):
            if s.index is not None:  # left busy by an interrupted call (KeyboardInterrupt): its result is stale
                self._replace(i)
        results: list[Outcome | None] = [None] * len(items)
        pending: deque[tuple[int, int]] = deque((i, 0) for i in range(len(items)))
        remaining = len(items)
        timeouts = retried = 0
        while remaining:
            remaining -= self._dispatch(pending, items, results)
            ready = set(wait([s.conn for s in self._slots], timeout=self._wait_s()))
            for i, s in enumerate(self._slots):
                if s.conn in ready:
                    remaining -= self._receive(i, results)
            now = time.monotonic()
            for i, s in enumerate(self._slots):
                if s.index is not None:
                    cpu_over = s.cpu_used() >= s.cpu_limit
                    if not cpu_over and now < s.wall_deadline:
                        continue
                    if s.conn.poll():  # it finished just now: a result that arrived always counts
                        remaining -= self._receive(i, results)
                        s = self._slots[i]
                        if s.index is None:
                            continue
                    index, attempt = s.index, s.attempt
                    self._charge(s)
                    self._replace(i)
                    if cpu_over and attempt < self.retries:
                        pending.appendleft((index, attempt + 1))
                        retried += 1
                    else:
                        cpu_limit, wall_limit = self._limits(attempt)
                        if not cpu_over:
                            limit = f"{wall_limit:g} s wall-clock"
                        else:  # where CPU time is unreadable, cpu_used() counted wall-clock seconds
                            limit = f"{cpu_limit:g} s {'wall-clock' if s.cpu_start is None else 'CPU'}"
                        results[index] = ("timeout", limit)
                        timeouts += 1
                        remaining -= 1
                elif not s.ready and now - s.started > self.start_timeout_s:
                    self._replace(i)
                    raise RuntimeError(f"verifier worker did not start within {self.start_timeout_s:.0f} s")
        self.timeouts += timeouts
        self.retried += retried
        over = sum(1 for r in results if r is not None and r[0] == "budget")
        return results, MapStats(timeouts, retried, over)  # type: ignore[return-value]

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
                self._charge(s)
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
            self._charge(s)
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
