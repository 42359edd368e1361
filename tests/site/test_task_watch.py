"""A site says at its terminal when it did not carry out an order and why (:class:`TaskWatcher` reading the output
of the executor that runs its ClientApp tasks)."""

from __future__ import annotations

import logging

from hacrl_fed.site.watch import TASK_FAILED, TASK_STARTED, WITHDRAWN, TaskWatcher

STARTED = f"{TASK_STARTED} flwr-clientapp task 7 of run 42"
# flwr-clientapp 1.42 output of a task whose claim expired before its first heartbeat (recorded from a real run on a
# SuperNode whose task processes started 45 s late); the process then exits with code 0
WITHDRAWN_LINES = [
    "INFO :      Start `flwr-clientapp` process",
    "ERROR :     [/v1/runtime/send-task-heartbeat][ApiError:1008] Runtime task-token authentication failed.",
    "httpx.HTTPStatusError: Client error '401 Unauthorized' for url "
    "'http://127.0.0.1:49287/v1/runtime/send-task-heartbeat'",
    "INFO :      Task stopped.",
    "ERROR :     Failed to push task output: Client error '401 Unauthorized' for url "
    "'http://127.0.0.1:49287/v1/runtime/push-task-output'",
]
# a ClientApp that raised (Flower logs the traceback, then its exit message)
RAISED = [
    "ERROR :     ClientApp raised an exception",
    "Traceback (most recent call last):",
    '  File "warm_probe.py", line 30, in fail',
    "ZeroDivisionError: division by zero",
    "ERROR :     Exit Code: 800",
    "",
    "An unhandled exception occurred in a task process.",
]


def _watch(lines):
    out: list[tuple[int, str]] = []
    w = TaskWatcher(lambda level, msg: out.append((level, msg)))
    for line in lines:
        w.feed(line)
    return w, out


def test_a_task_flower_withdrew_is_reported_once_with_the_cause_though_it_exits_quietly():
    w, out = _watch([STARTED, *WITHDRAWN_LINES])
    assert out == [(logging.WARNING, f"an order from the coordinator was not carried out: {WITHDRAWN}; the "
                                     f"coordinator leaves this site out of that step")]
    assert w.missed == 1


def test_a_failed_task_is_reported_with_the_exception_and_the_task():
    _, out = _watch([STARTED, *RAISED, f"{TASK_FAILED} flwr-clientapp task 7 of run 42 (exit code 1)"])
    assert len(out) == 1
    level, msg = out[0]
    assert level == logging.WARNING
    assert "not carried out: the ClientApp failed: ZeroDivisionError: division by zero" in msg
    assert "[flwr-clientapp task 7 of run 42 (exit code 1)]" in msg


def test_flowers_exit_message_is_the_cause_when_no_exception_was_shown():
    _, out = _watch([STARTED, *RAISED[4:], f"{TASK_FAILED} flwr-clientapp task 7 of run 42 (exit code 1)"])
    assert "not carried out: Flower: An unhandled exception occurred in a task process." in out[0][1]


def test_a_cause_does_not_carry_over_to_the_next_task_and_successful_tasks_are_silent():
    _, out = _watch([STARTED, *RAISED[:4], STARTED, "INFO :      Task completed", STARTED,
                     f"{TASK_FAILED} flwr-clientapp task 9 of run 42 (killed by signal 9)"])
    assert len(out) == 1
    assert "not carried out: the ClientApp process failed (see the executor's log)" in out[0][1]
    assert "ZeroDivision" not in out[0][1]
