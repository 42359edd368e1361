"""Asynchronous rounds end to end: ``hacrl-fed server`` with ``run.mode = "async"`` and three ``hacrl-fed client``
sites over a real SuperLink with TLS and SuperNode authentication; carol's site is made 10× slower
(``agent.slowdown``: a tiny model's call takes tens of milliseconds, and at 3× a loaded machine's jitter in the
transport could reorder the last updates). Every site makes its updates, the fast ones finish first, and learners train on peer batches
of other plans (their workers refuse none)."""

from __future__ import annotations

import pytest

from test_e2e import MODELS, Deployment, wait_for

STEPS = 3


@pytest.fixture
def deployment(tmp_path):
    dep = Deployment(tmp_path)
    server = dep.root / "server.toml"
    text = server.read_text()
    server.write_text(text.replace("[run]\n", '[run]\nmode = "async"\n', 1).replace("steps = 6", f"steps = {STEPS}"))
    carol = dep.root / "carol.toml"
    carol.write_text(carol.read_text().replace("[agent]\n", "[agent]\nslowdown = 10.0\n", 1))
    yield dep
    dep.cleanup()


def test_async_rounds_over_real_flower(deployment):
    dep = deployment
    server = dep.start_server()
    for agent in MODELS:
        dep.start_site(agent)
    wait_for(lambda: server.poll() is not None, 600, "the asynchronous run to end", dep)
    assert server.returncode == 0, dep.log("server")[-3000:]
    updates = [r for r in dep.metrics() if r.get("event") == "update"]
    trained = {a: [u["own_step"] for u in updates if u["agent"] == a and u["status"] == "trained"] for a in MODELS}
    assert trained == {a: list(range(1, STEPS + 1)) for a in MODELS}, updates
    assert not [u for u in updates if u["train_rejected"]], [u["train_rejected"] for u in updates]
    assert any(u["peer_plans"] for u in updates)           # peer batches of other plans reached a learner
    last = {a: max(u["time"] for u in updates if u["agent"] == a) for a in MODELS}
    assert max(last["alice"], last["bob"]) < last["carol"]  # the slow site did not hold the fast ones
    end = [r for r in dep.metrics() if r.get("event") == "run_end"][-1]
    assert end["mode"] == "async" and end["updates"] == {a: STEPS for a in MODELS}
    for agent in MODELS:
        assert dep.stop(agent) == 0
    assert dep.leftovers() == []
