"""A connection cut while an order or its reply is on the wire costs a retry, not the order (issue 25 B), over
real Flower.

A real ``flower-superlink`` (insecure, loopback), a :class:`~relay.CuttingRelay` in front of its Fleet API, one
``flower-supernode`` connected through the relay (the site's ClientApp, a fake worker in this process), and a
ServerApp (``tests/helpers/delivery_app.py``) that sends one generate order with the coordinator's
:class:`~hacrl_fed.flower.server_app.FlowerTransport`. The relay drops one response and resets that connection,
as a middlebox resetting connections does:

* the pull that hands the order out: Flower has already marked the order delivered (``get_message_ins``), the
  SuperNode's retried pull gets nothing; without probe-and-resend the exchange times out;
* the first PushObject of the reply: the retried push answers ``stored=False``, the SuperNode drops the reply
  half-pushed; without probe-and-resend Flower holds it 180 s and answers with an error.

Each takes about a minute on 2 cores (process start-up, a few ClientApp runs); waits follow progress (files,
the relay's event), never fixed sleeps.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import fake_worker
from fake_worker import FakeWorker
from hacrl_fed.launch import processes as launch
from hacrl_fed.launch.supervise import Supervisor, free_port
from hacrl_fed.protocol.worker_token import write_token
from delivery_manifest import delivery_app_dir
from relay import CuttingRelay

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"
TIMEOUT_S = 180.0
"""The exchange's timeout: without the fix the test fails after this long."""


def _env(home: Path) -> dict[str, str]:
    """Flower's environment; every child imports this checkout's hacrl_fed and the test helpers."""
    env = launch.flwr_env(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HELPERS)])
    return env


def _wait(cond, what: str, sup: Supervisor, timeout_s: float = TIMEOUT_S + 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        gone = sup.exited()
        if gone is not None and gone.name != "flwr-run":
            raise AssertionError(f"{gone.name} exited with code {gone.returncode}:\n{gone.tail(40)}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.tail(30)}" for p in sup.procs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)


@pytest.fixture
def worker(federation, tmp_path):
    token_file = tmp_path / "site" / "worker.token"
    w = FakeWorker("alice", federation.keys["alice"])
    server, address = fake_worker.serve(w, token=write_token(token_file))
    yield w, address, token_file
    server.stop(grace=0)


def _one_order(tmp_path: Path, address: str, token_file: Path, cut_path: str,
               cuts: int = 1) -> tuple[dict, CuttingRelay]:
    """Run the one-order ServerApp with the relay dropping the first ``cuts`` non-empty responses to ``cut_path``."""
    out = tmp_path / "result.json"
    link_home, node_home = tmp_path / "flwr-link", tmp_path / "flwr-node"
    port = free_port()
    launch.write_flwr_config(link_home, f"127.0.0.1:{port}", insecure=True, root_certificates=None)
    with Supervisor(tmp_path / "logs") as sup:
        launch.start_superlink(sup, host="127.0.0.1", port=port, database=tmp_path / "superlink.db",
                               env=_env(link_home), insecure=True, node_auth=False)
        with CuttingRelay(port) as relay:
            armed = [relay.swallow_next(cut_path) for _ in range(cuts)]
            launch.start_supernode(sup, "supernode", superlink=f"127.0.0.1:{relay.port}", port=free_port(),
                                   node_config={"agent-name": "alice", "worker-address": address,
                                                "worker-token-file": str(token_file)},
                                   env=_env(node_home), insecure=True)
            app = delivery_app_dir(tmp_path, {"out-path": str(out), "timeout-s": TIMEOUT_S},
                                   name="delivery-test", publisher="hacrl-fed-tests")
            launch.start_run(sup, app, {}, env=_env(link_home))
            _wait(lambda: all(e.is_set() for e in armed), f"the relay to cut {cuts} response(s) to {cut_path}", sup)
            _wait(out.exists, "the ServerApp's result", sup)
    (result,) = json.loads(out.read_text())
    return result, relay


def test_an_order_cut_in_delivery_is_delivered_again(tmp_path, worker):
    """The cut drops the pull that hands the order out: the site never sees it (Flower marked it delivered)."""
    w, address, token_file = worker
    result, relay = _one_order(tmp_path, address, token_file, "/v1/fleet/pull-messages")
    assert relay.swallowed == ["/v1/fleet/pull-messages"]
    assert not result["timed_out"] and not result["error"], result
    assert result["step"] == 1 and result["exchange_s"] < TIMEOUT_S
    assert [c["rpc"] for c in w.calls] == ["Generate"]          # the site got the order once: the second copy


def test_a_reply_cut_on_its_way_back_costs_a_retry(tmp_path, worker):
    """The cuts drop the answers to the reply's first two PushObjects (the SuperNode pushes two at a time): each
    retry gets ``stored=False``, the SuperNode gives up the reply half-pushed, and Flower holds it for 180 s and
    then answers with an error."""
    w, address, token_file = worker
    result, relay = _one_order(tmp_path, address, token_file, "/v1/fleet/push-object", cuts=2)
    assert relay.swallowed == ["/v1/fleet/push-object"] * 2
    assert not result["timed_out"] and not result["error"], result
    assert result["step"] == 1 and result["exchange_s"] < 150.0           # less than Flower's 180 s hold
    assert [c["rpc"] for c in w.calls] == ["Generate", "Generate"]      # the order went again
