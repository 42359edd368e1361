"""The worker's status file: every phase of a step as a progress display sees it, tokens/s, mini-batch k/M."""

from __future__ import annotations

import json

import pytest

from hacrl_fed.config import OptimConfig
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed import status as status_mod
from hacrl_fed.status import StatusFile


def test_status_file_throttles_within_a_phase_and_keeps_the_disk(tmp_path):
    now = [100.0]
    st = StatusFile(tmp_path / "s.json", "a", min_interval_s=0.5, clock=lambda: now[0])
    st.state["disk"] = {"export": 10}
    st.set("generating", step=2)
    st.update(tokens=5)                                   # within 0.5 s: not written yet
    assert json.loads((tmp_path / "s.json").read_text())["phase"] == "generating"
    assert "tokens" not in json.loads((tmp_path / "s.json").read_text())
    now[0] += 0.6
    st.update(tokens=9)
    written = json.loads((tmp_path / "s.json").read_text())
    assert (written["tokens"], written["disk"], written["since"], written["updated"]) == (9, {"export": 10}, 100.0, 100.6)
    with pytest.raises(RuntimeError):
        with st.phase("training", step=2):
            raise RuntimeError("boom")
    assert json.loads((tmp_path / "s.json").read_text())["phase"] == "idle"   # also after a failure
    StatusFile(None, "a").set("loading")                  # no file: nothing written, nothing raised


def test_worker_reports_each_phase_with_tokens_and_mini_batches(make_sites, plans, tmp_path, monkeypatch):
    make_plan, make_table = plans
    written: list[dict] = []
    real = status_mod.atomic_write_text
    monkeypatch.setattr(status_mod, "atomic_write_text",
                        lambda path, text: (written.append(json.loads(text)), real(path, text)))
    sites = make_sites({"alice": "tiny-llama-bpe"}, optim=OptimConfig(lr=1e-3, mini_batch_rows=2, seed=0))
    alice = sites.start("alice", status_file=tmp_path / "alice.json")
    alice.status.min_interval_s = 0.0                     # record every token update
    assert [w["phase"] for w in written[:2]] == ["loading", "idle"]
    params = sum(p.numel() * p.element_size() for p in alice.model.parameters())
    assert written[-1]["disk"]["export"] == params and written[-1]["disk"]["checkpoint"] > params

    plan = make_plan(1, prompts=2, g=2, max_new_tokens=6)
    env = alice.generate(plan).envelope
    gen = [w for w in written if w["phase"] == "generating"]
    assert gen[0]["rollouts"] == 4 and gen[0]["step"] == 1
    counted = [w["tokens"] for w in gen if "tokens" in w]
    assert counted == sorted(counted) and 0 < counted[-1] <= 4 * 6 and gen[-1]["tokens_per_s"] > 0
    assert [w["phase"] for w in written[-2:]] == ["verifying", "idle"]

    fixes = [("alice", r.prompt_id, r.sample_index, 1.0) for r in pb.RolloutBatch.FromString(env.payload).rollouts
             if r.sample_index == 0]
    start = len(written)
    alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env],
                                 capabilities=make_table(plan, {"alice": 0.5}, corrections=fixes)))
    train = [(w.get("update"), w.get("updates")) for w in written[start:] if w["phase"] == "training"]
    assert train == [(None, None), (1, 2), (2, 2)]        # 4 rows in mini-batches of 2
    assert written[-1] == written[-1] | {"phase": "idle", "step": 1}

    items = [pb.PromptItem(prompt_id="e1", text="What is 1 + 1?", reference_answer="2")]
    alice.evaluate(wpb.EvaluateRequest(run_id="run-a", prompts=items, samples=1,
                                       sampling=pb.SamplingParams(max_new_tokens=4)))
    assert any(w["phase"] == "evaluating" and w["problems"] == 1 for w in written)
    alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT, path="export"))
    assert [w["phase"] for w in written[-2:]] == ["exporting", "idle"]
    assert json.loads((tmp_path / "alice.json").read_text())["phase"] == "idle"
