"""How an asynchronous run ends: every total the operator sees equals what the sites' weights hold (roll-backs
taken off), a site whose weights never keep its updates cannot keep the run going forever (its roll-backs are
bounded and recorded), and the run's end names the sites that ended short."""

from __future__ import annotations

import threading

from hacrl_fed.async_rounds.loop import run_async
from inprocess import FakeSite, InProcessTransport
from test_async_rounds import Restarting, fleet, make_setup, read


def run_to_end(setup, sites, limit_s: float = 300.0):
    """run_async in a thread; fails (instead of hanging the suite) when the run does not end within limit_s."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("state", run_async(setup, InProcessTransport(sites))),
                              daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the asynchronous run never ended"
    return out["state"]


def test_run_end_totals_equal_what_the_weights_hold_after_a_roll_back(tmp_path, federation):
    sites = fleet(federation, slow=0.0)
    sites[2] = Restarting("carol", federation.keys["carol"])
    setup = make_setup(tmp_path, federation, steps=4)
    state = run_to_end(setup, sites)
    end = read(setup, "run_end")[-1]
    assert len(sites[2].trained) == 5                                    # one update made twice
    for agent in ("alice", "bob", "carol"):
        assert end["totals"][agent]["steps_trained"] == len(state.trained_steps[agent]) == end["updates"][agent] == 4
    assert end["totals"]["carol"]["steps_rolled_back"] == 1 and end["ended_short"] == {}


def test_a_site_whose_weights_never_keep_an_update_cannot_keep_the_run_going(tmp_path, federation):
    class Forgetful(FakeSite):
        """Reports ``state/trained_step = 0`` after every update."""

        def generate_metrics(self):
            return {"courier/worker_s": 0.02, "state/trained_step": 0.0}

        def generate(self, plan):
            self.weights_step = 0
            return super().generate(plan)

    sites = fleet(federation, slow=0.0)
    sites[2] = Forgetful("carol", federation.keys["carol"])
    setup = make_setup(tmp_path, federation, steps=3)
    state = run_to_end(setup, sites)
    end = read(setup, "run_end")[-1]
    assert end["updates"]["alice"] == end["updates"]["bob"] == 3
    assert end["totals"]["carol"]["steps_rolled_back"] == 3             # bounded: run.steps roll-backs
    assert end["totals"]["carol"]["steps_trained"] == len(state.trained_steps["carol"]) == end["updates"]["carol"]
    assert end["ended_short"]["carol"]["why"] == "roll-backs"
    assert end["ended_short"]["carol"]["rolled_back"] == 3


def test_a_batch_signed_fresher_than_its_weights_is_not_pooled(tmp_path, federation):
    """carol signs every batch with the newest model_version the plan allows (step − 1) while it reports step 0 for
    its weights: with max_staleness = 0 such a batch would pass as fresh. It is refused, the site told, and no
    learner gets it."""
    class Ahead(FakeSite):
        def generate(self, plan):
            self.generated.append(plan.step)
            self.weights_step = 0                          # what it reports (state/trained_step)
            from hostile import envelope_bytes, honest_batch
            batch = honest_batch(plan, self.name)
            batch.model_version = plan.step - 1
            return envelope_bytes(batch, self.keys.own)

    sites = fleet(federation, slow=0.0)
    sites[2] = Ahead("carol", federation.keys["carol"])
    setup = make_setup(tmp_path, federation, steps=3, max_staleness=0)
    run_to_end(setup, sites)
    refused = [b for b in read(setup, "batch") if b["agent"] == "carol" and b["model_version"] is None]
    ahead = [b for b in refused if b["reason"] == "model_version_ahead"]
    assert ahead and "above the step its weights hold" in ahead[0]["detail"], [b for b in read(setup, "batch") if b["agent"] == "carol"]
    assert any("model_version_ahead" in n for n in sites[2].notices)
    pooled = {int(b["plan"]) for b in read(setup, "batch") if b["agent"] == "carol" and b["status"] == "accepted"}
    assert pooled <= {1}                                   # only its plan-1 batch (version 0) was honest
    delivered = {k for s in sites[:2] for _, pool, _ in s.trained for k in pool if k.startswith("carol@")}
    assert delivered <= {"carol@1"}


def test_a_site_cut_off_briefly_is_waited_for_and_completes(tmp_path, federation):
    """carol is unreachable from its second update until 0.3 s after the others have finished: it has missed fewer
    orders than the limit (each generate_timeout_s offline counts as one), so the run waits for it and carol makes
    all its updates instead of ending at 2 of 4."""
    import time

    class Partitioned(FakeSite):
        others: tuple = ()
        back_at: float = 0.0

        @property
        def online(self):
            if len(self.trained) < 2:
                return True
            if not all(len(o.trained) >= 4 for o in self.others):
                return False
            self.back_at = self.back_at or time.monotonic() + 0.3           # the link comes back
            return time.monotonic() >= self.back_at

        @online.setter
        def online(self, value):
            pass

    sites = fleet(federation, slow=0.0)
    sites[2] = Partitioned("carol", federation.keys["carol"])
    sites[2].others = tuple(sites[:2])
    setup = make_setup(tmp_path, federation, steps=4, generate_timeout_s=30.0)
    state = run_to_end(setup, sites)
    assert {a: len(v) for a, v in state.trained_steps.items()} == {"alice": 4, "bob": 4, "carol": 4}
    assert read(setup, "run_end")[-1]["ended_short"] == {}
