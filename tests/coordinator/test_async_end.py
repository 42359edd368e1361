"""How an asynchronous run ends: every total the operator sees equals what the sites' weights hold (roll-backs
taken off), a site whose weights never keep its updates cannot keep the run going forever (its roll-backs are
bounded and recorded), and the run's end names the sites that ended short."""

from __future__ import annotations

import threading

from hacrl_fed.async_rounds.loop import run_async
from inprocess import FakeSite, InProcessTransport
from test_async_rounds import fleet, make_setup, read


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
    class Restarting(FakeSite):
        def generate(self, plan):
            if len(self.trained) == 2 and not getattr(self, "restarted", False):
                self.restarted = True
                self.weights_step = self.trained[0][0]     # back to the checkpoint of its first update
            return super().generate(plan)

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
