"""A rollout-only site in a real federation: ``hacrl-fed server`` + two training sites (tiny models) + one
``hacrl-fed client --endpoint URL --api-model NAME`` whose rollouts come from a real ``transformers serve``
(no ``n``, no log-probs), all over TLS with SuperNode authentication on 127.0.0.1.

* the contributor's batches are verified, signed, pooled and re-verified by the coordinator, it is counted in
  the capability statistics, and it never receives a train order (its roster entry: ``role = "rollout_only"``);
* both learners train on its rows (without a behaviour log-prob, by ``missing_behaviour_logprob``);
* its endpoint then stops: the contributor loses those steps, with the cause in the coordinator's record and
  on its own terminal; the learners go on training, and no process dies.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest
from tf_serve import transformers_serve

from fedutil import make_federation
from hacrl_fed.tiny_models import build_tiny_model

sys.path.insert(0, str(Path(__file__).parent))
from test_e2e import Deployment, wait_for  # noqa: E402

STEPS = 4
LEARNERS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}


def sample_when_asked(model_dir: Path) -> None:
    """``transformers serve`` (5.24) decodes greedily, whatever the request's temperature, unless the model's
    generation config says ``do_sample``; a greedy random tiny model answers whitespace only."""
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(config | {"do_sample": True}))


class EndpointDeployment(Deployment):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        # the same deployment with the endpoint site "api" in place of the e2e test's sites
        self.fed = make_federation(root / "fed", [*LEARNERS, "api"], roles={"api": "rollout_only"})
        shutil.copy(self.fed.roster_path, root / "roster.toml")        # the site layout: roster.toml, keys/
        for kind in ("ed25519", "node"):
            shutil.copy(self.fed.root / f"api.{kind}.key", root / "keys" / f"api.{kind}.key")
        text = (root / "server.toml").read_text()
        text = text.replace("steps = 6", f"steps = {STEPS}")
        text = "\n".join(f'roster = "{self.fed.roster_path}"' if line.startswith("roster =") else line
                         for line in text.splitlines()) + "\n"
        (root / "server.toml").write_text(text)
        for agent, model in LEARNERS.items():
            self.client_toml(agent, model)

    def start_endpoint_site(self, url: str, model: str):
        return self.cli("api", "client", "--endpoint", url, "--api-model", model, "--name", "api", "--server",
                        f"127.0.0.1:{self.port}", "--root-certificates", str(self.ca), "--output-dir",
                        str(self.root / "sites"))


@pytest.fixture
def deployment(tmp_path):
    dep = EndpointDeployment(tmp_path)
    yield dep
    dep.cleanup()


def test_a_contributor_behind_transformers_serve_in_a_real_federation(deployment, tmp_path):
    dep = deployment
    model = build_tiny_model("tiny-llama-bpe", tmp_path / "served-model")
    sample_when_asked(model)
    with transformers_serve(model, tmp_path / "serve.log") as url:
        dep.start_server()
        for agent in LEARNERS:
            dep.start_site(agent)
        dep.start_endpoint_site(url, str(model))
        wait_for(lambda: 2 in dep.steps_done(), 600, "step 2", dep)
    # the endpoint is gone from here on
    server = dep.procs["server"]
    assert server.wait(600) == 0, dep.log("server")[-3000:]
    steps = {r["step"]: r for r in dep.metrics() if r["event"] == "step"}
    assert sorted(steps) == list(range(1, STEPS + 1))

    for step in (1, 2):
        r = steps[step]
        api = r["agents"]["api"]
        assert api["status"] == "contributed", (step, api, dep.log("api")[-2000:])
        assert api["rows_accepted"] == 4 and api["accuracy"] is not None and api["capability"] is not None
        assert api["model_fingerprint"].startswith("api:") and api["train"] == {}
        assert "api" in r["participants"]
        for learner in LEARNERS:
            a = r["agents"][learner]
            assert a["status"] == "trained", (step, learner, a, dep.log(learner)[-2000:])
            # every row of the contributor reaches the update (a reply of whitespace alone, possible from a random
            # tiny model, would be dropped as empty, so count the rows trained, all without a behaviour log-prob)
            got = a["per_source"]["api"]
            assert got["rows"] >= 1 and got["no_logprob_rows"] == got["rows"], got
    # without its endpoint the contributor loses its steps; the cause is in the record; the learners train on
    lost = [s for s in (3, 4) if steps[s]["agents"].get("api", {}).get("status") == "error"]
    assert 4 in lost, {s: steps[s]["agents"].get("api") for s in (3, 4)}
    assert "endpoint" in steps[4]["agents"]["api"]["detail"], steps[4]["agents"]["api"]
    assert all(steps[s]["agents"][a]["status"] == "trained" for s in (3, 4) for a in LEARNERS)
    site_log = dep.log("api")
    assert "the endpoint failed" in site_log and "does not train" not in site_log   # never sent a train order
    assert dep.procs["api"].poll() is None                                          # and still running

    for name in (*LEARNERS, "api"):
        dep.procs[name].send_signal(signal.SIGTERM)
    for name in (*LEARNERS, "api"):
        assert dep.procs[name].wait(60) == 0, dep.log(name)[-2000:]
