"""What a site's terminal shows: SuperNode connection trouble in plain words, the worker's progress lines."""

from __future__ import annotations

import logging

from hacrl_fed.site.watch import SupernodeWatcher, worker_line_visible
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.worker.agent import train_summary

# flower-supernode 1.42 output (colour codes already stripped), recorded from real runs
UNREACHABLE = ["INFO :      Starting Flower SuperNode",
               "WARNING :   Connection attempt failed, retrying in 0.83 seconds",
               "WARNING :   Connection attempt failed, retrying in 1.90 seconds"]
NOT_REGISTERED = ["ERROR :     Exit Code: 305", "Failed to initialize the connection to the SuperLink.",
                  "[code: 2004] Failed to activate SuperNode.",
                  "The SuperNode could not establish a connection to the SuperLink.", "",
                  "For more information, visit: <https://flower.ai/docs/framework/1.42/en/ref-exit-codes/305.html>"]
BAD_CA = ["ERROR :     SSL/TLS handshake error detected.", "ERROR :     Exit Code: 305",
          "Failed to initialize the connection to the SuperLink.",
          "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate"]
ORDER = ["INFO :      [RUN 1286706158, ROUND step-1/generate]",
         "INFO :      Receiving: query.generate message (ID: 8526)", "INFO :      Received successfully"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def watcher(clock=None):
    out: list[tuple[int, str]] = []
    w = SupernodeWatcher("coord.example.org:443", "keys/org-a.node.key", lambda lvl, msg: out.append((lvl, msg)),
                         clock=clock or Clock(), repeat_s=60.0)
    return w, out


def feed(w, lines):
    for line in lines:
        w.feed(line)


def test_unreachable_coordinator_is_reported_once_per_minute():
    clock = Clock()
    w, out = watcher(clock)
    feed(w, UNREACHABLE)
    assert len(out) == 1 and out[0][0] == logging.WARNING
    assert "cannot reach the coordinator at coord.example.org:443 yet" in out[0][1] and "retrying" in out[0][1]
    clock.t = 61.0
    feed(w, UNREACHABLE[1:2])
    assert len(out) == 2


def test_unregistered_node_key_is_named_and_the_exit_explained():
    w, out = watcher()
    feed(w, NOT_REGISTERED + UNREACHABLE[1:])  # the dying node's helper process fails to reach it: not reported
    assert len(out) == 1
    assert "refuses to activate this node" in out[0][1] and "(keys/org-a.node.pub)" in out[0][1]
    assert "is not registered there" in out[0][1] and "still connected there" in out[0][1] and "retrying" in out[0][1]
    assert w.exit_reason(1) == "Flower exit code 305: [code: 2004] Failed to activate SuperNode."
    assert w.exit_reason(1) == "exit code 1"  # the reason belongs to one exit only
    feed(w, UNREACHABLE[1:])  # the restarted node: reported again
    assert len(out) == 2 and "cannot reach" in out[1][1]


def test_tls_failure_points_at_the_ca_certificate():
    w, out = watcher()
    feed(w, BAD_CA)
    assert len(out) == 1 and out[0][0] == logging.ERROR  # the same problem is not repeated
    assert "root_certificates is not the coordinator's ca.crt" in out[0][1]


def test_connection_then_loss_then_reconnection():
    w, out = watcher()
    feed(w, ORDER + ORDER)
    assert [m for _, m in out] == [("connected to the coordinator at coord.example.org:443 "
                                    "(Flower run 1286706158, first order: query.generate)")]
    feed(w, UNREACHABLE[1:])
    assert "lost the connection" in out[1][1] and "stop it with Ctrl-C" in out[1][1]
    feed(w, UNREACHABLE[1:])
    assert len(out) == 2
    feed(w, ORDER)
    assert len(out) == 3 and out[2][1].startswith("connected")


def test_worker_lines_shown_on_the_terminal():
    assert worker_line_visible("2026-11-30 20:15:00,042 INFO hacrl_fed.worker: step 1 trained: 24 rows")
    assert worker_line_visible("2026-11-30 20:15:00,042 WARNING hacrl_fed.worker.detail: disk almost full")
    assert worker_line_visible("error: no such model directory or file: ./x (known aliases: a)")
    assert not worker_line_visible("2026-11-30 20:15:00,042 INFO hacrl_fed.worker.detail: step 1 generated: 8")
    assert not worker_line_visible("Loading weights: 100%|██████████| 20/20")
    assert not worker_line_visible("2026-11-30 20:15:00,042 INFO httpx: HTTP Request: HEAD https://huggingface.co")


def test_train_summary_line():
    report = pb.TrainReport(run_id="r", step=3, agent_id="alice", rejected=["bob: bad signature"])
    report.metrics.update({"loss": 0.0125, "time/total_s": 4.24})
    report.per_source.add(source_agent="alice", metrics={"rows": 8.0, "reward_mean": 0.5})
    report.per_source.add(source_agent="carol", metrics={"rows": 8.0, "reward_mean": 0.25})
    report.per_source.add(source_agent="dave", metrics={"rows": 16.0, "reward_mean": 0.0})
    assert train_summary(report) == ("step 3 trained: 32 rows (8 own, 24 from 2 peers), mean reward 0.188 "
                                     "(own 0.500), loss 0.0125, 4.2 s, 1 peer batch(es) refused")


def test_a_node_that_was_connected_before_is_not_told_its_key_is_unregistered():
    """SuperNode or client restart, duplicate site: the key was accepted before, so that is not the cause."""
    w, out = watcher()
    feed(w, ORDER)
    w.exit_reason(0)
    feed(w, NOT_REGISTERED)
    refusal = [m for _, m in out if "refuses to activate" in m]
    assert len(refusal) == 1 and "not registered" not in refusal[0]
    assert "the key is registered" in refusal[0] and "previous connection" in refusal[0]
    assert "another process or site now uses the same key" in refusal[0]


def test_a_taken_clientapp_port_is_fatal():
    w, out = watcher()
    feed(w, ["ERROR :     Port in server address 127.0.0.1:9094 is already in use."])
    assert w.fatal and "127.0.0.1:9094" in w.fatal and out[-1][0] == logging.ERROR
