"""The coordinator loop over an in-process transport: pooling, rejection, re-verification, capability,
metrics, persistence and resume — no Flower processes."""

from __future__ import annotations

import json

import pytest

from fedutil import boxed_verify, problems
from hacrl_fed.config import DataConfig, RunConfig
from hacrl_fed.coordinator.rounds import Setup, run_coordinator
from hacrl_fed.coordinator.state import StateError, load_state
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.v1 import rollout_pb2 as pb
from hostile import HOSTILE
from inprocess import FakeSite, HostileSite, InProcessTransport

CASES = ("tampered", "replay", "nan_reward", "non_utf8", "duplicate_sample", "missing_samples")


def make_setup(tmp_path, federation, *, steps=3, min_agents=2, held_out=(), run_id="run-a", **run_kw) -> Setup:
    run = RunConfig(run_id=run_id, steps=steps, prompts_per_step=2, samples_per_prompt=2, min_agents=min_agents,
                    data=DataConfig(num_problems=20, eval_size=0), max_batch_bytes=64 * 1024, join_timeout_s=0,
                    **run_kw)
    sampler = PromptSampler(problems(20), batch_size=run.prompts_per_step, seed=run.seed)
    return Setup(run=run, roster=federation.roster, verify=boxed_verify, sampler=sampler, run_dir=tmp_path / "run",
                 held_out=list(held_out), sleep=lambda s: None)


def read_metrics(setup: Setup) -> list[dict]:
    return [json.loads(line) for line in setup.metrics_path.read_text().splitlines()]


def sites(federation, *, hostile=CASES, lie=False):
    k = federation.keys
    return [FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"], lie=lie),
            HostileSite("mallory", k["mallory"], cases=tuple(hostile))]


def test_run_pools_honest_batches_and_rejects_each_hostile_one(tmp_path, federation):
    fleet = sites(federation)
    setup = make_setup(tmp_path, federation, steps=len(CASES))
    state = run_coordinator(setup, InProcessTransport(fleet))
    assert state.step == len(CASES)
    steps = [r for r in read_metrics(setup) if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, len(CASES) + 1))
    for r, case in zip(steps, CASES):
        assert r["trained"] and r["participants"] == ["alice", "bob"]
        mal = r["agents"]["mallory"]
        assert (mal["status"], mal["reason"]) == ("rejected", HOSTILE[case][1].value), case
        assert mal["rows_accepted"] == 0 and mal["rows_rejected"] > 0 and mal["detail"]
        assert r["agents"]["alice"]["status"] == "trained" and r["agents"]["alice"]["rows_accepted"] == 4
    # the attacker never receives the pool; the honest sites get exactly both honest envelopes each step
    assert fleet[2].trained == []
    for site in fleet[:2]:
        assert [(s, pool) for s, pool, _ in site.trained] == [(i, ["alice", "bob"]) for i in range(1, len(CASES) + 1)]
    assert state.totals["mallory"]["rows_accepted"] == 0
    assert sum(v for k, v in state.totals["mallory"].items() if k.startswith("reason/")) == len(CASES)


def test_coordinator_verdict_wins_and_disagreements_are_counted(tmp_path, federation):
    fleet = sites(federation, lie=True)
    setup = make_setup(tmp_path, federation, steps=2, capability_window=2)
    run_coordinator(setup, InProcessTransport(fleet))
    step = [r for r in read_metrics(setup) if r["event"] == "step"][-1]
    bob = step["agents"]["bob"]
    # bob claims every sample correct; half of them are not (honest_batch: every 2nd sample is right)
    assert bob["site_accuracy"] == 1.0 and bob["accuracy"] == 0.5
    assert bob["reward_disagreements"] == 2 and step["agents"]["alice"]["reward_disagreements"] == 0
    _, _, table_bytes = fleet[0].trained[-1]
    table = pb.CapabilityTable.FromString(table_bytes)
    assert table.step == 2 and not table.warmup
    assert {(c.agent_id, c.reward) for c in table.corrections} == {("bob", 0.0)}
    assert len(table.corrections) == 2
    caps = {a.agent_id: (a.capability, list(a.window)) for a in table.agents}
    assert caps == {"alice": (0.5, [0.5, 0.5]), "bob": (0.5, [0.5, 0.5])}


def test_too_few_valid_batches_skip_the_step(tmp_path, federation):
    fleet = sites(federation)
    fleet[1].silent = True
    setup = make_setup(tmp_path, federation, steps=1)
    transport = InProcessTransport(fleet)
    state = run_coordinator(setup, transport)
    step = [r for r in read_metrics(setup) if r["event"] == "step"][0]
    assert not step["trained"] and state.step == 1
    assert not any(kind == "train" for ex in transport.exchanges for kind, _ in ex)
    assert step["agents"]["bob"]["status"] == "timeout"


def test_crash_in_train_phase_resumes_after_that_step(tmp_path, federation):
    """The step whose train phase was interrupted counts as done; prompts continue where they were."""
    reference = make_setup(tmp_path / "ref", federation, steps=4)
    run_coordinator(reference, InProcessTransport(sites(federation)))
    ref_prompts = [r["prompt_ids"] for r in read_metrics(reference) if r["event"] == "step"]

    fleet = sites(federation)
    setup = make_setup(tmp_path, federation, steps=4)
    transport = InProcessTransport(fleet)
    transport.fail_train_at = 3
    with pytest.raises(KeyboardInterrupt):
        run_coordinator(setup, transport)
    saved = load_state(setup.state_path, run_id="run-a", config_digest=load_state_digest(setup))
    assert saved.step == 3 and saved.pending["step"] == 3
    assert [s for s, *_ in fleet[0].trained] == [1, 2]

    setup2 = make_setup(tmp_path, federation, steps=4)  # a fresh process: new sampler, new tracker
    transport.fail_train_at = None
    state = run_coordinator(setup2, transport)
    assert state.step == 4 and state.restarts == 1 and state.pending is None
    records = read_metrics(setup2)
    steps = [r for r in records if r["event"] == "step"]
    assert [(r["step"], r.get("interrupted", False)) for r in steps] == [(1, False), (2, False), (3, True), (4, False)]
    assert [r["prompt_ids"] for r in steps] == ref_prompts
    assert [s for s, *_ in fleet[0].trained] == [1, 2, 4]  # step 3 is never trained twice or late
    assert [r["event"] for r in records].count("resume") == 1
    table = pb.CapabilityTable.FromString(fleet[0].trained[-1][2])
    assert len(next(a for a in table.agents if a.agent_id == "alice").window) == 4


def load_state_digest(setup: Setup) -> str:
    return json.loads(setup.state_path.read_text())["config_digest"]


def test_metrics_lines_of_an_unfinished_step_are_dropped_on_resume(tmp_path, federation):
    setup = make_setup(tmp_path, federation, steps=1)
    run_coordinator(setup, InProcessTransport(sites(federation)))
    good = setup.metrics_path.read_bytes()
    with open(setup.metrics_path, "ab") as f:
        f.write(b'{"event": "step", "step": 99, "half-writ')
    run_coordinator(make_setup(tmp_path, federation, steps=1), InProcessTransport(sites(federation)))
    text = setup.metrics_path.read_bytes()
    assert text.startswith(good) and b"half-writ" not in text


def test_resume_with_changed_run_settings_is_refused(tmp_path, federation):
    run_coordinator(make_setup(tmp_path, federation, steps=1), InProcessTransport(sites(federation)))
    changed = make_setup(tmp_path, federation, steps=2, seed=7)
    with pytest.raises(StateError, match="different settings"):
        run_coordinator(changed, InProcessTransport(sites(federation)))


def test_unnamed_nodes_are_labelled_by_their_verified_signer(tmp_path, federation):
    """Insecure deployments (no node registration): names come from the replies, identity from signatures."""
    setup = make_setup(tmp_path, federation, steps=1)
    run_coordinator(setup, InProcessTransport(sites(federation, hostile=["impersonation"]), named=False))
    step = [r for r in read_metrics(setup) if r["event"] == "step"][0]
    assert step["participants"] == ["alice", "bob"]
    assert step["agents"]["mallory"]["reason"] == "agent_mismatch"


def test_evaluation_before_and_after_and_checkpoint_requests(tmp_path, federation):
    fleet = sites(federation)
    setup = make_setup(tmp_path, federation, steps=4, held_out=problems(3, offset=100), checkpoint_every=2,
                       eval_every=3)
    run_coordinator(setup, InProcessTransport(fleet))
    evals = [r for r in read_metrics(setup) if r["event"] == "eval"]
    assert [e["step"] for e in evals] == [0, 3, 4]
    assert evals[0]["agents"]["alice"] == {"avg@1": 0.25, "problems": 3.0}
    assert fleet[0].checkpoints == 2  # after steps 2 and 4
    end = read_metrics(setup)[-1]
    assert end["event"] == "run_end" and end["steps"] == 4 and end["skipped_steps"] == 0


def test_next_plan_rides_with_the_train_order(tmp_path, federation):
    """After the first step, participants generate inside the train round trip; only the others are asked
    separately, in the same exchange. Every step is one exchange (plus the very first generate)."""
    fleet = sites(federation)
    transport = InProcessTransport(fleet)
    run_coordinator(make_setup(tmp_path, federation, steps=3), transport)
    assert transport.exchanges[0] == [("generate", "alice"), ("generate", "bob"), ("generate", "mallory")]
    assert transport.exchanges[1] == [("train", "alice"), ("train", "bob"), ("generate", "mallory")]
    assert transport.exchanges[2] == transport.exchanges[1]
    assert transport.exchanges[3] == [("train", "alice"), ("train", "bob")]  # last step: nothing to prefetch
    assert len(transport.exchanges) == 4
    assert fleet[0].generated == [1, 2, 3] and fleet[2].generated == [1, 2, 3]


def test_each_step_logs_one_summary_line(tmp_path, federation, caplog):
    setup = make_setup(tmp_path, federation, steps=2)
    with caplog.at_level("INFO", logger="hacrl_fed.coordinator"):
        run_coordinator(setup, InProcessTransport(sites(federation, hostile=("tampered", "nan_reward"))))
    lines = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("step ") and " | step " in m]
    records = [r for r in read_metrics(setup) if r["event"] == "step"]
    assert len(lines) == 2 and len(records) == 2
    for line, rec in zip(lines, records):
        assert line.startswith(f"step {rec['step']}/2 trained: ")
        alice, mallory = rec["agents"]["alice"], rec["agents"]["mallory"]
        assert f"alice trained acc {alice['accuracy']:.3f} rows 4/0" in line
        assert f"mallory rejected ({mallory['reason']}) rows 0/{mallory['rows_rejected']}" in line
        assert line.endswith(f"step {rec['timing']['step_s']:.1f} s, overhead {rec['timing']['overhead_s']:.1f} s")


def test_report_to_tensorboard_mirrors_every_metrics_line(tmp_path, federation):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hacrl_fed.coordinator.scalars import scalars

    k = federation.keys
    setup = make_setup(tmp_path, federation, steps=2, report_to="tensorboard")
    assert setup.run.report_to == ["tensorboard"] and RunConfig(report_to="none").report_to == []
    run_coordinator(setup, InProcessTransport([FakeSite("alice", k["alice"]), FakeSite("bob", k["bob"])]))
    acc = EventAccumulator(str(setup.run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for rec in read_metrics(setup):
        if rec["event"] != "step":
            continue
        for tag, value in scalars(rec):
            assert tag in tags, tag
            assert [e.value for e in acc.Scalars(tag) if e.step == rec["step"]] == [pytest.approx(value, rel=1e-6)]
    assert "agents/alice/accuracy" in tags and "timing/step_s" in tags
    assert any(t.startswith("run_start/") for t in tags)


def test_report_to_tensorboard_without_the_package_fails_before_the_run(monkeypatch, tmp_path):
    import importlib.util
    import sys

    from hacrl_fed.config import ConfigError
    from hacrl_fed.coordinator.scalars import TensorBoardLog
    from hacrl_fed.launch.preflight import check_report_to

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r'pip install "hacrl-fed\[tensorboard\]"'):
        check_report_to(RunConfig(report_to=["tensorboard"]))
    check_report_to(RunConfig())                         # nothing asked, nothing needed
    for name in ("tensorboard", "tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2",
                 "tensorboard.summary.writer.event_file_writer"):
        monkeypatch.setitem(sys.modules, name, None)      # as if not installed, even after an earlier import
    with pytest.raises(RuntimeError, match="needs the tensorboard package"):
        TensorBoardLog(tmp_path / "tb")
