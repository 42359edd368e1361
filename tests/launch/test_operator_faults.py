"""Faults and operator mistakes at the commands: ports in use, two clients in one site directory, a site
holding another run's checkpoints, configs that point at files or models that are not there, and a
SIGKILLed `hacrl-fed server` — each stopped early with one line naming the cause, nothing left running."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from procs import MARKER, command_line, lay_out_site
from procs import marked_processes as _marked

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def _listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def _cli(args, *, cwd, timeout=120, marker=None, **kw):
    env = dict(os.environ, **({MARKER: marker} if marker else {}))
    return subprocess.run([sys.executable, "-m", "hacrl_fed.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


@pytest.fixture
def site(tmp_path, federation, monkeypatch):
    """A site directory laid out as the client how-to says: keys/, roster.toml."""
    lay_out_site(tmp_path, federation)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _server_toml(tmp_path, federation, port: int, **run) -> Path:
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in run.items())
    path = tmp_path / "server.toml"
    path.write_text(f'roster = "{federation.roster_path}"\n[superlink]\ninsecure = true\nnode_auth = false\n'
                    f'port = {port}\n[run]\noutput_dir = "{tmp_path / "runs"}"\njoin_timeout_s = 600\n{body}',
                    encoding="utf-8")
    return path


# --------------------------------------------------------------------------- ports


def test_server_on_a_busy_port_fails_at_once_naming_port_and_holder(tmp_path, federation):
    sock, port = _listener()
    try:
        t0 = time.monotonic()
        res = _cli(["server", "--config", str(_server_toml(tmp_path, federation, port))], cwd=tmp_path, timeout=60)
        took = time.monotonic() - t0
    finally:
        sock.close()
    assert res.returncode == 2, res.stderr[-2000:]
    lines = _error_lines(res.stderr)
    assert len(lines) == 1 and f"superlink.port: 127.0.0.1:{port} is already in use by pid {os.getpid()}" in lines[0]
    assert took < 30 and not (tmp_path / "runs").exists()


def test_a_port_taken_after_the_check_is_not_mistaken_for_the_superlink(tmp_path):
    """The started process must be the one listening: another program on the port is named, not used."""
    from hacrl_fed.launch.supervise import Supervisor, wait_for_tcp

    sock, port = _listener()
    try:
        with Supervisor(tmp_path / "logs") as sup:
            proc = sup.start("idle", [sys.executable, "-c", "import time; time.sleep(30)"])
            with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} is in use by pid {os.getpid()}"):
                wait_for_tcp("127.0.0.1", port, 2.0, alive=proc.alive, owner=proc.pid)
    finally:
        sock.close()


def test_client_on_a_busy_port_fails_at_once(site):
    sock, port = _listener()
    try:
        result = runner.invoke(app, ["client", "--name", "alice", "--model", "tiny-llama-bpe", "--insecure",
                                     "--server", "127.0.0.1:9", "--port", str(port)])
    finally:
        sock.close()
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and f"--port {port}: 127.0.0.1:{port} is already in use by pid {os.getpid()}" in lines[0]
    assert not (site / "runs").exists()


# --------------------------------------------------------------------------- one site, one client


def test_a_second_client_in_the_same_site_directory_refuses_naming_the_first(site):
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{MARKER: marker})
    first = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "client", "--name", "alice", "--model",
                              "tiny-llama-bpe", "--insecure", "--server", "127.0.0.1:9"], cwd=site, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = site / "runs" / "alice" / ".lock"
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
            assert first.poll() is None
            time.sleep(0.2)
        second = _cli(["client", "--name", "alice", "--model", "tiny-llama-bpe", "--insecure", "--server",
                       "127.0.0.1:9"], cwd=site, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = _error_lines(second.stderr)
        assert len(lines) == 1 and f"in use by pid {first.pid}" in lines[0] and "site directory of 'alice'" in lines[0]
        assert "client" in lines[0]
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    deadline = time.monotonic() + 20
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _marked(marker)


def test_a_site_holding_another_runs_checkpoints_refuses_to_start(site):
    ck = site / "runs" / "alice" / "checkpoints" / "step-00000003"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text('{"format": 2, "step": 3, "run_id": "last-week", "lora": false}')
    (ck.parent / "latest").write_text("step-00000003\n")
    result = runner.invoke(app, ["client", "--name", "alice", "--model", "tiny-llama-bpe", "--insecure",
                                 "--server", "127.0.0.1:9", "--run-id", "this-week"])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "holds checkpoints of run 'last-week' (step 3)" in lines[0] and "this-week" in lines[0]
    assert not (site / "runs" / "alice" / "logs").exists()


# --------------------------------------------------------------------------- configs checked first


def test_no_shipped_config_points_outside_the_repository():
    keys = {"path", "eval_path", "roster", "private_key", "node_key", "root_certificates", "ca_cert", "server_cert",
            "server_key", "output_dir", "checkpoint_dir", "cache_dir", "database"}
    bad = []

    def walk(node, where, source):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{where}.{k}" if where else k, source)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]", source)
        elif isinstance(node, str):
            key = where.rsplit(".", 1)[-1]
            path_like = key in keys or (key == "name_or_path" and node.startswith(("./", "../", "/", "~")))
            if path_like:
                resolved = (ROOT / Path(node).expanduser()).resolve()
                if Path(node).expanduser().is_absolute() or not resolved.is_relative_to(ROOT):
                    bad.append(f"{source.relative_to(ROOT)}: {where} = {node!r}")

    sources = [p for d in ("examples", "server", "client") for p in sorted((ROOT / d).glob("*.toml"))]
    assert sources
    for source in sources:
        walk(tomllib.loads(source.read_text(encoding="utf-8")), "", source)
    assert not bad, bad


def test_the_gsm8k_example_as_shipped_fails_at_once_naming_the_missing_file(tmp_path):
    """Run from a directory without the data: one line, exit 2, no process started, no run directory."""
    config = tmp_path / "gsm8k.toml"
    shutil.copy(ROOT / "examples" / "gsm8k.toml", config)
    t0 = time.monotonic()
    res = _cli(["simulate", "--config", str(config), "--no-progress", "--output-dir", str(tmp_path / "runs")],
               cwd=tmp_path, timeout=90)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = _error_lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: run.data.path: "), res.stderr
    assert str(tmp_path / "data" / "gsm8k") in lines[0] and "no such data file" in lines[0]
    assert time.monotonic() - t0 < 60 and not (tmp_path / "runs").exists()


def test_a_wrong_model_name_in_simulate_fails_before_any_worker_starts(tmp_path):
    text = (ROOT / "examples" / "tiny.toml").read_text(encoding="utf-8").replace('"tiny-gemma-unigram"',
                                                                                '"./models/no-such-model"')
    (tmp_path / "tiny.toml").write_text(text, encoding="utf-8")
    result = runner.invoke(app, ["simulate", "--config", str(tmp_path / "tiny.toml"), "--no-progress",
                                 "--output-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "agents[1].model.name_or_path (gemma-unigram): no such model" in lines[0]
    assert "./models/no-such-model" in lines[0] and not (tmp_path / "runs").exists()


def _simulate_tiny_with(tmp_path, old: str, new: str) -> str:
    """``hacrl-fed simulate`` on ``examples/tiny.toml`` with ``old`` replaced by ``new``: its one error line (exit 2,
    nothing written)."""
    text = (ROOT / "examples" / "tiny.toml").read_text(encoding="utf-8")
    assert old in text
    (tmp_path / "tiny.toml").write_text(text.replace(old, new), encoding="utf-8")
    result = runner.invoke(app, ["simulate", "--config", str(tmp_path / "tiny.toml"), "--no-progress",
                                 "--output-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and not (tmp_path / "runs").exists(), lines
    return lines[0]


def test_a_vllm_agent_in_simulate_without_vllm_fails_before_any_worker_starts(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    line = _simulate_tiny_with(
        tmp_path, 'model = { name_or_path = "tiny-gemma-unigram", max_response_tokens = 32 }',
        'model = { name_or_path = "tiny-gemma-unigram", max_response_tokens = 32, engine = "vllm", device = "cuda" }')
    assert "agents[1].model.engine (gemma-unigram): engine 'vllm' needs the vllm package" in line


def test_an_unloadable_reward_function_in_simulate_fails_before_any_worker_starts(tmp_path):
    line = _simulate_tiny_with(tmp_path, '[[agents]]\nname = "gemma-unigram"',
                               '[[agents]]\nname = "gemma-unigram"\nreward_funcs = [{ name = "site_rewards:missing" }]')
    assert "agents[1].reward_funcs (gemma-unigram): reward function 'site_rewards:missing'" in line
    assert "cannot import site_rewards" in line


def test_server_with_a_missing_data_file_fails_before_anything_starts(tmp_path, federation):
    from hacrl_fed.launch.supervise import free_port

    cfg = _server_toml(tmp_path, federation, free_port())
    cfg.write_text(cfg.read_text() + '[run.data]\nsource = "file"\npath = "data/train.jsonl"\n')
    result = runner.invoke(app, ["server", "--config", str(cfg)])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: run.data.path: ") and "train.jsonl" in lines[0]
    assert not (tmp_path / "runs").exists()


def _unknown_columns(tmp_path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i} + 1?", "a": str(i + 1)}) + "\n" for i in range(40)))
    return data


def test_a_data_file_with_unknown_columns_fails_simulate_before_anything_starts(tmp_path):
    """Pre-flight parses the first rows with the run's own loader: the cause in one line, exit 2, not a run that
    dies later without one."""
    data = _unknown_columns(tmp_path)
    line = _simulate_tiny_with(tmp_path, 'data = { source = "arithmetic", difficulty = 1, eval_size = 4 }',
                               f'data = {{ source = "file", path = "{data}", eval_size = 4 }}')
    assert line == f"error: run.data.path: {data}:1: no problem text: expected a 'problem', 'question' or " \
                   f"'prompt' column"


def test_a_data_file_with_unknown_columns_fails_the_server_before_anything_starts(tmp_path, federation):
    from hacrl_fed.launch.supervise import free_port

    data = _unknown_columns(tmp_path)
    cfg = _server_toml(tmp_path, federation, free_port())
    good = tmp_path / "ok.jsonl"
    good.write_text('{"id": "1", "problem": "1 + 1?", "answer": "2"}\n')
    cfg.write_text(cfg.read_text() + f'[run.data]\nsource = "file"\npath = "{good}"\neval_path = "{data}"\n')
    result = runner.invoke(app, ["server", "--config", str(cfg)])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: run.data.eval_path: {data}:1: no problem text")
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- orphans


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees via /proc")
def test_nothing_outlives_a_sigkilled_server(tmp_path, federation):
    from hacrl_fed.launch.supervise import free_port

    marker = uuid.uuid4().hex
    env = dict(os.environ, **{MARKER: marker})
    server = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "server", "--config",
                               str(_server_toml(tmp_path, federation, free_port()))], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the coordinator (ServerApp) runs its verifier pool, waiting for agents
            if any("multiprocessing.spawn" in command_line(p) for p in _marked(marker)):
                break
            assert server.poll() is None, "the server exited early"
            time.sleep(0.5)
        else:
            pytest.fail("no ServerApp verifier process started")
        time.sleep(1.5)  # the guardian has seen the whole tree
        for p in _marked(marker):  # a ServerApp too busy to notice its SuperLink is gone (here: stopped)
            if "flwr-serverapp" in command_line(p):
                with contextlib.suppress(psutil.Error):
                    p.suspend()
        server.kill()
        server.wait()
        t0 = time.monotonic()

        def left():  # the supervisor's guardian itself exits once everything else is gone
            lines = [command_line(p) for p in _marked(marker)]
            return [c[:100] for c in lines if c and "select.select" not in c]

        while left() and time.monotonic() < t0 + 30:
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert not left() and took < 5, f"outlived a SIGKILLed hacrl-fed server by {took:.1f} s: {left()}"
    finally:
        for p in _marked(marker):
            p.kill()


def test_resume_checks_the_data_again_before_anything_starts(tmp_path, monkeypatch):
    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.launch.simulate_setup import prepare_run

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "train.jsonl"
    data.write_text('{"id": "1", "problem": "1+1?", "answer": "2"}\n')
    cfg = load_config(ROOT / "examples" / "tiny.toml", SimulateConfig)
    cfg.run.data = cfg.run.data.model_copy(update={"source": "file", "path": str(data), "eval_size": 0})
    layout = prepare_run(cfg, output_dir=tmp_path / "runs", run_name="r1")
    data.unlink()
    result = runner.invoke(app, ["simulate", "--resume", str(layout.run_dir), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0] == f"error: run.data.path: {data}: no such data file (create it, or point " \
                                           f"run.data.path at yours)"
    assert not (layout.run_dir / "logs").exists()
