"""Asynchronous rounds (``run.mode = "async"``) over an in-process transport: a slow site does not hold the others,
late batches of older plans reach the learners with their plans, stale rows are dropped and counted, a silent site
and a coordinator restart do not stall the run."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fedutil import boxed_verify, problems
from hacrl_fed.config import DataConfig, RunConfig
from hacrl_fed.async_rounds.pool import AsyncPool, PooledBatch, staleness
from hacrl_fed.async_rounds.loop import run_async
from hacrl_fed.coordinator.rounds import Setup, run_coordinator
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.v1 import rollout_pb2 as pb
from inprocess import FakeSite, InProcessTransport


def make_setup(tmp_path, federation, *, steps=4, **run_kw) -> Setup:
    run = RunConfig(run_id="async-run", steps=steps, prompts_per_step=2, samples_per_prompt=2, min_agents=2,
                    data=DataConfig(num_problems=200, eval_size=0), max_batch_bytes=64 * 1024, join_timeout_s=0,
                    mode="async", **run_kw)
    sampler = PromptSampler(problems(200), batch_size=run.prompts_per_step, seed=run.seed)
    return Setup(run=run, roster={k: v for k, v in federation.roster.items() if k in ("alice", "bob", "carol")},
                 verify=boxed_verify, sampler=sampler, run_dir=tmp_path / "run", poll_s=0.005)


def read(setup: Setup, event: str) -> list[dict]:
    lines = [json.loads(line) for line in setup.metrics_path.read_text().splitlines()]
    return [r for r in lines if r.get("event") == event]


class Restarting(FakeSite):
    """Restarts from the checkpoint of its first update once it has made two."""

    def generate(self, plan):
        if len(self.trained) == 2 and not getattr(self, "restarted", False):
            self.restarted = True
            self.weights_step = self.trained[0][0]     # back to the checkpoint of its first update
        return super().generate(plan)


def fleet(federation, *, slow=0.4, fast=0.1):
    k = federation.keys
    return [FakeSite("alice", k["alice"], delay_s=fast), FakeSite("bob", k["bob"], delay_s=fast),
            FakeSite("carol", k["carol"], delay_s=slow)]


# ------------------------------------------------------------------------------------------------ the pool


def batch(agent, step, version, at=0.0, rows=4):
    return PooledBatch(agent, step, version, at, f"env-{agent}-{step}".encode(), b"plan", rows)


def test_staleness_counts_the_source_updates_after_the_generating_version():
    assert staleness(3, [1, 2, 3]) == 0
    assert staleness(3, [1, 2, 3, 5, 8]) == 2
    assert staleness(0, []) == 0


def test_the_pool_delivers_each_batch_once_and_drops_stale_ones_with_the_reason():
    pool = AsyncPool(max_staleness=1, max_age_s=100.0)
    pool.add(batch("bob", 2, version=1, at=0.0))          # bob trained 3 and 4 since: 2 updates > 1
    pool.add(batch("bob", 4, version=3, at=0.0))          # 1 update since: delivered
    pool.add(batch("carol", 1, version=0, at=-200.0))     # accepted 200 s ago > 100 s
    pool.add(batch("carol", 3, version=1, at=50.0))
    trained = {"bob": [1, 3, 4], "carol": [1]}
    got = pool.take("alice", trained=trained, now=100.0, learners={"alice", "bob", "carol"})
    assert [b.key for b in got.batches] == ["bob@4", "carol@3"]
    assert got.staleness == [1, 0]
    assert got.dropped == Counter({("bob", "versions"): 4, ("carol", "age"): 4})
    assert got.rows == 8 and got.dropped_rows == 8
    again = pool.take("alice", trained=trained, now=100.0, learners={"alice", "bob", "carol"})
    assert again.batches == [] and not again.dropped          # nothing twice
    # bob has not had carol's batches yet, carol not bob's: kept; a learner never gets its own batch
    got_bob = pool.take("bob", trained=trained, now=100.0, learners={"alice", "bob", "carol"})
    assert [b.key for b in got_bob.batches] == ["carol@3"]
    assert {b.key for b in pool.batches} == {"bob@2", "bob@4"}   # carol's: had by everyone else, forgotten


def test_the_pool_is_bounded_and_rejects_bad_bounds():
    pool = AsyncPool(max_staleness=0, max_age_s=10.0, max_batches=2)
    for step in (1, 2, 3):
        pool.add(batch("bob", step, version=step - 1))
    assert [b.step for b in pool.batches] == [2, 3] and pool.evicted == 1
    for bad in ({"max_staleness": -1, "max_age_s": 1.0}, {"max_staleness": 0, "max_age_s": 0.0}):
        with pytest.raises(ValueError):
            AsyncPool(**bad)


# ------------------------------------------------------------------------------------------------ the loop


def test_a_slow_site_does_not_hold_the_others(tmp_path, federation):
    sites = fleet(federation)
    setup = make_setup(tmp_path, federation, steps=4)
    run_async(setup, InProcessTransport(sites))
    updates = read(setup, "update")
    per_agent = {a: [u["own_step"] for u in updates if u["agent"] == a and u["status"] == "trained"]
                 for a in ("alice", "bob", "carol")}
    assert per_agent == {a: [1, 2, 3, 4] for a in per_agent}
    # the fast sites finished their 4 updates before the slow one did
    done = {a: max(u["time"] for u in updates if u["agent"] == a) for a in per_agent}
    assert max(done["alice"], done["bob"]) < done["carol"]
    # plans are shared and never repeat for a site; the slow site skipped to the newest plan
    carol = sites[2]
    assert carol.generated == sorted(set(carol.generated))
    assert max(carol.generated) > len(carol.generated)
    # a learner got peer batches of other plans, with those plans (late batches of the slow site included)
    late = [steps for steps in sites[0].peer_plans if steps]
    assert late, sites[0].peer_plans
    keys = [set(pool) for _, pool, _ in sites[0].trained]
    assert any(any(k.startswith("carol@") for k in pool) for pool in keys)
    for (step, pool, _), peers in zip(sites[0].trained, sites[0].peer_plans):
        assert f"alice@{step}" in pool
        assert {int(k.split("@")[1]) for k in pool if not k.startswith("alice@")} - {step} == set(peers)
    # every delivered row's staleness is within the bound, and the run end says how many updates each site made
    assert all(int(lag) <= setup.run.max_staleness for u in updates for lag in u["staleness_rows"])
    end = read(setup, "run_end")[-1]
    assert end["updates"] == {"alice": 4, "bob": 4, "carol": 4}


def test_rows_staler_than_the_bound_are_dropped_and_counted(tmp_path, federation):
    sites = fleet(federation, slow=0.4, fast=0.0)
    setup = make_setup(tmp_path, federation, steps=6, max_staleness=0)
    run_async(setup, InProcessTransport(sites))
    updates = read(setup, "update")
    carol = [u for u in updates if u["agent"] == "carol"]
    dropped = sum(rows for u in carol for why in u["dropped_rows"].values() for rows in why.values())
    assert dropped > 0   # the fast sites trained again before the slow one took their batches
    assert all(set(u["staleness_rows"]) <= {"0"} for u in updates)
    reasons = {why for u in updates for per in u["dropped_rows"].values() for why in per}
    assert reasons <= {"versions", "age"} and "versions" in reasons


def test_a_site_that_never_answers_does_not_stall_the_run(tmp_path, federation):
    sites = fleet(federation, slow=0.0)
    sites[2].silent = True
    setup = make_setup(tmp_path, federation, steps=3)
    state = run_async(setup, InProcessTransport(sites))
    assert {a: len(v) for a, v in state.trained_steps.items() if v} == {"alice": 3, "bob": 3}
    assert not sites[2].trained


def test_a_restarted_coordinator_continues_with_new_plans(tmp_path, federation):
    sites = fleet(federation, slow=0.0, fast=0.0)
    run_async(make_setup(tmp_path, federation, steps=2), InProcessTransport(sites))
    before = {s.name: list(s.generated) for s in sites}
    setup = make_setup(tmp_path, federation, steps=4)     # the same run, resumed with more updates per site
    state = run_async(setup, InProcessTransport(sites))
    assert {a: len(v) for a, v in state.trained_steps.items()} == {"alice": 4, "bob": 4, "carol": 4}
    for s in sites:
        new = s.generated[len(before[s.name]):]
        assert new and min(new) > max(before[s.name])   # never a plan its weights may already hold
    assert [r["event"] for r in read(setup, "resume")] == ["resume"]


def test_a_batch_without_a_model_version_is_refused_and_the_site_told(tmp_path, federation):
    class OldSite(FakeSite):
        def generate(self, plan):
            self.generated.append(plan.step)
            from hostile import envelope_bytes, honest_batch
            return envelope_bytes(honest_batch(plan, self.name), self.keys.own)

    k = federation.keys
    sites = [FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"]), OldSite("carol", k["carol"])]
    setup = make_setup(tmp_path, federation, steps=2)
    run_async(setup, InProcessTransport(sites))
    refused = [b for b in read(setup, "batch") if b["agent"] == "carol"]
    assert refused and all(b["reason"] == "no_model_version" for b in refused)
    assert any("model_version" in n for n in sites[2].notices)
    assert not sites[2].trained


def test_async_and_sync_states_are_not_interchangeable(tmp_path, federation):
    sites = fleet(federation, slow=0.0, fast=0.0)
    run_async(make_setup(tmp_path, federation, steps=1), InProcessTransport(sites))
    sync = make_setup(tmp_path, federation, steps=2)
    sync.run = sync.run.model_copy(update={"mode": "sync"})
    from hacrl_fed.coordinator.state import StateError
    with pytest.raises(StateError):
        run_coordinator(sync, InProcessTransport(sites))
    with pytest.raises(ValueError, match="run_async"):   # and the sync loop does not run an async config
        run_coordinator(make_setup(tmp_path / "other", federation), InProcessTransport(sites))


def test_with_async_steps_slowest_the_fast_sites_train_until_the_slowest_is_done(tmp_path, federation):
    sites = fleet(federation, slow=0.4, fast=0.0)
    setup = make_setup(tmp_path, federation, steps=3, async_steps="slowest")
    state = run_async(setup, InProcessTransport(sites))
    updates = {a: len(v) for a, v in state.trained_steps.items()}
    assert updates["carol"] == 3
    assert updates["alice"] > 3 and updates["bob"] > 3       # they did not idle while carol caught up
    carol_done = max(u["time"] for u in read(setup, "update") if u["agent"] == "carol")
    for fast in ("alice", "bob"):   # and stopped when carol was done: at most the order in flight then came after
        assert sum(u["time"] > carol_done for u in read(setup, "update") if u["agent"] == fast) <= 1


def test_each_site_is_evaluated_at_its_own_steps(tmp_path, federation):
    sites = fleet(federation, slow=0.04, fast=0.0)
    setup = make_setup(tmp_path, federation, steps=4, eval_every=2, async_steps="slowest")
    setup.held_out = problems(3)
    state = run_async(setup, InProcessTransport(sites))
    evals = read(setup, "eval")
    assert evals[0]["step"] == 0 and set(evals[0]["agents"]) == {"alice", "bob", "carol"}
    per_site = {}
    for e in evals[1:]:
        assert list(e["agents"]) == [e["agent"]]
        per_site.setdefault(e["agent"], []).append(e["step"])
    final = {a: len(v) for a, v in state.trained_steps.items()}
    for agent, steps in per_site.items():
        assert steps[:2] == [2, 4] and steps[-1] == final[agent]   # every 2nd own update, and after its last


def test_the_evaluation_before_training_names_every_site_once_each_has_delivered_a_batch(tmp_path, federation):
    # unnamed nodes (simulate, SuperNodes without authentication): a reply counts once its node delivered a
    # verified batch, and the sites deliver their first batches one by one
    sites = fleet(federation, slow=0.3, fast=0.0)
    setup = make_setup(tmp_path, federation, steps=2, eval_every=0, async_steps="slowest")
    setup.held_out = problems(3)
    run_async(setup, InProcessTransport(sites, named=False))
    before = [e for e in read(setup, "eval") if e["step"] == 0 and "agent" not in e]
    assert len(before) == 1 and set(before[0]["agents"]) == {"alice", "bob", "carol"}


def test_a_site_that_drops_out_does_not_stall_the_others(tmp_path, federation):
    sites = fleet(federation, slow=0.0)

    class Leaving(FakeSite):
        def train(self, order):
            reply = super().train(order)
            if len(self.trained) == 2:
                self.online = False          # gone after its second update
            return reply

    sites[2] = Leaving("carol", federation.keys["carol"])
    setup = make_setup(tmp_path, federation, steps=4, generate_timeout_s=0.5)  # waited for 2 × 0.5 s, then not
    state = run_async(setup, InProcessTransport(sites))
    assert {a: len(v) for a, v in state.trained_steps.items()} == {"alice": 4, "bob": 4, "carol": 2}
    short = read(setup, "run_end")[-1]["ended_short"]
    assert short == {"carol": {"updates": 2, "why": "missed orders", "misses": 2, "rolled_back": 0,
                               "last_unconfirmed": False}}


def test_a_site_restarted_from_an_older_checkpoint_is_reconciled_and_catches_up(tmp_path, federation):
    sites = fleet(federation, slow=0.0)
    sites[2] = Restarting("carol", federation.keys["carol"])
    setup = make_setup(tmp_path, federation, steps=4)
    state = run_async(setup, InProcessTransport(sites))
    lost = [b for b in read(setup, "batch") if b["agent"] == "carol" and b["rolled_back_steps"]]
    assert len(lost) == 1 and lost[0]["rolled_back_steps"] == [sites[2].trained[1][0]]
    assert len(state.trained_steps["carol"]) == 4 and len(sites[2].trained) == 5   # one update made again


def test_one_sites_evaluation_does_not_hold_the_others(tmp_path, federation):
    sites = fleet(federation, slow=0.02, fast=0.02)
    sites[2].eval_delay_s = 2.0
    setup = make_setup(tmp_path, federation, steps=3, eval_every=1)
    setup.held_out = problems(3)
    run_async(setup, InProcessTransport(sites))
    carol = [e for e in read(setup, "eval") if e.get("agent") == "carol"]
    others = [u["time"] for u in read(setup, "update") if u["agent"] != "carol"]
    assert carol and all(e["eval_s"] >= 2.0 for e in carol)
    assert any(e["time"] - e["eval_s"] < t < e["time"] for e in carol for t in others)   # updates went on meanwhile
