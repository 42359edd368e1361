"""The coordinator's record agrees with each site's weights, and every site is told what happened to it:
checkpoint failures after an applied update, roll-backs to an older checkpoint, steps trained after the
coordinator gave up or crashed, rejected batches, skipped steps and failed trainings."""

from __future__ import annotations

import json

import pytest

from fedutil import boxed_verify, problems
from hacrl_fed.config import DataConfig, RunConfig
from hacrl_fed.coordinator.rounds import Setup, run_coordinator
from hacrl_fed.data.sampler import PromptSampler
from inprocess import FakeSite, HostileSite, InProcessTransport


def make_setup(tmp_path, federation, *, steps=3, **run_kw) -> Setup:
    run = RunConfig(run_id="run-acc", steps=steps, prompts_per_step=2, samples_per_prompt=2,
                    data=DataConfig(num_problems=20, eval_size=0), max_batch_bytes=64 * 1024, join_timeout_s=0,
                    **({"min_agents": 2} | run_kw))
    return Setup(run=run, roster=federation.roster, verify=boxed_verify,
                 sampler=PromptSampler(problems(20), batch_size=2, seed=0), run_dir=tmp_path / "run",
                 sleep=lambda s: None)


def steps_of(setup) -> list[dict]:
    return [r for r in map(json.loads, setup.metrics_path.read_text().splitlines()) if r["event"] == "step"]


def totals(setup) -> dict:
    return json.loads(setup.state_path.read_text())["totals"]


def honest(federation, *names):
    return [FakeSite(n, federation.keys[n]) for n in names]


def test_a_failed_checkpoint_after_an_applied_update_counts_as_trained(tmp_path, federation):
    alice, bob = honest(federation, "alice", "bob")
    alice.checkpoint_error = "worker Checkpoint: INTERNAL: OSError: [Errno 28] No space left on device"
    setup = make_setup(tmp_path, federation, steps=2, checkpoint_every=1)
    run_coordinator(setup, InProcessTransport([alice, bob]))
    for rec in steps_of(setup):
        a = rec["agents"]["alice"]
        assert a["status"] == "trained" and "No space left" in a["detail"]
    assert totals(setup)["alice"]["steps_trained"] == 2


def test_a_roll_back_is_found_reported_and_counted(tmp_path, federation, caplog):
    alice, bob = honest(federation, "alice", "bob")
    setup = make_setup(tmp_path, federation, steps=5)
    transport = InProcessTransport([alice, bob])
    transport.fail_after_train_at = 3              # alice and bob trained steps 1..3; the coordinator dies
    with pytest.raises(KeyboardInterrupt):
        run_coordinator(setup, transport)
    alice.weights_step = 1                          # alice restarts from her checkpoint of step 1
    transport.fail_after_train_at = None
    with caplog.at_level("WARNING", logger="hacrl_fed.coordinator"):
        run_coordinator(make_setup(tmp_path, federation, steps=5), transport)
    recs = {r["step"]: r for r in steps_of(setup)}
    assert recs[3]["interrupted"] and recs[3]["trained"] is False
    assert recs[3]["agents"]["alice"]["status"] == "interrupted"
    assert recs[4]["agents"]["alice"]["rolled_back_steps"] == [2]          # step 3 was never recorded as trained
    assert recs[4]["agents"]["bob"]["late_trained_steps"] == [3]           # bob did train the interrupted step
    assert recs[4]["agents"]["alice"]["late_trained_steps"] == []
    t = totals(setup)
    assert t["alice"]["steps_trained"] == 1 + 2          # steps 1 and 2 recorded, 2 lost, then 4 and 5
    assert t["alice"]["steps_rolled_back"] == 1
    assert t["bob"]["steps_trained"] == 2 + 1 + 2 and t["bob"]["steps_trained_late"] == 1
    assert any("lost to a roll-back" in r.getMessage() for r in caplog.records)
    state = json.loads(setup.state_path.read_text())
    assert state["trained_steps"]["alice"] == [1, 4, 5] and state["trained_steps"]["bob"] == [1, 2, 3, 4, 5]


def test_an_interrupted_step_no_site_trained_stays_not_trained(tmp_path, federation):
    alice, bob = honest(federation, "alice", "bob")
    setup = make_setup(tmp_path, federation, steps=3)
    transport = InProcessTransport([alice, bob])
    transport.fail_train_at = 2
    with pytest.raises(KeyboardInterrupt):
        run_coordinator(setup, transport)
    transport.fail_train_at = None
    run_coordinator(make_setup(tmp_path, federation, steps=3), transport)
    recs = {r["step"]: r for r in steps_of(setup)}
    assert recs[2]["trained"] is False and recs[2]["interrupted"]
    assert recs[3]["agents"]["alice"]["late_trained_steps"] == [] == recs[3]["agents"]["alice"]["rolled_back_steps"]
    assert totals(setup)["alice"]["steps_trained"] == 2
    end = json.loads(setup.metrics_path.read_text().splitlines()[-1])
    assert end["skipped_steps"] == 1


def test_a_site_that_was_not_sent_a_step_is_never_counted_for_it(tmp_path, federation):
    """A site whose reported weights lag because it was excluded is not a roll-back."""
    k = federation.keys
    alice, bob = honest(federation, "alice", "bob")
    mallory = HostileSite("mallory", k["mallory"], cases=("tampered",))
    setup = make_setup(tmp_path, federation, steps=3)
    run_coordinator(setup, InProcessTransport([alice, bob, mallory]))
    assert "steps_rolled_back" not in totals(setup).get("mallory", {})
    assert all(r["agents"]["mallory"]["rolled_back_steps"] == [] for r in steps_of(setup))


def test_every_site_is_told_why_it_was_left_out(tmp_path, federation):
    k = federation.keys
    alice, bob = honest(federation, "alice", "bob")
    mallory = HostileSite("mallory", k["mallory"], cases=("tampered", "wrong_run", "nan_reward"))
    setup = make_setup(tmp_path, federation, steps=4)
    run_coordinator(setup, InProcessTransport([alice, bob, mallory]))
    assert len(mallory.notices) == 3                               # after steps 1..3; step 4 had no next order
    assert mallory.notices[0].startswith("step 1: your batch was not pooled (bad_signature)")
    assert mallory.notices[1].startswith("step 2: your batch was not pooled (wrong_run)")
    assert mallory.notices[2].startswith("step 3: your batch was not pooled (bad_reward)")
    assert alice.notices == [] and bob.notices == []


def test_sites_are_told_when_their_step_was_skipped(tmp_path, federation):
    alice, bob = honest(federation, "alice", "bob")
    bob.silent = True
    setup = make_setup(tmp_path, federation, steps=2)
    run_coordinator(setup, InProcessTransport([alice, bob]))
    assert alice.notices == ["step 1: step skipped: 1 valid batch(es), the coordinator needs 2"]


def test_a_recorded_train_failure_is_told_to_the_site(tmp_path, federation):
    class BadReport(FakeSite):
        def train(self, order):
            reply = super().train(order)
            reply.report = b"\xff not a report"
            return reply

    alice, bob = BadReport("alice", federation.keys["alice"]), FakeSite("bob", federation.keys["bob"])
    setup = make_setup(tmp_path, federation, steps=3)
    run_coordinator(setup, InProcessTransport([alice, bob]))
    assert alice.notices[:2] == ["step 1: your training was recorded as failed: unreadable TrainReport",
                                 "step 2: your training was recorded as failed: unreadable TrainReport"]
