"""`hacrl-fed server` / `hacrl-fed client`: bad input ends with one line and a non-zero code, before
anything is started; path resolution and the site layout defaults."""

from __future__ import annotations

from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.config import ClientConfig, ServerConfig
from hacrl_fed.federation.client_cmd import fill_site_layout, resolve_client_config
from hacrl_fed.federation.server_cmd import resolve_server_config

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
    assert result.exit_code == 1
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
    assert result.exit_code == 1 and "no such config file" in _error_line(result)

    roster = tmp_path / "roster.toml"
    roster.write_text("".join(line for line in federation.roster_path.read_text().splitlines(keepends=True)
                              if not line.startswith("node_key")))
    (tmp_path / "s.toml").write_text('roster = "roster.toml"\n[superlink]\ninsecure = true\nnode_auth = true\n')
    result = runner.invoke(app, ["server", "--config", "s.toml"])
    assert result.exit_code == 1 and "node_auth needs TLS" in _error_line(result)

    (tmp_path / "s.toml").write_text('roster = "roster.toml"\n[superlink]\nca_cert = "a"\nserver_cert = "b"\n'
                                     'server_key = "c"\n')
    result = runner.invoke(app, ["server", "--config", "s.toml"])
    assert result.exit_code == 1 and "node_key missing for alice, bob, carol, mallory" in _error_line(result)


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
