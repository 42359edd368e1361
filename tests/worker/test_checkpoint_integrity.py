"""Checkpoints are verified when read and a clean shutdown saves one: a truncated, bit-flipped, altered or
incomplete checkpoint is named in one line and the worker falls back to the previous intact one; a
worker stopped with SIGTERM checkpoints the steps it trained since the last checkpoint."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

import pytest
import torch

from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.checkpoints.store import CheckpointError, CheckpointManager, TrainingState
from hacrl_fed.worker.models import model_fingerprint


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _two_checkpoints(lm, root):
    """Checkpoints of steps 1 and 2 with different weights; returns (manager, weights of step 1)."""
    mgr = CheckpointManager(root, keep_last=3)
    opt = torch.optim.AdamW(lm.model.parameters(), lr=1e-2)
    fp = model_fingerprint(lm.model)
    mgr.save(lm.model, opt, TrainingState(step=1, run_id="r", fingerprint=fp))
    first = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(0.5)
    mgr.save(lm.model, opt, TrainingState(step=2, run_id="r", fingerprint=model_fingerprint(lm.model)))
    return mgr, first


def _state(path):
    return path / "state.json"


DAMAGE = {
    "truncated_weights": lambda d: _truncate(d / "model.safetensors"),
    "bit_flipped_weights": lambda d: _flip(d / "model.safetensors"),
    "bit_flipped_optimizer": lambda d: _flip(d / "optimizer.pt"),
    "truncated_rng": lambda d: _truncate(d / "rng.pt"),
    "missing_weights": lambda d: (d / "model.safetensors").unlink(),
    "altered_state": lambda d: _state(d).write_text(_state(d).read_text().replace('"step": 2', '"step": 7')),
    "garbage_state": lambda d: _state(d).write_text("{not json"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_named_and_the_previous_one_is_used(load_tiny, tmp_path, damage, caplog):
    lm = load_tiny("tiny-llama-bpe")
    mgr, first = _two_checkpoints(lm, tmp_path / "ck")
    newest = mgr.latest()
    DAMAGE[damage](newest)
    fresh = load_tiny("tiny-llama-bpe")
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.mul_(-1)
    with pytest.raises(CheckpointError) as err:
        CheckpointManager.load(newest, fresh.model, torch.optim.AdamW(fresh.model.parameters()),
                               fingerprint=model_fingerprint)
    assert str(newest) in str(err.value) and "\n" not in str(err.value)
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"):
        path, state = mgr.load_latest(fresh.model, torch.optim.AdamW(fresh.model.parameters()),
                                      fingerprint=model_fingerprint)
    assert path.name == "step-00000001" and state.step == 1
    assert all(torch.equal(v, first[k]) for k, v in fresh.model.state_dict().items())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "\n" not in warnings[0]


def test_an_old_format_checkpoint_is_checked_by_its_fingerprint(load_tiny, tmp_path):
    """A checkpoint without digests (format 1) loads, but weights that differ from the recorded
    fingerprint are refused."""
    lm = load_tiny("tiny-llama-bpe")
    mgr, first = _two_checkpoints(lm, tmp_path / "ck")
    newest = mgr.latest()
    meta = json.loads(_state(newest).read_text())
    meta = {k: v for k, v in meta.items() if k not in ("files", "digest")} | {"format": 1}
    _state(newest).write_text(json.dumps(meta))
    from safetensors.torch import load_file, save_file

    weights = load_file(str(newest / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0
    save_file(weights, str(newest / "model.safetensors"))
    with pytest.raises(CheckpointError, match="recorded fingerprint"):
        CheckpointManager.load(newest, lm.model, fingerprint=model_fingerprint)
    path, _ = mgr.load_latest(lm.model, fingerprint=model_fingerprint)
    assert path.name == "step-00000001"
    assert all(torch.equal(v, first[k]) for k, v in lm.model.state_dict().items())


def test_no_intact_checkpoint_refuses_to_start(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe"})
    alice = sites.start("alice")
    plan = make_plan(1)
    env = alice.generate(plan).envelope
    alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env],
                                 capabilities=make_table(plan, {"alice": 0.5})))
    saved = alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    alice.close()
    _flip(__import__("pathlib").Path(saved.path) / "model.safetensors")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as err:
        sites.start("alice")
    assert "model.safetensors" in str(err.value) and "\n" not in str(err.value)
    sites.workers.pop("alice")


@pytest.mark.parametrize("screens", [{"version": 99}, {"version": 1, "standing": {"bob": {"status": "trusted"}}}, [1]])
def test_a_checkpoint_with_an_unusable_screen_state_is_named_and_the_previous_one_is_used(make_sites, plans, caplog,
                                                                                          screens):
    """A checkpoint written with another screen-state version (digest intact: another release wrote it), or a
    screen state the guard cannot read, is skipped like a damaged one: one warning naming its state.json, the
    previous checkpoint resumes (issue 25, D8)."""
    from pathlib import Path

    from hacrl_fed.checkpoints.store import _meta_digest

    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe"})
    alice = sites.start("alice")
    saved = []
    for step in (1, 2):
        plan = make_plan(step)
        env = alice.generate(plan).envelope
        alice.train(wpb.TrainRequest(run_id="run-a", step=step, plan=plan, envelopes=[env],
                                     capabilities=make_table(plan, {"alice": 0.5})))
        saved.append(Path(alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE)).path))
    alice.close()
    sites.workers.pop("alice")
    meta = json.loads(_state(saved[1]).read_text())
    assert meta["extra"]["screens"]["version"] == 2
    meta["extra"]["screens"] = screens
    meta["digest"] = _meta_digest(meta)
    _state(saved[1]).write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"):
        again = sites.start("alice")
    assert again.health().step == 1
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "checkpoint" in r.getMessage()]
    assert len(warnings) == 1 and str(_state(saved[1])) in warnings[0] and "screen" in warnings[0]
    assert "\n" not in warnings[0]


def test_a_site_of_another_run_refuses_to_start_and_to_evaluate(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe"})
    alice = sites.start("alice")
    plan = make_plan(1)
    env = alice.generate(plan).envelope
    alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env],
                                 capabilities=make_table(plan, {"alice": 0.5})))
    from hacrl_fed.worker.errors import PreconditionError

    with pytest.raises(PreconditionError, match="model of run 'run-a'"):
        alice.evaluate(wpb.EvaluateRequest(prompts=plan.prompts, samples=1, run_id="run-b",
                                           sampling=pb.SamplingParams(temperature=0, max_new_tokens=4)))
    alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    alice.close()
    with pytest.raises(CheckpointError, match="holds checkpoints of run 'run-a'.*for run 'run-b'"):
        sites.start("alice", run_id="run-b")
    sites.workers.pop("alice")
    assert sites.start("alice", run_id="run-a").health().step == 1


def _worker_toml(sites, name, tmp_path, model_cache):
    cfg = sites.cfg[name]
    toml = tmp_path / f"{name}.toml"
    toml.write_text(
        f'output_dir = "{tmp_path}/out"\n'
        f'[agent]\nname = "{name}"\nprivate_key = "{cfg.private_key}"\nroster = "{cfg.roster}"\n'
        f'checkpoint_dir = "{tmp_path}/ck"\n[agent.verifier]\nworkers = 1\n'
        f'[agent.model]\nname_or_path = "tiny-gemma-unigram"\ncache_dir = "{model_cache}"\n')
    return toml


def _start_worker(toml, addr_file):
    proc = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(toml),
                             "--address", "127.0.0.1:0", "--address-file", str(addr_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not addr_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    return proc


def test_sigterm_checkpoints_trained_steps_and_the_directory_is_locked(make_sites, plans, tmp_path, model_cache):
    from hacrl_fed.worker.service import connect

    make_plan, make_table = plans
    sites = make_sites({"carol": "tiny-gemma-unigram"})
    toml = _worker_toml(sites, "carol", tmp_path, model_cache)
    proc = _start_worker(toml, tmp_path / "addr")
    try:
        assert (tmp_path / "addr").exists(), proc.communicate(timeout=30)
        token = (tmp_path / "out" / "carol" / "worker.token").read_text().strip()   # written by the worker
        stub = connect((tmp_path / "addr").read_text().strip(), token)[1]
        for step in (1, 2):
            plan = make_plan(step)
            env = stub.Generate(wpb.GenerateRequest(plan=plan), timeout=120).envelope
            stub.Train(wpb.TrainRequest(run_id="run-a", step=step, plan=plan, envelopes=[env], checkpoint_every=5,
                                        capabilities=make_table(plan, {"carol": 0.5})), timeout=120)
        second = subprocess.run([sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(toml),
                                 "--address", "127.0.0.1:0"], capture_output=True, text=True, timeout=120)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"pid {proc.pid}" in lines[0] and "in use" in lines[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [p.name for p in CheckpointManager(tmp_path / "ck").checkpoints()] == ["step-00000002"]
    assert "checkpoint saved on shutdown" in out + err
