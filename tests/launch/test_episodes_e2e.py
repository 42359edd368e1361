"""Multi-turn episodes end to end (docs/multi-turn.md): ``hacrl-fed server`` with an ``episodes`` data source and
three ``hacrl-fed client`` sites (two tokenizers) over a real SuperLink with TLS and SuperNode authentication. Every
site plays Guess The Number episodes, the coordinator replays and pools every trajectory, and each learner trains
on its peers' episodes re-rendered in its own template (no batch refused on either side)."""

from __future__ import annotations

import pytest

from test_e2e import MODELS, Deployment, wait_for

STEPS = 2
EPISODES = """[run.data]
source = "episodes"
num_problems = 40
eval_size = 2
max_turns = 3
envs = [{ name = "textarena/GuessTheNumber-v0", label = "guess" }]
"""


@pytest.fixture
def deployment(tmp_path):
    dep = Deployment(tmp_path)
    server = dep.root / "server.toml"
    text = server.read_text()
    head, rest = text.split("[run.data]\n", 1)
    rest = rest.split("[superlink]", 1)[1]
    server.write_text(head.replace("steps = 6", f"steps = {STEPS}") + EPISODES + "[superlink]" + rest)
    yield dep
    dep.cleanup()


def test_episodes_over_real_flower(deployment):
    dep = deployment
    server = dep.start_server()
    for agent in MODELS:
        dep.start_site(agent)
    wait_for(lambda: server.poll() is not None, 600, "the episode run to end", dep)
    assert server.returncode == 0, dep.log("server")[-3000:]
    steps = [r for r in dep.metrics() if r.get("event") == "step"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for s in steps:
        for agent in MODELS:
            a = s["agents"][agent]
            assert a["status"] == "trained" and not a["train_rejected"], a
            assert a["rows_accepted"] == 2 * 2 and a["generate"]["episode/turns_mean"] >= 1
    evals = [r for r in dep.metrics() if r.get("event") == "eval"]
    assert evals and all(set(e["agents"]) == set(MODELS) for e in evals)
    for agent in MODELS:
        assert dep.stop(agent) == 0
    assert dep.leftovers() == []
