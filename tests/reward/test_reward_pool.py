"""The killable pool itself: hard deadlines, crashes and exceptions become outcomes, never hangs."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hacrl_fed.reward.pool import KillablePool


class Job:
    """Picklable test job: doubles numbers; special items hang, crash the process or raise."""

    def __call__(self, item):
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
    with KillablePool(Job(), workers=2, timeout_s=1.0, memory_limit_mb=None) as p:
        yield p


def test_outcomes_in_order(pool):
    assert pool.map([1, 2, 3, 4, 5]) == [("ok", 2), ("ok", 4), ("ok", 6), ("ok", 8), ("ok", 10)]


def test_hang_crash_and_exception(pool):
    start = time.monotonic()
    out = pool.map(["hang", 1, "crash", "raise", 2])
    assert out == [("timeout", None), ("ok", 2), ("crash", 3), ("error", "KeyError"), ("ok", 4)]
    assert time.monotonic() - start < 4.0
    assert pool.map([21]) == [("ok", 42)]


def test_killed_worker_is_replaced(pool):
    before = {pool.map(["pid"])[0][1] for _ in range(4)}
    pool.map(["hang"])
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


def test_close_stops_workers():
    p = KillablePool(Job(), workers=1, timeout_s=1.0, memory_limit_mb=None)
    assert p.map([3]) == [("ok", 6)]
    procs = [s.proc for s in p._slots]
    p.close()
    assert not any(proc.is_alive() for proc in procs)
    p.close()  # idempotent
