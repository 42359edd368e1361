"""The ClientApp courier against a real gRPC worker in this process, and the message records."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

import fake_worker
from fake_worker import FakeWorker
from hacrl_fed.flower import client_app, records
from hacrl_fed.protocol.worker_token import write_token
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb


def message(content: RecordDict, message_type: str, ttl: float = 30.0) -> Message:
    md = Metadata(run_id=1, message_id="m1", src_node_id=0, dst_node_id=7, reply_to_message_id="", group_id="g",
                  created_at=time.time(), ttl=ttl, message_type=message_type)
    return Message(content=content, metadata=md)


SITE: dict[str, str] = {}
"""The test's worker token and its file (:func:`site_token`)."""


@pytest.fixture(autouse=True)
def site_token(tmp_path):
    """Every test's site has a token file; :func:`serve`'s workers require its token."""
    path = tmp_path / "site" / "worker.token"
    SITE.update(file=str(path), token=write_token(path))
    yield SITE["token"]
    SITE.clear()


def serve(worker, address: str = "127.0.0.1:0"):
    return fake_worker.serve(worker, address, token=SITE["token"])


def context(address: str, agent: str = "alice", **config: str) -> Context:
    node_config = {"agent-name": agent, "worker-address": address, "worker-token-file": SITE["file"], **config}
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


@pytest.fixture
def worker(federation, site_token):
    w = FakeWorker("alice", federation.keys["alice"])
    server, address = serve(w)
    yield w, address
    server.stop(grace=0)


def test_generate_and_train_are_forwarded_to_the_worker(worker, plan):
    w, address = worker
    p = plan(step=2)
    reply = client_app.generate(message(records.generate_order(p.SerializeToString()), records.MSG_GENERATE),
                                context(address))
    assert not reply.has_error()
    site = records.read_reply(reply.content)
    assert site.agent == "alice" and site.metrics["time/generate_s"] == 0.001 and site.metrics["courier/worker_s"] > 0
    assert pb.RolloutBatch.FromString(pb.SignedEnvelope.FromString(site.envelope).payload).step == 2
    assert site.report is None and site.version

    table = pb.CapabilityTable(run_id=p.run_id, step=2, corrections=[pb.RewardCorrection(agent_id="bob")])
    order = records.train_order(p.SerializeToString(), table.SerializeToString(),
                                 {"alice": site.envelope, "bob": site.envelope}, checkpoint=True,
                                 next_plan=plan(step=3).SerializeToString())
    reply = client_app.train(message(order, records.MSG_TRAIN), context(address))
    assert not reply.has_error()
    site = records.read_reply(reply.content)
    assert pb.TrainReport.FromString(site.report).step == 2 and "time/checkpoint_s" in site.metrics
    assert pb.RolloutBatch.FromString(pb.SignedEnvelope.FromString(site.envelope).payload).step == 3
    assert site.generate_metrics == {"time/generate_s": 0.001}
    assert [c["rpc"] for c in w.calls] == ["Generate", "Train", "Checkpoint", "Generate"]
    assert w.calls[1] == {"rpc": "Train", "step": 2, "pool": ["alice", "alice"], "corrections": 1}


def test_failed_next_generate_still_returns_the_train_report(federation, plan):
    w = FakeWorker("alice", federation.keys["alice"], fail="Generate")
    server, address = serve(w)
    try:
        order = records.train_order(plan(step=1).SerializeToString(), b"", {}, next_plan=plan(step=2).SerializeToString())
        reply = client_app.train(message(order, records.MSG_TRAIN), context(address))
    finally:
        server.stop(grace=0)
    site = records.read_reply(reply.content)
    assert site.report is not None and site.envelope is None and "generation exploded" in site.generate_error


def test_worker_down_bad_order_and_worker_error_become_error_replies(worker, federation, plan):
    _, address = worker
    p = plan()
    down = client_app.generate(message(records.generate_order(p.SerializeToString()), records.MSG_GENERATE, ttl=7),
                               context("127.0.0.1:1"))
    assert down.has_error() and down.error.code == records.ERROR_WORKER_UNAVAILABLE
    assert "alice" in down.error.reason

    bad = client_app.train(message(RecordDict({"pool": ArrayRecord()}), records.MSG_TRAIN), context(address))
    assert bad.has_error() and bad.error.code == records.ERROR_BAD_ORDER

    failing = FakeWorker("alice", federation.keys["alice"], fail="Generate")
    server, addr2 = serve(failing)
    try:
        err = client_app.generate(message(records.generate_order(p.SerializeToString()), records.MSG_GENERATE),
                                  context(addr2))
    finally:
        server.stop(grace=0)
    assert err.has_error() and err.error.code == records.ERROR_WORKER
    assert "INTERNAL" in err.error.reason and "generation exploded" in err.error.reason


def test_calls_without_the_sites_worker_token_are_refused(worker, plan, tmp_path):
    """Issue 25 D3: the worker answers only calls carrying the site's token; the ClientApp reads it from the
    file its node config names (a missing, foreign or world-readable file is an error reply, not a crash)."""
    w, address = worker
    order = records.generate_order(plan().SerializeToString())
    other = tmp_path / "other.token"
    write_token(other)
    reply = client_app.generate(message(order, records.MSG_GENERATE), context(address, **{"worker-token-file":
                                                                                           str(other)}))
    assert reply.has_error() and reply.error.code == records.ERROR_WORKER
    assert "UNAUTHENTICATED" in reply.error.reason and "wrong worker token" in reply.error.reason
    reply = client_app.generate(message(order, records.MSG_GENERATE), context(address, **{"worker-token-file": ""}))
    assert reply.has_error() and "worker-token-file" in reply.error.reason
    other.chmod(0o644)
    reply = client_app.generate(message(order, records.MSG_GENERATE), context(address, **{"worker-token-file":
                                                                                           str(other)}))
    assert reply.has_error() and "accessible to other users" in reply.error.reason
    assert w.calls == []                                    # none of them reached the worker
    assert not client_app.generate(message(order, records.MSG_GENERATE), context(address)).has_error()


def test_evaluate_is_forwarded(worker, plan):
    _, address = worker
    req = wpb.EvaluateRequest(prompts=list(plan().prompts), samples=1)
    reply = client_app.evaluate(message(records.eval_order(req.SerializeToString()), records.MSG_EVALUATE),
                                context(address))
    site = records.read_reply(reply.content)
    assert wpb.EvaluateResponse.FromString(site.evaluation).metrics["problems"] == 3.0


def test_records_reject_wrong_types():
    with pytest.raises(records.ProtocolError, match="round-plan"):
        records.read_generate_order(RecordDict({"plan": ConfigRecord({"round-plan": "text, not bytes"})}))
    arr = records.envelope_array(b"abc")
    wrong = type(arr)(dtype="float32", shape=(3,), stype="numpy.ndarray", data=b"abc")
    with pytest.raises(records.ProtocolError, match="stype"):
        records.read_reply(RecordDict({"rollouts": ArrayRecord({"envelope": wrong})}))
    with pytest.raises(records.ProtocolError, match="agent-name"):
        records.read_reply(RecordDict({"site": ConfigRecord({"agent-name": 5})}))
    with pytest.raises(records.ProtocolError, match="train-report"):
        records.read_reply(RecordDict({"report": ConfigRecord({"train-report": "not bytes"})}))
    rd = records.train_order(b"p", b"t", {"a": b"1", "b": b"22"})
    assert records.read_train_order(rd) == records.TrainOrder(b"p", b"t", {"a": b"1", "b": b"22"})
    assert records.content_bytes(rd) > 3
    rd = records.train_order(b"p", b"t", {"a@3": b"1"}, peer_plans=[b"plan-3", b"plan-4"])
    assert records.read_train_order(rd).peer_plans == (b"plan-3", b"plan-4")
    with pytest.raises(records.ProtocolError, match="peer-round-plans"):
        records.read_train_order(records.train_order(b"p", b"t", {}, peer_plans=[b"x"] * (records.MAX_PEER_PLANS + 1)))
    rd["plan"]["peer-round-plans"] = ["text"]
    with pytest.raises(records.ProtocolError, match="peer-round-plans"):
        records.read_train_order(rd)


@pytest.mark.parametrize("module", ["hacrl_fed.flower.client_app", "hacrl_fed.flower.records",
                                    "hacrl_fed.site.courier"])
def test_the_client_app_records_and_courier_import_nothing_heavy(module):
    code = (f"import sys, {module}\n"
            "heavy = [m for m in ('torch', 'transformers', 'math_verify', 'pydantic', 'hacrl_fed.config', 'datasets')"
            " if m in sys.modules]\n"
            "assert not heavy, heavy")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_an_order_not_carried_out_is_one_line_on_the_sites_terminal(caplog):
    import logging

    from hacrl_fed.logs import LOG_FORMAT
    from hacrl_fed.site.watch import worker_line_visible

    with caplog.at_level(logging.ERROR, logger="hacrl_fed"):
        reply = client_app.generate(message(records.generate_order(b"x"), records.MSG_GENERATE), context("127.0.0.1:1"))
    assert reply.has_error()
    [record] = [r for r in caplog.records if r.name == "hacrl_fed.client_app"]
    line = logging.Formatter(LOG_FORMAT).format(record)
    assert worker_line_visible(line)  # the executor's output lines hacrl-fed client echoes
    assert "g query.generate of alice not carried out, the coordinator gets an error reply: bad order" in line


def test_a_failed_checkpoint_keeps_the_training_result(federation, plan):
    """The update was applied: the report goes back, with the checkpoint failure beside it."""
    w = FakeWorker("alice", federation.keys["alice"], fail="Checkpoint")
    server, address = serve(w)
    try:
        order = records.train_order(plan(step=1).SerializeToString(), b"", {}, checkpoint=True,
                                     next_plan=plan(step=2).SerializeToString())
        reply = client_app.train(message(order, records.MSG_TRAIN), context(address))
    finally:
        server.stop(grace=0)
    assert not reply.has_error()
    site = records.read_reply(reply.content)
    assert pb.TrainReport.FromString(site.report).step == 1 and "No space left" in site.checkpoint_error
    assert site.envelope is not None            # and it still generated for the next step


def test_notices_deadlines_and_the_checkpoint_interval_reach_the_worker(worker, plan):
    w, address = worker
    p = plan(step=1)
    gen = records.generate_order(p.SerializeToString(), notice="step 0: your batch was not pooled (bad_signature)")
    assert not client_app.generate(message(gen, records.MSG_GENERATE), context(address)).has_error()
    order = records.train_order(p.SerializeToString(), b"", {}, checkpoint_every=4, notice="hello")
    before = time.time()
    assert not client_app.train(message(order, records.MSG_TRAIN, ttl=60), context(address)).has_error()
    generate, train = w.requests
    assert generate.notice == "step 0: your batch was not pooled (bad_signature)"
    assert train.notice == "hello" and train.checkpoint_every == 4 and train.HasField("checkpoint_every")
    assert before + 60 - client_app.REPLY_MARGIN_S - 2 < train.deadline_unix_s <= time.time() + 60
    plain = records.train_order(p.SerializeToString(), b"", {})
    client_app.train(message(plain, records.MSG_TRAIN), context(address))
    assert not w.requests[-1].HasField("checkpoint_every")


def test_peer_plans_of_an_async_train_order_reach_the_worker(worker, plan):
    """The ClientApp turns the order's ``peer-round-plans`` into ``TrainRequest.peer_plans``, in order."""
    w, address = worker
    own, peers = plan(step=3), [plan(step=1), plan(step=2)]
    order = records.train_order(own.SerializeToString(), b"", {},
                                peer_plans=[p.SerializeToString() for p in peers])
    assert not client_app.train(message(order, records.MSG_TRAIN), context(address)).has_error()
    train = w.requests[-1]
    assert train.step == 3 and list(train.peer_plans) == peers
    client_app.train(message(records.train_order(own.SerializeToString(), b"", {}), records.MSG_TRAIN),
                     context(address))
    assert not w.requests[-1].peer_plans                    # a synchronous order carries none
    bad = records.train_order(own.SerializeToString(), b"", {}, peer_plans=[b"\xff not a plan"])
    reply = client_app.train(message(bad, records.MSG_TRAIN), context(address))
    assert reply.has_error() and "peer-round-plans[0]" in reply.error.reason


def test_a_non_string_notice_is_a_bad_order(worker, plan):
    _, address = worker
    content = records.generate_order(plan().SerializeToString())
    content["plan"]["notice"] = 5
    reply = client_app.generate(message(content, records.MSG_GENERATE), context(address))
    assert reply.has_error() and reply.error.code == records.ERROR_BAD_ORDER
