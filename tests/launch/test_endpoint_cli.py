"""``hacrl-fed client --endpoint URL --api-model NAME``: what is checked before anything starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from procs import lay_out_site

runner = CliRunner()


@pytest.fixture
def site(tmp_path, federation, monkeypatch):
    """alice's site layout (keys/, roster.toml where alice is a learner), ca.crt."""
    lay_out_site(tmp_path, federation)
    (tmp_path / "ca.crt").write_text("not checked before the connection")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _error(*args: str) -> str:
    result = runner.invoke(app, ["client", "--server", "127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_an_endpoint_site_needs_the_rollout_only_role_in_the_roster(site):
    line = _error("--name", "alice", "--endpoint", "http://127.0.0.1:9/v1", "--api-model", "m")
    assert "lacks role = \"rollout_only\"" in line
    assert not (site / "runs").exists()


def test_model_and_endpoint_exclude_each_other_and_the_url_is_checked(site):
    assert "give one of them" in _error("--name", "alice", "--model", "tiny-llama-bpe", "--endpoint",
                                        "http://127.0.0.1:9/v1", "--api-model", "m")
    assert "agent.endpoint.url" in _error("--name", "alice", "--endpoint", "ftp://x", "--api-model", "m")


def test_the_api_key_variable_must_be_set(site, tmp_path, monkeypatch):
    roster = (tmp_path / "roster.toml").read_text()
    head, _, rest = roster.partition('[agents."alice"]')
    block, sep, tail = rest.partition("\n[")
    (tmp_path / "roster.toml").write_text(head + '[agents."alice"]' + block.rstrip("\n")
                                          + '\nrole = "rollout_only"\n' + (sep + tail if sep else ""))
    (tmp_path / "c.toml").write_text('[agent]\nname = "alice"\n[agent.model]\nname_or_path = "m"\n'
                                     '[agent.endpoint]\nurl = "http://127.0.0.1:9/v1"\n'
                                     'api_key_env = "NO_SUCH_KEY_VAR"\n')
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert "NO_SUCH_KEY_VAR" in _error("--config", "c.toml")


def test_simulate_refuses_an_endpoint_agent():
    from hacrl_fed.config import ConfigError, SimulateConfig
    from hacrl_fed.launch.simulate_setup import _check_agents

    cfg = SimulateConfig.model_validate({"agents": [
        {"name": "a", "model": {"name_or_path": "tiny-llama-bpe"}},
        {"name": "b", "model": {"name_or_path": "m"}, "endpoint": {"url": "http://127.0.0.1:9/v1"}}]})
    with pytest.raises(ConfigError, match=r"agents\[1\].endpoint: .*hacrl-fed client --endpoint"):
        _check_agents(cfg)
