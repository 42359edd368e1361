"""The killable pool itself: hard CPU-time limits with one retry, a wall-clock backstop, crashes
and exceptions become outcomes, never hangs; a stalled (starved) worker keeps its item."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from hacrl_fed.reward.pool import KillablePool, MapStats


class Job:
    """Picklable test job: doubles numbers; special items spin, hang, crash, raise, burn CPU or stall."""

    def __call__(self, item):
        if isinstance(item, tuple) and item[0] == "cpu":  # use item[1] CPU seconds, then answer
            start = time.process_time()
            while time.process_time() - start < item[1]:
                pass
            return "done"
        if isinstance(item, tuple) and item[0] == "stall":
            # Stop this process for item[1] wall seconds (a starved worker: no CPU time passes), then
            # use 0.2 CPU seconds. A shell outside the process sends the SIGCONT.
            pid = os.getpid()
            subprocess.Popen(["sh", "-c", f"sleep {item[1]}; kill -CONT {pid}"])
            os.kill(pid, signal.SIGSTOP)
            return self(("cpu", 0.2))
        if item == "spin":
            while True:
                pass
        if item == "hang":
            time.sleep(600)
        if item == "crash":
            os._exit(3)
        if item == "raise":
            raise KeyError("boom")
        if item == "pid":
            return os.getpid()
        return item * 2


@pytest.fixture(scope="module")
def pool():
    with KillablePool(Job(), workers=2, timeout_s=1.0, retries=0, memory_limit_mb=None) as p:
        yield p


def test_outcomes_in_order(pool):
    assert pool.map([1, 2, 3, 4, 5]) == [("ok", 2), ("ok", 4), ("ok", 6), ("ok", 8), ("ok", 10)]


def test_spin_crash_and_exception(pool):
    start = time.monotonic()
    out, stats = pool.map_with_stats(["spin", 1, "crash", "raise", 2])
    assert out == [("timeout", "1 s CPU"), ("ok", 2), ("crash", 3), ("error", "KeyError"), ("ok", 4)]
    assert stats == MapStats(timeouts=1, retried=0)  # retries=0: no second run
    assert time.monotonic() - start >= 1.0  # a spinning worker cannot use 1 CPU second sooner
    assert pool.map([21]) == [("ok", 42)]


def test_stuck_worker_is_killed_by_the_wall_clock_backstop():
    with KillablePool(Job(), workers=1, timeout_s=0.5, wall_timeout_s=1.5, memory_limit_mb=None) as p:
        start = time.monotonic()
        out, stats = p.map_with_stats(["hang", 3])
        elapsed = time.monotonic() - start
    assert out == [("timeout", "1.5 s wall-clock"), ("ok", 6)]
    assert stats == MapStats(timeouts=1, retried=0)  # no CPU overrun, so no retry
    assert 1.5 <= elapsed < 60  # the backstop, not the 600 s sleep, ends it


def test_stalled_worker_keeps_its_item(pool):
    """A worker that gets no CPU for longer than the limit (a loaded machine, simulated by
    SIGSTOP) is not killed: only CPU time counts."""
    start = time.monotonic()
    out, stats = pool.map_with_stats([("stall", 1.8), 5])
    assert time.monotonic() - start >= 1.8  # the stall really lasted longer than timeout_s = 1
    assert out == [("ok", "done"), ("ok", 10)]
    assert stats == MapStats()


def test_overrun_is_retried_once_with_the_longer_limit():
    with KillablePool(Job(), workers=1, timeout_s=0.3, retries=1, retry_factor=3.0, memory_limit_mb=None) as p:
        out, stats = p.map_with_stats([("cpu", 0.6), 4])  # 0.6 s > 0.3 s, but < 0.9 s on the retry
        assert out == [("ok", "done"), ("ok", 8)]
        assert stats == MapStats(timeouts=0, retried=1)
        out, stats = p.map_with_stats(["spin"])
        assert out == [("timeout", "0.9 s CPU")]  # the retry's limit
        assert stats == MapStats(timeouts=1, retried=1)
        assert (p.timeouts, p.retried, p.restarts) == (1, 2, 3)  # totals over both calls


def test_killed_worker_is_replaced(pool):
    before = {pool.map(["pid"])[0][1] for _ in range(4)}
    pool.map(["spin"])
    after = {pool.map(["pid"])[0][1] for _ in range(4)}
    assert after - before  # a new process serves
    assert all(s.proc.is_alive() for s in pool._slots)


def test_concurrent_callers_are_served(pool):
    got = {}
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, pool.map([k, k + 1]))) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {k: [("ok", 2 * k), ("ok", 2 * k + 2)] for k in range(3)}


def test_invalid_settings():
    with pytest.raises(ValueError, match="workers"):
        KillablePool(Job(), workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        KillablePool(Job(), timeout_s=0)
    with pytest.raises(ValueError, match="wall_timeout_s"):
        KillablePool(Job(), timeout_s=5, wall_timeout_s=1)
    with pytest.raises(ValueError, match="retries"):
        KillablePool(Job(), retries=-1)
    with pytest.raises(ValueError, match="retry_factor"):
        KillablePool(Job(), retry_factor=0.5)
    p = KillablePool(Job(), timeout_s=2)
    assert (p.wall_timeout_s, p.retries, p.retry_factor) == (60.0, 1, 2.0)  # the defaults
    assert KillablePool(Job(), timeout_s=10).wall_timeout_s == 100.0


def test_close_stops_workers():
    p = KillablePool(Job(), workers=1, timeout_s=1.0, memory_limit_mb=None)
    assert p.map([3]) == [("ok", 6)]
    procs = [s.proc for s in p._slots]
    p.close()
    assert not any(proc.is_alive() for proc in procs)
    p.close()  # idempotent


def test_a_group_over_its_cpu_budget_has_its_remaining_items_refused(pool):
    """mallory's items burn 0.3 CPU s each against a 0.5 s budget: two run, the rest are refused unrun; alice's
    cheap items all run, whatever their place in the queue."""
    items = [("cpu", 0.3)] * 5 + [1, 2, 3]
    groups = ["mallory"] * 5 + ["alice"] * 3
    out, stats = pool.map_with_stats(items, groups=groups, group_budget_s=0.5)
    assert out[5:] == [("ok", 2), ("ok", 4), ("ok", 6)]
    ran = [o for o in out[:5] if o == ("ok", "done")]
    refused = [o for o in out[:5] if o == ("budget", "0.5 s CPU")]
    assert 2 <= len(ran) <= 3 and len(ran) + len(refused) == 5        # two workers: at most one more in flight
    assert stats.over_budget == len(refused) >= 2
    assert pool.map_with_stats(items, groups=groups)[1].over_budget == 0      # no budget: everything runs
    with pytest.raises(ValueError, match="groups"):
        pool.map_with_stats([1, 2], groups=["a"], group_budget_s=1.0)
