"""``hacrl-fed simulate``: the tiny end-to-end run as a subprocess, Ctrl-C cleanup, run layout, device pinning.

The end-to-end tests start the real processes (flower-superlink, two workers with tiny models,
two flower-supernodes, ``flwr run``) on loopback, so they take about a minute each on 2 cores.
Every child inherits a marker environment variable; a test fails if any process carrying it
outlives the command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from hacrl_fed.config import ConfigError, SimulateConfig, load_config
from hacrl_fed.launch.simulate import default_config, prepare_run, worker_env
from hacrl_fed.protocol.keys import Roster, load_signing_key, public_key_b64
from procs import MARKER, command_line
from procs import marked_processes as _marked

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.toml"


def _assert_no_leftovers(marker: str, patience_s: float = 20.0) -> None:
    deadline = time.monotonic() + patience_s
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "processes outlived simulate: " + "; ".join(command_line(p)[:200] for p in left)


def _simulate(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, str]:
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{MARKER: marker, "HACRL_FED_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"})
    proc = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "simulate", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, marker


def _check_export(path: str, system_prompt: str) -> None:
    """A plain Hugging Face directory that says how it was prompted (tests/worker/test_export_prompt.py checks the
    rendering): ``generate`` takes the tokenizer, as a plain-template export's generation config has stop strings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = json.loads((Path(path) / "hacrl_fed_prompt.json").read_text(encoding="utf-8"))
    assert prompt["system_prompt"] == system_prompt
    ids = tok.apply_chat_template(prompt["example"]["messages"], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id, tokenizer=tok)
    assert out.shape[1] == ids.shape[1] + 2


def test_tiny_simulation_end_to_end(tmp_path):
    proc, marker = _simulate(["--config", str(TINY), "--output-dir", str(tmp_path / "runs"), "--no-progress"], tmp_path)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-4000:]
    _assert_no_leftovers(marker)
    (run_dir,) = (tmp_path / "runs").iterdir()
    cfg = load_config(TINY, SimulateConfig)
    names = sorted(a.name for a in cfg.agents)

    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"event":"step"' in x]
    assert [s["step"] for s in steps] == list(range(1, cfg.run.steps + 1))
    for s in steps:
        assert sorted(s["agents"]) == names and all(a["status"] == "trained" for a in s["agents"].values())
        for k, a in s["agents"].items():  # each learner trained on the peer's rollouts too
            assert set(a["per_source"]) == set(names), (k, a["per_source"])

    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps_done"] == cfg.run.steps and sorted(report["agents"]) == names
    for name, a in report["agents"].items():
        assert a["accuracy_before"] is not None and a["accuracy_after"] is not None
        assert a["wire_bytes_per_step"] > 0 and a["weight_bytes"] > a["wire_bytes_per_step"]
        assert a["peak_rss_bytes"] > 0 and a["load_s"] > 0
        assert Path(a["export_dir"]).parent == run_dir / name
        _check_export(a["export_dir"], next(c.model.system_prompt for c in cfg.agents if c.name == name))
        for s in report["steps"]:
            (peer,) = set(names) - {name}
            assert s["agents"][name]["ratios"][peer] > 0
    assert report["phases"]["steps_s"] > 0 and report["phases"]["total_s"] >= report["phases"]["run_s"]
    assert (run_dir / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (run_dir / "report.md").read_text()
    assert all(n in md for n in names) and "plot.png" in md
    assert "held-out accuracy" in output and str(run_dir / "report.md") in output
    assert "disk: this run will write ≈ " in output and "exported models" in output
    for name in names:                                   # the workers' status files, last phase after the export
        assert json.loads((run_dir / name / "status.json").read_text())["phase"] == "idle"


def test_ctrl_c_stops_every_process(tmp_path):
    proc, marker = _simulate(["--config", str(TINY), "--output-dir", str(tmp_path / "runs"), "--no-progress"], tmp_path)
    try:
        deadline = time.monotonic() + 300
        metrics = None
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = next((tmp_path / "runs").glob("*/metrics.jsonl"), None)
            if metrics is not None and metrics.stat().st_size > 0:  # the ServerApp runs: every process is up
                break
            time.sleep(0.5)
        assert metrics is not None and proc.poll() is None, "the run did not start"
        assert len(_marked(marker)) >= 6  # simulate, superlink, 2 workers, 2 supernodes (+ Flower's own)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT
    _assert_no_leftovers(marker)


def test_default_config_is_examples_default():
    assert load_config(ROOT / "examples" / "default.toml", SimulateConfig) == default_config()
    names = {a.model.name_or_path for a in default_config().agents}
    assert names == {"smollm2-135m-instruct", "gemma3-270m"}


def test_prepare_run_writes_keys_roster_and_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(TINY, SimulateConfig)
    cfg.agents[1].model.device = "cuda:1"
    layout = prepare_run(cfg, output_dir="out")
    assert layout.run_dir.parent == tmp_path / "out" and layout.run_dir.name.startswith("tiny-")
    roster = Roster.load(layout.run_dir / "keys" / "roster.toml")
    assert sorted(roster) == sorted(a.name for a in cfg.agents)
    for agent in cfg.agents:
        client = layout.clients[agent.name]
        key = load_signing_key(client.agent.private_key)
        assert public_key_b64(roster.public_key(agent.name)) == public_key_b64(key)
        on_disk = tomllib.loads((layout.run_dir / agent.name / "client.resolved.toml").read_text())
        assert on_disk["agent"]["model"]["device"] == client.agent.model.device
        assert client.insecure and client.output_dir == str(layout.run_dir)
    assert layout.devices[cfg.agents[1].name] == "cuda:1"
    assert layout.clients[cfg.agents[1].name].agent.model.device == "cuda:0"  # after CUDA_VISIBLE_DEVICES pinning
    assert layout.server.superlink.insecure and not layout.server.superlink.node_auth
    assert layout.server.run.run_id == layout.run_dir.name
    with pytest.raises(ConfigError, match="exists already"):
        prepare_run(cfg, output_dir="out", run_name=layout.run_dir.name)


def test_prepare_run_with_tls_generates_certificates_and_node_keys(tmp_path):
    cfg = load_config(TINY, SimulateConfig)
    cfg.tls = True
    layout = prepare_run(cfg, output_dir=tmp_path)
    sl = layout.server.superlink
    assert not sl.insecure and sl.node_auth and Path(sl.ca_cert).is_file() and Path(sl.server_cert).is_file()
    for client in layout.clients.values():
        assert not client.insecure and client.root_certificates == sl.ca_cert and Path(client.node_key).is_file()


def test_prepare_run_refuses_keys_it_would_ignore(tmp_path):
    cfg = load_config(TINY, SimulateConfig)
    cfg.agents[0].private_key = str(tmp_path / "mine.key")
    with pytest.raises(ConfigError, match=r"agents\[0\]\.private_key"):
        prepare_run(cfg, output_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_worker_env_pins_devices():
    base = {"PATH": "/bin"}
    assert worker_env("cuda:1", cpu_workers=0, base=base)["CUDA_VISIBLE_DEVICES"] == "1"
    assert worker_env("cuda", cpu_workers=0, base=base)["CUDA_VISIBLE_DEVICES"] == "0"
    inherited = dict(base, CUDA_VISIBLE_DEVICES="4,6")
    assert worker_env("cuda:1", cpu_workers=0, base=inherited)["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(ConfigError, match="only 2 GPU"):
        worker_env("cuda:2", cpu_workers=0, base=inherited)
    cpu = worker_env("cpu", cpu_workers=2, base=base)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    assert worker_env("cpu", cpu_workers=2, base=dict(base, OMP_NUM_THREADS="7"))["OMP_NUM_THREADS"] == "7"


def _step(step: int, acc: dict[str, float], wire: dict[str, int]) -> dict:
    agents = {}
    for k in acc:
        per_source = {j: {"capability_ratio": acc[j] / acc[k], "s_mean": 0.9 + step / 100, "clip_low": 0.25,
                          "clip_high": 0.0, "rows": 8.0, "grad_frac": 0.25 * step, "s_min": 0.5,
                          "s_max": 5000.0} for j in acc}
        agents[k] = {"status": "trained", "accuracy": acc[k], "capability": acc[k], "bytes_in": wire[k] // 2,
                     "bytes_out": wire[k] - wire[k] // 2, "per_source": per_source, "generate_s": 2.0, "train_s": 3.0,
                     "train": {"rss_bytes": 1e9 + step}, "generate": {"rss_bytes": 9e8}}
    return {"event": "step", "run_id": "r", "step": step, "trained": True, "agents": agents,
            "timing": {"step_s": 10.0, "generate_s": 4.0, "train_s": 5.0, "verify_s": 0.5, "overhead_s": 0.5}}


def test_report_from_metrics(tmp_path):
    from hacrl_fed.report.run_report import build_report, render_markdown

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.safetensors").write_bytes(b"\0" * 40_000)
    records = [
        {"event": "run_start", "run_id": "r", "step": 0},
        {"event": "eval", "step": 0, "eval_s": 7.0, "prompts": 4, "agents": {"a": {"avg@1": 0.25}, "b": {"avg@1": 0.5}}},
        _step(1, {"a": 0.2, "b": 0.4}, {"a": 1000, "b": 3000}),
        _step(2, {"a": 0.3, "b": 0.6}, {"a": 3000, "b": 1000}),
        {"event": "eval", "step": 2, "eval_s": 6.0, "prompts": 4, "agents": {"a": {"avg@1": 0.75}, "b": {"error": "boom"}}},
        {"event": "run_end", "run_id": "r", "steps": 2, "skipped_steps": 0},
    ]
    report = build_report(records, run_dir=tmp_path, phases={"run_s": 40.0},
                          agents={"a": {"export_dir": str(tmp_path / "a"), "peak_rss_bytes": 5}, "b": {}})
    a, b = report["agents"]["a"], report["agents"]["b"]
    assert (a["accuracy_before"], a["accuracy_after"], a["accuracy_delta"]) == (0.25, 0.75, 0.5)
    assert b["accuracy_before"] == 0.5 and b["accuracy_after"] is None and report["evals"][-1]["errors"] == {"b": "boom"}
    assert a["wire_bytes_per_step"] == 2000 and a["weight_bytes"] == 40_000 and a["weights_per_wire"] == 20
    assert b["weight_bytes"] is None and b["weights_per_wire"] is None
    assert a["final_capability"] == 0.3 and a["steps_trained"] == 2 and a["max_step_rss_bytes"] == 1e9 + 2
    s2 = report["steps"][1]["agents"]["a"]
    assert s2["ratios"] == {"b": pytest.approx(2.0)} and s2["cross"]["b"]["s_mean"] == pytest.approx(0.92)
    phases = report["phases"]
    assert (phases["eval_before_s"], phases["eval_after_s"], phases["steps_s"]) == (7.0, 6.0, 20.0)
    assert phases["run_other_s"] == pytest.approx(40.0 - 20.0 - 13.0)
    # 8 peer rows per step, 2 of them with a gradient at step 1 and 4 at step 2
    assert a["peer_grad_frac"] == pytest.approx(6 / 16) and s2["cross"]["b"]["grad_frac"] == 0.5
    md = render_markdown(report)
    assert "+50.0 pt" in md and "b→a" in md and "37.5%" in md
    from hacrl_fed.report.run_report import plot_report, summary_table

    assert plot_report(report, tmp_path / "plot.png").stat().st_size > 0
    assert summary_table(report).columns[4].header == "peer grad"


def test_steps_overrides_run_steps_before_validation_so_a_schedule_spans_the_shorter_run(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import hacrl_fed.launch.preflight as preflight
    import hacrl_fed.launch.simulate as simulate
    from hacrl_fed.cli import app

    config = tmp_path / "sched.toml"
    config.write_text(TINY.read_text().replace("optim = { lr = 1e-4 }",
                                               "optim = { lr = 1e-4, lr_scheduler_type = \"cosine\" }", 1))
    seen = []
    monkeypatch.setattr(preflight, "check_simulate", lambda cfg, output_dir: None)
    monkeypatch.setattr(simulate, "run_simulation", lambda cfg, **kw: seen.append(cfg) or simulate.SimulationResult(
        run_dir=tmp_path, exit_code=0))
    runner = CliRunner()
    for args in ([], ["--config", str(config)]):
        result = runner.invoke(app, ["simulate", *args, "--steps", "1", "--no-progress"])
        assert result.exit_code == 0, result.output
    assert [c.run.steps for c in seen] == [1, 1]
    assert seen[1].agents[0].optim.schedule_steps == 1            # from run.steps, as if the file said 1
    assert load_config(config, SimulateConfig).agents[0].optim.schedule_steps == \
        load_config(config, SimulateConfig).run.steps == 2
    for bad in (["--steps", "0"], ["--resume", str(tmp_path), "--steps", "2"]):
        result = runner.invoke(app, ["simulate", *bad, "--no-progress"])
        assert result.exit_code == 2 and not seen[2:], result.output
    assert "drop --config/--tls/--output-dir/--run-name/--steps" in result.stderr
