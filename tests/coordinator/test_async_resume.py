"""Resuming an asynchronous run: ``hacrl-fed server``'s pre-flight checks the saved state with the terms the async
loop restores it with (its settings' digest with the mode, no bound on ``step``, which counts shared plans and
outnumbers every site's updates), so a coordinator killed mid-run restarts instead of exiting 2."""

from __future__ import annotations

import pytest

from hacrl_fed.async_rounds.loop import run_async
from hacrl_fed.coordinator.rounds import check_saved_state, state_terms
from hacrl_fed.coordinator.state import StateError, load_state, run_digest
from inprocess import FakeSite, InProcessTransport
from test_async_rounds import make_setup


def test_the_server_preflight_accepts_the_async_state_it_will_resume(tmp_path, federation):
    k = federation.keys
    sites = [FakeSite("alice", k["alice"], delay_s=0.0), FakeSite("bob", k["bob"], delay_s=0.0),
             FakeSite("carol", k["carol"], delay_s=0.3)]
    setup = make_setup(tmp_path, federation, steps=3)
    run_async(setup, InProcessTransport(sites))
    saved = load_state(setup.state_path, run_id=setup.run.run_id, config_digest=run_digest(state_terms(setup.run)[0]))
    assert saved is not None and saved.step > setup.run.steps      # more plans than any site's updates
    check_saved_state(setup.run, setup.run_dir)                     # what `hacrl-fed server` checks before start
    more = make_setup(tmp_path, federation, steps=5)                # resumed with more updates per site
    check_saved_state(more.run, more.run_dir)
    state = run_async(more, InProcessTransport(sites))
    assert {a: len(v) for a, v in state.trained_steps.items()} == {"alice": 5, "bob": 5, "carol": 5}


def test_the_preflight_still_refuses_a_state_of_other_settings(tmp_path, federation):
    k = federation.keys
    sites = [FakeSite(a, k[a], delay_s=0.0) for a in ("alice", "bob", "carol")]
    setup = make_setup(tmp_path, federation, steps=1)
    run_async(setup, InProcessTransport(sites))
    for change in ({"mode": "sync"}, {"seed": 7}, {"samples_per_prompt": 3}):
        with pytest.raises(StateError, match="state.json"):
            check_saved_state(setup.run.model_copy(update=change), setup.run_dir)
