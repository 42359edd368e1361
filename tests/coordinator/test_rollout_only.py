"""A rollout-only agent (roster ``role = "rollout_only"``): pooled, re-verified and counted in the capability
statistics like any agent, never sent a train order (the in-process transport, no Flower processes)."""

from __future__ import annotations

import json

import pytest

from fedutil import boxed_verify, problems
from hacrl_fed.config import DataConfig, RunConfig
from hacrl_fed.coordinator.rounds import Setup, rollout_only, run_coordinator
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.protocol.keys import Roster, RosterError, public_key_b64, roster_entry_toml
from inprocess import FakeSite, InProcessTransport


def roster_with_role(federation, tmp_path, role_of: dict[str, str]) -> Roster:
    text = "\n".join(roster_entry_toml(a, public_key_b64(federation.roster[a]), None, role_of.get(a, "learner"))
                     for a in federation.roster)
    path = tmp_path / "roster.toml"
    path.write_text(text)
    return Roster.load(path)


def test_roster_role_is_parsed_and_checked(federation, tmp_path):
    roster = roster_with_role(federation, tmp_path, {"carol": "rollout_only"})
    assert roster.rollout_only("carol") and not roster.rollout_only("alice") and not roster.rollout_only("nobody")
    assert rollout_only(roster, "carol") and not rollout_only({"carol": None}, "carol")
    bad = (tmp_path / "roster.toml").read_text().replace('"rollout_only"', '"trainer"')
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(RosterError, match="role: expected one of learner, rollout_only"):
        Roster.load(tmp_path / "bad.toml")


def carol_rollout_only_setup(federation, tmp_path, *, steps: int, held_out=(), **run_kw) -> Setup:
    """A coordinator set-up whose roster lists carol as rollout-only (alice and bob learn); ``run_kw`` go to
    :class:`RunConfig`, ``held_out`` problems make it evaluate."""
    roster = roster_with_role(federation, tmp_path, {"carol": "rollout_only"})
    run = RunConfig(run_id="run-r", steps=steps, prompts_per_step=2, samples_per_prompt=2, min_agents=2,
                    data=DataConfig(num_problems=20, eval_size=len(held_out)), max_batch_bytes=64 * 1024,
                    join_timeout_s=0, **run_kw)
    return Setup(run=run, roster=roster, verify=boxed_verify,
                 sampler=PromptSampler(problems(20), batch_size=2, seed=0), run_dir=tmp_path / "run",
                 held_out=list(held_out), sleep=lambda s: None)


def test_a_rollout_only_agent_is_pooled_and_never_trained(tmp_path, federation):
    setup = carol_rollout_only_setup(federation, tmp_path, steps=3)
    k = federation.keys
    alice, bob, carol = FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]), FakeSite("carol", k["carol"])
    transport = InProcessTransport([alice, bob, carol])
    run_coordinator(setup, transport)
    assert carol.trained == [] and carol.generated == [1, 2, 3]          # asked to generate every step, never to train
    assert not any(kind == "train" and site == "carol" for ex in transport.exchanges for kind, site in ex)
    for site in (alice, bob):
        assert [s for s, _, _ in site.trained] == [1, 2, 3]
        assert all(pool == ["alice", "bob", "carol"] for _, pool, _ in site.trained)   # its rows are in the pool
    steps = [json.loads(line) for line in setup.metrics_path.read_text().splitlines()]
    steps = [r for r in steps if r["event"] == "step"]
    for r in steps:
        c = r["agents"]["carol"]
        assert c["status"] == "contributed" and c["rows_accepted"] == 4 and "carol" in r["participants"]
        assert c["accuracy"] is not None and c["capability"] is not None   # re-verified, in the capability table


@pytest.mark.parametrize("named", [True, False])
def test_a_rollout_only_agent_is_never_sent_a_held_out_evaluation(tmp_path, federation, named):
    """It has no weights to evaluate (its site refuses the order): the coordinator does not ask it. A registered
    node is known by its name; an unnamed one once its batch was verified here (so only the evaluation before
    the first step reaches it, and is refused there)."""
    setup = carol_rollout_only_setup(federation, tmp_path, steps=2, held_out=problems(2, offset=50), eval_every=1)
    k = federation.keys
    transport = InProcessTransport([FakeSite(a, k[a]) for a in ("alice", "bob", "carol")], named=named)
    run_coordinator(setup, transport)
    evaluated = [[site for kind, site in ex if kind == "evaluate"] for ex in transport.exchanges]
    evaluated = [sites for sites in evaluated if sites]
    assert len(evaluated) == 3                                            # before step 1, after steps 1 and 2
    assert all({"alice", "bob"} <= set(sites) for sites in evaluated)
    asked = [i for i, sites in enumerate(evaluated) if "carol" in sites]
    assert asked == ([] if named else [0]), evaluated
