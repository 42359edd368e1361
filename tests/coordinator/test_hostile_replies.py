"""No reply can stop the coordinator or grow what it stores, and train orders follow the node that
delivered the verified batch: hostile metrics (NaN, inf, huge, malformed), oversized text and reports,
missing replies, and nodes that claim another agent's name."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from fedutil import boxed_verify, problems
from hacrl_fed.config import DataConfig, RunConfig
from hacrl_fed.coordinator.rounds import Node, Reply, Setup, run_coordinator
from hacrl_fed.coordinator.step_record import collect_batches
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hostile import envelope_bytes, honest_batch
from inprocess import FakeSite, HostileSite, InProcessTransport

NAN_METRICS = {"loss": math.nan, "time/total_s": math.inf, "courier/worker_s": -math.inf, "huge": 1e300,
               "tokens": 3.0}


def make_setup(tmp_path, federation, *, steps=2, held_out=(), **run_kw) -> Setup:
    run = RunConfig(run_id="run-h", steps=steps, prompts_per_step=2, samples_per_prompt=2, min_agents=2,
                    data=DataConfig(num_problems=20, eval_size=0), max_batch_bytes=64 * 1024, join_timeout_s=0,
                    **run_kw)
    return Setup(run=run, roster=federation.roster, verify=boxed_verify,
                 sampler=PromptSampler(problems(20), batch_size=2, seed=0), run_dir=tmp_path / "run",
                 held_out=list(held_out), sleep=lambda s: None)


def strict_lines(path) -> list[dict]:
    """Every line of a JSON-lines file, refusing NaN/Infinity (strict JSON)."""
    def no_constants(name):
        raise AssertionError(f"non-finite number {name} stored in {path}")

    return [json.loads(line, parse_constant=no_constants) for line in path.read_text().splitlines()]


def strict_state(setup) -> dict:
    def no_constants(name):
        raise AssertionError(f"non-finite number {name} in state.json")

    return json.loads(setup.state_path.read_text(), parse_constant=no_constants)


class Tampering(InProcessTransport):
    """Replies of the chosen sites are altered after they are unpacked (any transport could deliver them)."""

    def __init__(self, sites, alter, **kw) -> None:
        super().__init__(sites, **kw)
        self.alter = alter

    def exchange(self, orders, timeout_s):
        out = super().exchange(orders, timeout_s)
        for nid, reply in list(out.items()):
            name = self.sites[nid].name
            if name in self.alter:
                out[nid] = self.alter[name](reply)
        return out


def _with_site(reply, **fields):
    return dataclasses.replace(reply, site=dataclasses.replace(reply.site, **fields))


def fleet(federation, *, mallory_cases=("tampered",)):
    k = federation.keys
    return [FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]),
            HostileSite("mallory", k["mallory"], cases=tuple(mallory_cases))]


@pytest.mark.parametrize("who", ["mallory", "alice"])
def test_nan_and_inf_metrics_never_stop_the_coordinator(tmp_path, federation, who):
    """A rejected node (mallory) or a participant (alice) sends non-finite metrics in every reply part."""
    alter = {who: lambda r: _with_site(r, metrics=dict(NAN_METRICS), generate_metrics=dict(NAN_METRICS))}
    setup = make_setup(tmp_path, federation, steps=3)
    state = run_coordinator(setup, Tampering(fleet(federation), alter))
    assert state.step == 3
    records = strict_lines(setup.metrics_path)
    steps = [r for r in records if r["event"] == "step"]
    assert [r["trained"] for r in steps] == [True, True, True]
    gen = steps[0]["agents"][who]["generate"]
    assert gen == {"huge": 1e300, "tokens": 3.0} or gen == {"tokens": 3.0}
    assert all(math.isfinite(r["timing"]["overhead_s"]) for r in steps)
    strict_state(setup)
    # a restart reads that state and goes on, and the node keeps sending the same
    setup2 = make_setup(tmp_path, federation, steps=4)
    assert run_coordinator(setup2, Tampering(fleet(federation), alter)).step == 4
    strict_state(setup2)


def test_pending_state_with_site_numbers_is_written_and_read_back(tmp_path, federation):
    """The state saved before the train phase holds the step's record: a crash there must leave a state
    that loads, whatever the sites reported."""
    alter = {"alice": lambda r: _with_site(r, metrics={"loss": math.nan, "x": math.inf})}
    setup = make_setup(tmp_path, federation, steps=2)
    transport = Tampering(fleet(federation), alter)
    transport.fail_train_at = 1
    with pytest.raises(KeyboardInterrupt):
        run_coordinator(setup, transport)
    assert strict_state(setup)["pending"]["step"] == 1
    transport.fail_train_at = None
    assert run_coordinator(make_setup(tmp_path, federation, steps=2), transport).step == 2


@pytest.mark.parametrize("alteration", [
    "malformed_metrics", "bool_and_list_values", "thousands_of_metrics", "giant_keys", "huge_error",
    "huge_agent_name", "envelope_not_bytes", "negative_byte_counts", "no_reply_at_all"])
def test_malformed_replies_are_bounded(tmp_path, federation, alteration):
    big = {f"m{i}": float(i) for i in range(5000)}
    alterations = {
        "malformed_metrics": lambda r: _with_site(r, metrics={1: 2.0, None: 1.0, "ok": "text", "\x1b[2J": 1.0}),
        "bool_and_list_values": lambda r: _with_site(r, metrics={"a": True, "b": [1.0], "c": {"d": 1}}),
        "thousands_of_metrics": lambda r: _with_site(r, metrics=big, generate_metrics=big),
        "giant_keys": lambda r: _with_site(r, metrics={"k" * 100_000: 1.0}),
        "huge_error": lambda r: dataclasses.replace(r, error="\x1b[31m" + "E" * 1_000_000),
        "huge_agent_name": lambda r: _with_site(r, agent="alice" * 100_000, version="v" * 100_000),
        "envelope_not_bytes": lambda r: _with_site(r, envelope="not bytes", report=12),
        "negative_byte_counts": lambda r: dataclasses.replace(r, bytes_in=-5, bytes_out=math.nan),
        "no_reply_at_all": None,
    }
    transport = Tampering(fleet(federation), {} if alteration == "no_reply_at_all" else
                          {"mallory": alterations[alteration]})
    if alteration == "no_reply_at_all":
        base = transport.exchange
        transport.exchange = lambda orders, t: {k: v for k, v in base(orders, t).items()
                                               if transport.sites[k].name != "mallory"}
    setup = make_setup(tmp_path, federation, steps=2)
    assert run_coordinator(setup, transport).step == 2
    for line in setup.metrics_path.read_text().splitlines():
        assert len(line) < 64 * 1024 and "\x1b" not in line
    records = strict_lines(setup.metrics_path)
    mallory = [r["agents"]["mallory"] for r in records if r["event"] == "step"]
    assert all(m["status"] in ("rejected", "error", "timeout") for m in mallory)
    assert all(len(m["generate"]) <= 128 and len(m["detail"]) <= 600 for m in mallory)
    assert len(setup.state_path.read_text()) < 64 * 1024
    strict_state(setup)


class Reporter(FakeSite):
    """An honest batch, but a TrainReport with thousands of sources, NaN metrics and long lines."""

    def train(self, order):
        reply = super().train(order)
        plan = pb.RoundPlan.FromString(order.plan)
        report = pb.TrainReport(run_id=plan.run_id, step=plan.step, agent_id=self.name,
                                rejected=["\x1b[2J" + "r" * 10_000] * 1000)
        for i in range(3000):
            report.per_source.add(source_agent=f"ghost{i}", metrics={"rows": math.nan, f"k{i}": 1.0})
        report.per_source.add(source_agent="alice", metrics={"rows": 4.0, "nan": math.nan})
        reply.report = report.SerializeToString()
        return reply


def test_a_report_with_thousands_of_sources_is_bounded(tmp_path, federation):
    k = federation.keys
    sites = [Reporter("alice", k["alice"]), FakeSite("bob", k["bob"])]
    setup = make_setup(tmp_path, federation, steps=2)
    run_coordinator(setup, InProcessTransport(sites))
    steps = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"]
    alice = steps[-1]["agents"]["alice"]
    assert alice["status"] == "trained"
    assert alice["per_source"] == {"alice": {"rows": 4.0}}           # only the pool's agents, finite values
    assert len(alice["train_rejected"]) <= 50 and all(len(x) <= 500 and "\x1b" not in x
                                                      for x in alice["train_rejected"])
    assert max(len(line) for line in setup.metrics_path.read_text().splitlines()) < 64 * 1024


def test_eval_metrics_are_bounded(tmp_path, federation):
    k = federation.keys

    class Evaluator(FakeSite):
        pass

    sites = [Evaluator("alice", k["alice"]), FakeSite("bob", k["bob"])]
    transport = InProcessTransport(sites)
    serve = transport._serve

    def hostile_eval(site, kind, content):
        if kind == "evaluate" and site.name == "alice":
            res = wpb.EvaluateResponse(metrics={"avg@1": math.nan, **{f"e{i}": 1.0 for i in range(3000)}})
            return SiteReply(agent="alice", evaluation=res.SerializeToString())
        return serve(site, kind, content)

    transport._serve = hostile_eval
    setup = make_setup(tmp_path, federation, steps=1, held_out=problems(2, offset=50))
    run_coordinator(setup, transport)
    evals = [r for r in strict_lines(setup.metrics_path) if r["event"] == "eval"]
    assert evals and all(len(e["agents"]["alice"]) <= 128 and "avg@1" not in e["agents"]["alice"] for e in evals)


# --------------------------------------------------------------------------- names and orders


class Impostor(FakeSite):
    """Reports another agent's name; delivers its own (mallory-signed) batch."""

    signer: str = "mallory"

    def generate(self, plan):
        self.generated.append(plan.step)
        return envelope_bytes(honest_batch(plan, self.signer), self.keys.own)


def test_a_node_claiming_another_agents_name_never_gets_its_train_orders(tmp_path, federation, caplog):
    """Insecure deployment (unnamed nodes): the impostor's node sorts first and says it is alice; its batch is
    signed by mallory, so alice's own node holds the name and the impostor is refused alone."""
    k = federation.keys
    impostor = Impostor("alice", k["mallory"])
    alice, bob, carol = FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]), FakeSite("carol", k["carol"])
    setup = make_setup(tmp_path, federation, steps=2)
    with caplog.at_level("WARNING", logger="hacrl_fed.coordinator"):
        run_coordinator(setup, InProcessTransport([impostor, alice, bob, carol], named=False))
    assert impostor.trained == []                       # never the pool, never alice's orders
    for site in (alice, bob, carol):
        assert [s for s, *_ in site.trained] == [1, 2]
    steps = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"]
    for r in steps:
        assert r["participants"] == ["alice", "bob", "carol"]
        assert r["agents"]["alice"]["node_id"] == 2 and r["agents"]["alice"]["status"] == "trained"
        assert r["agents"]["alice@1"]["reason"] == "agent_mismatch"
    assert any("node 1 claims agent 'alice' without a batch signed by its roster key" in rec.getMessage()
               for rec in caplog.records)
    assert impostor.notices and "not pooled (agent_mismatch)" in impostor.notices[0]


class Garbage(FakeSite):
    """Says it is ``name`` and delivers bytes that are no envelope."""

    def generate(self, plan):
        self.generated.append(plan.step)
        return b"\x0a\xff\xff\xff\xff\x0fnot a protobuf"


def test_a_name_claimed_with_garbage_does_not_block_the_real_agent(tmp_path, federation):
    """Issue 25 D4: without node authentication an unnamed node claims alice and delivers garbage, and
    min_agents is the number of honest sites. The node whose batch alice's roster key signed is alice; the
    claimant alone is refused (told why), and no step is skipped."""
    k = federation.keys
    fake = Garbage("alice", k["mallory"])
    honest = [FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]), FakeSite("carol", k["carol"])]
    setup = make_setup(tmp_path, federation, steps=3)
    setup.run = setup.run.model_copy(update={"min_agents": 3})
    run_coordinator(setup, InProcessTransport([fake, *honest], named=False))
    steps = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"]
    assert [r["trained"] for r in steps] == [True, True, True]
    assert all(r["participants"] == ["alice", "bob", "carol"] for r in steps)
    assert all(r["agents"]["alice@1"]["status"] == "rejected" and r["agents"]["alice@1"]["reason"] == "malformed"
               for r in steps)
    assert [s for s, *_ in honest[0].trained] == [1, 2, 3] and fake.trained == []
    assert len(fake.notices) == 2 and all("not pooled (malformed)" in n for n in fake.notices)
    assert not honest[0].notices


def test_two_verified_batches_for_one_name_stay_duplicate(federation, plan):
    """Two nodes delivering batches that alice's key signed (a copied key): neither is pooled; a third claim
    without her signature keeps its own reason."""
    p = plan()
    good = envelope_bytes(honest_batch(p, "alice"), federation.keys["alice"].own)
    nodes = [Node(1, ""), Node(2, ""), Node(3, ""), Node(4, "")]
    replies = {1: Reply(1, SiteReply(agent="alice", envelope=good)), 2: Reply(2, SiteReply(agent="alice", envelope=good)),
               3: Reply(3, SiteReply(agent="alice", envelope=b"junk")),
               4: Reply(4, SiteReply(agent="bob", envelope=envelope_bytes(honest_batch(p, "bob"),
                                                                        federation.keys["bob"].own)))}
    accepted, agents = collect_batches(nodes, replies, federation.roster, p, max_bytes=64 * 1024, timeout_s=1)
    assert [a.agent for a in accepted] == ["bob"]
    assert {n: a.reason for n, a in agents.items()} == {"alice@1": "duplicate_agent", "alice@2": "duplicate_agent",
                                                         "alice@3": "malformed", "bob": ""}
    assert "nodes 1, 2" in agents["alice@1"].detail


def test_a_node_relaying_another_agents_envelope_never_gets_its_orders(tmp_path, federation):
    """An unnamed node that names no one and delivers bob's own signed batch ahead of bob."""
    k = federation.keys
    relay = Impostor("", k["bob"])
    relay.signer = "bob"
    alice, bob, carol = FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]), FakeSite("carol", k["carol"])
    setup = make_setup(tmp_path, federation, steps=1)
    run_coordinator(setup, InProcessTransport([relay, alice, bob, carol], named=False))
    assert relay.trained == [] and bob.trained == []
    step = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"][0]
    assert step["participants"] == ["alice", "carol"]
    assert step["agents"]["bob@1"]["reason"] == step["agents"]["bob@3"]["reason"] == "duplicate_agent"


def test_orders_go_to_the_delivering_node_when_names_are_unique(tmp_path, federation):
    """Unnamed nodes in any order: each agent's train order reaches the node that delivered its batch."""
    k = federation.keys
    sites = [FakeSite("carol", k["carol"]), FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"])]
    setup = make_setup(tmp_path, federation, steps=2)
    run_coordinator(setup, InProcessTransport(sites, named=False))
    for s in sites:
        assert [step for step, *_ in s.trained] == [1, 2]
    step = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"][0]
    assert {a: step["agents"][a]["node_id"] for a in ("carol", "alice", "bob")} == {"carol": 1, "alice": 2, "bob": 3}


class PerfectEvaluator(Impostor):
    """Claims alice (mallory-signed batches) and reports perfect held-out scores as alice."""

    def evaluate(self) -> SiteReply:
        res = wpb.EvaluateResponse(metrics={"avg@1": 1.0, "problems": 2.0})
        return SiteReply(agent="alice", evaluation=res.SerializeToString())


def _perfect_evals(transport):
    serve = transport._serve

    def hostile_eval(site, kind, content):
        if kind == "evaluate" and isinstance(site, PerfectEvaluator):
            return site.evaluate()
        return serve(site, kind, content)

    transport._serve = hostile_eval
    return transport


def test_eval_replies_count_only_from_the_node_holding_the_agents_identity(tmp_path, federation):
    """Both nodes say alice in every reply; the evaluations are filed under alice only from the node that
    delivered alice's verified batch (also the one before the first step, attributed after it)."""
    k = federation.keys
    sites = [PerfectEvaluator("alice", k["mallory"]), FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"])]
    setup = make_setup(tmp_path, federation, steps=2, held_out=problems(2, offset=50))
    run_coordinator(setup, _perfect_evals(InProcessTransport(sites, named=False)))
    lines = strict_lines(setup.metrics_path)
    evals = [r for r in lines if r["event"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert set(e["agents"]) == {"alice", "unverified@1", "bob"}
        assert e["agents"]["alice"]["avg@1"] == 0.25 and e["agents"]["unverified@1"]["avg@1"] == 1.0
    assert [r["event"] for r in lines][:3] == ["run_start", "eval", "step"]   # the first eval still comes first
    assert strict_state(setup)["last_eval_step"] == 2


def test_an_unnamed_node_claiming_an_absent_agent_is_not_evaluated_as_it(tmp_path, federation):
    """Issue 25 D7: the real alice is not there; a node that says alice records perfect held-out scores. They
    are never filed under alice."""
    k = federation.keys
    sites = [PerfectEvaluator("alice", k["mallory"]), FakeSite("bob", k["bob"]), FakeSite("carol", k["carol"])]
    setup = make_setup(tmp_path, federation, steps=2, held_out=problems(2, offset=50))
    run_coordinator(setup, _perfect_evals(InProcessTransport(sites, named=False)))
    evals = [r for r in strict_lines(setup.metrics_path) if r["event"] == "eval"]
    assert evals and all(set(e["agents"]) == {"unverified@1", "bob", "carol"} for e in evals)
    steps = [r for r in strict_lines(setup.metrics_path) if r["event"] == "step"]
    assert all(r["participants"] == ["bob", "carol"] for r in steps)


def test_registered_nodes_are_evaluated_under_their_registered_name(tmp_path, federation):
    """SuperNode authentication: a node's registered name is its verified identity, before any batch too."""
    sites = [FakeSite("alice", federation.keys["alice"]), FakeSite("bob", federation.keys["bob"])]
    setup = make_setup(tmp_path, federation, steps=1, held_out=problems(2, offset=50))
    run_coordinator(setup, InProcessTransport(sites))
    lines = strict_lines(setup.metrics_path)
    assert [r["event"] for r in lines][:3] == ["run_start", "eval", "step"]
    assert all(set(r["agents"]) == {"alice", "bob"} for r in lines if r["event"] == "eval")
