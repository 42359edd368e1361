"""`hacrl-fed server` / `hacrl-fed client`: bad input ends with one line and exit code 2, before
anything is started or loaded; path resolution and the site layout defaults."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.config import ClientConfig, ServerConfig
from hacrl_fed.launch.client_cmd import fill_site_layout, resolve_client_config
from hacrl_fed.launch.server_cmd import resolve_server_config
from procs import lay_out_site

runner = CliRunner()


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_client_needs_a_config_or_model_and_name():
    result = runner.invoke(app, ["client", "--name", "alice"])
    assert result.exit_code == 2
    assert "give --config client.toml, or at least --model and --name" in _error_line(result)


def test_client_without_tls_material_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["client", "--name", "alice", "--model", "tiny-llama-bpe", "--server", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "TLS needs root_certificates" in _error_line(result)
    assert not (tmp_path / "runs").exists()  # nothing was started or written


def test_client_rejects_unknown_config_keys(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[agent]\nname = "a"\nmodle = 1\n[agent.model]\nname_or_path = "x"\n')
    result = runner.invoke(app, ["client", "--config", str(cfg)])
    assert result.exit_code == 2 and "agent.modle: unknown key" in _error_line(result)


def test_server_config_errors_are_one_line(tmp_path, federation, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["server", "--config", "missing.toml"])
    assert result.exit_code == 2 and "no such config file" in _error_line(result)

    roster = tmp_path / "roster.toml"
    roster.write_text("".join(line for line in federation.roster_path.read_text().splitlines(keepends=True)
                              if not line.startswith("node_key")))
    (tmp_path / "s.toml").write_text('roster = "roster.toml"\n[superlink]\ninsecure = true\nnode_auth = true\n')
    result = runner.invoke(app, ["server", "--config", "s.toml"])
    assert result.exit_code == 2 and "node_auth needs TLS" in _error_line(result)

    (tmp_path / "s.toml").write_text('roster = "roster.toml"\n[superlink]\nca_cert = "a"\nserver_cert = "b"\n'
                                     'server_key = "c"\n')
    result = runner.invoke(app, ["server", "--config", "s.toml"])
    assert result.exit_code == 2 and "node_key missing for alice, bob, carol, mallory" in _error_line(result)


def test_paths_are_resolved_against_the_working_directory(tmp_path):
    cfg = ServerConfig.model_validate({"roster": "r.toml", "superlink": {"ca_cert": "tls/ca.crt",
                                       "server_cert": "tls/s.pem", "server_key": "tls/s.key"},
                                       "run": {"run_id": "x", "output_dir": "out",
                                               "data": {"source": "file", "path": "d.jsonl"}}})
    res = resolve_server_config(cfg, tmp_path)
    assert res.roster == str(tmp_path / "r.toml") and res.superlink.ca_cert == str(tmp_path / "tls" / "ca.crt")
    assert res.superlink.database == str(tmp_path / "out" / "x" / "superlink.db")
    assert res.run.data.path == str(tmp_path / "d.jsonl")
    assert cfg.roster == "r.toml"  # the input is not modified


def test_site_layout_fills_only_unset_paths_that_exist(tmp_path):
    (tmp_path / "keys").mkdir()
    for name in ("keys/alice.ed25519.key", "keys/alice.node.key", "roster.toml"):
        (tmp_path / name).write_text("x")
    cfg = ClientConfig.model_validate({"agent": {"name": "alice", "model": {"name_or_path": "m"},
                                                 "roster": "mine.toml"}})
    filled = resolve_client_config(fill_site_layout(cfg, tmp_path), tmp_path)
    assert filled.agent.private_key == str(tmp_path / "keys" / "alice.ed25519.key")
    assert filled.node_key == str(tmp_path / "keys" / "alice.node.key")
    assert filled.agent.roster == str(tmp_path / "mine.toml")  # set explicitly: kept
    assert filled.root_certificates is None  # no ca.crt there


@pytest.fixture
def site(tmp_path, federation, monkeypatch):
    """A site directory in the documented layout for alice: keys/, roster.toml, ca.crt."""
    lay_out_site(tmp_path, federation)
    (tmp_path / "ca.crt").write_text("not checked before the connection")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _client(*args: str):
    return runner.invoke(app, ["client", "--server", "127.0.0.1:1", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "zoe", "--model", "tiny-llama-bpe"], "agent 'zoe' is not in the roster"),
    (["--name", "alice", "--model", "./models/nope"],
     "no such model directory or file: ./models/nope (known aliases: "),
    (["--name", "alice", "--model", "tiny-llama-bpe", "--node-key", "keys/bob.node.key"],
     "is not the SuperNode key of 'alice'"),
    (["--name", "alice", "--model", "tiny-llama-bpe", "--node-key", "keys/none.key"], "node_key: "),
])
def test_client_checks_the_agent_before_starting_anything(site, args, message):
    result = _client(*args)
    assert result.exit_code == 2, result.output
    assert message in _error_line(result)
    assert not (site / "runs").exists()  # no worker started, no model loaded, nothing written


def test_client_checks_signing_and_node_keys_exist(site):
    (site / "keys" / "alice.node.key").unlink()
    result = _client("--name", "alice", "--model", "tiny-llama-bpe")
    assert result.exit_code == 2 and "no SuperNode key for 'alice'" in _error_line(result)
    shutil.copy(site / "keys" / "bob.ed25519.key", site / "keys" / "alice.ed25519.key")
    result = _client("--name", "alice", "--model", "tiny-llama-bpe", "--node-key", "keys/alice.node.key")
    assert result.exit_code == 2 and "node_key: " in _error_line(result)
    shutil.copy(site / "keys" / "bob.node.key", site / "keys" / "alice.node.key")
    result = _client("--name", "alice", "--model", "tiny-llama-bpe", "--insecure")
    assert result.exit_code == 2 and "is not the signing key of 'alice'" in _error_line(result)
    assert not (site / "runs").exists()


def test_attaching_to_a_worker_needs_its_token_file(site):
    """Issue 25 D3: the client reads the worker token the attached worker uses (default
    runs/<agent>/worker.token); a missing file or one others can read stops it before anything starts."""
    args = ("--name", "alice", "--model", "tiny-llama-bpe", "--worker-address", "127.0.0.1:9")
    result = _client(*args)
    assert result.exit_code == 2 and "--worker-token-file: " in _error_line(result)
    assert "runs/alice/worker.token: no worker token file" in _error_line(result)
    token = site / "shared" / "w.token"
    token.parent.mkdir()
    token.write_text("k" * 43 + "\n")
    token.chmod(0o644)
    result = _client(*args, "--worker-token-file", "shared/w.token")
    assert result.exit_code == 2 and "accessible to other users" in _error_line(result)
    assert not (site / "runs").exists()


def test_config_and_usage_errors_exit_2_in_every_command(site):
    data = site / "d.jsonl"
    data.write_text('{"id": "1", "problem": "1+1?", "answer": "2"}\n')
    result = runner.invoke(app, ["eval", "--model", "./no/such/dir", "--data", str(data)])
    assert result.exit_code == 2 and "no such model directory or file" in _error_line(result)
    result = runner.invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", "missing.jsonl"])
    assert result.exit_code == 2 and "no such data file" in _error_line(result)
    (site / "c.toml").write_text('[agent]\nname = "alice"\nprivate_key = "keys/alice.ed25519.key"\n'
                                 'roster = "roster.toml"\n[agent.model]\nname_or_path = "./no/such/dir"\n')
    result = runner.invoke(app, ["worker", "--config", "c.toml"])
    assert result.exit_code == 2 and "no such model directory or file" in _error_line(result)
    result = runner.invoke(app, ["keys", "gen", "--name", "bad name", "--out", "k"])
    assert result.exit_code == 2 and _error_line(result)


def test_worker_that_fails_to_load_ends_the_client_with_one_clear_line(site):
    import subprocess
    import sys

    (site / "empty-model").mkdir()  # exists, so the pre-flight passes; the worker cannot load it
    res = subprocess.run([sys.executable, "-m", "hacrl_fed.cli", "client", "--name", "alice", "--model", "./empty-model",
                          "--server", "127.0.0.1:9"], cwd=site, capture_output=True, text=True, timeout=180)
    assert res.returncode == 1, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if " ERROR hacrl_fed.client: " in line]
    assert len(errors) == 1 and "worker exited with code 1 before it was ready (log: " in errors[0], res.stderr
    assert "cannot load model" in errors[0] and "worker worker" not in res.stderr + res.stdout
    assert "[worker] error: cannot load model" in res.stdout  # the worker's own line, teed to the terminal
    assert not (site / "runs" / "alice" / "logs" / "supernode.log").exists()  # no SuperNode was started
