"""When Flower ends a run, the operator gets one line: the status, the cause, and how to resume."""

from __future__ import annotations

from hacrl_fed.launch.run_end import RESUME, run_end_line


def test_a_run_flower_expired_names_the_missing_heartbeat_and_says_to_resume():
    line = run_end_line(17, "finished:failed", "No heartbeat received from the task")
    assert line == ("the Flower run 17 ended (finished:failed): Flower ended it: the ServerApp sent no heartbeat for "
                    f"60 s (Flower's fixed limit) — this machine is too busy; {RESUME}")


def test_without_details_the_servers_last_error_is_the_cause():
    log = ["INFO :      [flwr-serverapp] Pull task input",
           "2026-12-02 21:00:00,001 ERROR hacrl_fed.coordinator: roster: /x/roster.toml: no such file",
           "INFO :      Task stopped."]
    line = run_end_line(3, "finished:failed", "", log, resume="resume it with `hacrl-fed simulate --resume r`")
    assert line == ("the Flower run 3 ended (finished:failed): roster: /x/roster.toml: no such file; resume it with "
                    "`hacrl-fed simulate --resume r`")


def test_a_serverapp_exception_is_the_cause():
    log = ["ERROR :     ServerApp raised an exception", "Traceback (most recent call last):",
           "RuntimeError: the coordinator lost its state file"]
    assert "ended (finished:failed): RuntimeError: the coordinator lost its state file; " in run_end_line(
        3, "finished:failed", "", log)


def test_unknown_details_are_passed_on_and_nothing_is_said_for_a_completed_run():
    assert run_end_line(5, "finished:failed", "Task failed with unknown error.").endswith(
        f"ended (finished:failed): Task failed with unknown error.; {RESUME}")
    assert run_end_line(5, "finished:completed", "") is None
    assert "no cause was recorded (see logs/superlink.log)" in run_end_line(None, "", "")
