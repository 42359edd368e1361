"""Typed TOML configs: good files load; every bad file fails with ConfigError naming file, key path and type."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hacrl_fed.config import (
    ClientConfig,
    ConfigError,
    ServerConfig,
    SimulateConfig,
    load_config,
    parse_config,
)

ROOT = Path(__file__).resolve().parents[1]

SERVER_TOML = """
roster = "roster.toml"

[run]
run_id = "demo-1"
steps = 3
prompts_per_step = 4
samples_per_prompt = 2
max_batch_bytes = 1048576

[run.sampling]
temperature = 0.7
max_new_tokens = 64

[run.data]
source = "file"
path = "problems.jsonl"

[superlink]
port = 18100
ca_cert = "tls/ca.crt"
server_cert = "tls/server.pem"
server_key = "tls/server.key"
"""

CLIENT_TOML = """
superlink = "coord.example.org:9092"
root_certificates = "ca.crt"
node_key = "keys/alice.node.key"

[agent]
name = "alice"
private_key = "keys/alice.ed25519.key"
roster = "roster.toml"

[agent.model]
name_or_path = "smollm2-135m-instruct"
lora_rank = 8

[agent.optim]
lr = 2e-5
betas = [0.9, 0.95]
"""

SIMULATE_TOML = """
[run]
steps = 2

[[agents]]
name = "alice"
model = { name_or_path = "tiny-llama-bpe" }

[[agents]]
name = "bob"
model = { name_or_path = "tiny-gemma-unigram", chat_template = "plain" }
optim = { mini_batch_rows = 8 }
"""


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def error_of(tmp_path: Path, text: str, model) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p, model)
    assert str(p) in str(e.value)
    return str(e.value)


# --------------------------------------------------------------------------- good files


def test_good_configs_load(tmp_path: Path):
    server = load_config(write(tmp_path, SERVER_TOML), ServerConfig)
    assert server.run.run_id == "demo-1" and server.run.steps == 3 and server.run.sampling.temperature == 0.7
    assert server.run.data.path == "problems.jsonl" and server.superlink.node_auth is True
    assert server.superlink.port == 18100 and server.run.max_batch_bytes == 1 << 20

    client = load_config(write(tmp_path, CLIENT_TOML), ClientConfig)
    assert client.agent.name == "alice" and client.agent.model.lora_rank == 8
    assert client.agent.optim.betas == (0.9, 0.95) and client.agent.optim.lr == 2e-5

    sim = load_config(write(tmp_path, SIMULATE_TOML), SimulateConfig)
    assert [a.name for a in sim.agents] == ["alice", "bob"]
    assert sim.agents[1].model.chat_template == "plain" and sim.agents[1].optim.mini_batch_rows == 8
    assert sim.agents[0].optim.mini_batch_rows == 64  # defaults fill the rest


def _shipped_configs() -> list[Path]:
    found = []
    for folder in ("examples", "server", "client", "benchmarks/configs"):
        found += sorted((ROOT / folder).glob("**/*.toml"))
    # runs/ holds what the how-tos' commands write (Flower's own config.toml among it), not shipped configs
    return [p for p in found if "roster" not in p.name and "runs" not in p.relative_to(ROOT).parts]


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_example_configs_load(path: Path):
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    if "agents" in data and isinstance(data["agents"], list):
        model = SimulateConfig
    elif "agent" in data:
        model = ClientConfig
    elif "roster" in data or "superlink" in data:
        model = ServerConfig
    else:
        pytest.skip(f"{path.name} is not a hacrl-fed config")
    load_config(path, model)


# --------------------------------------------------------------------------- bad files


def test_unknown_key_names_the_key_path(tmp_path: Path):
    msg = error_of(tmp_path, SERVER_TOML.replace("steps = 3", "stepz = 3"), ServerConfig)
    assert "run.stepz: unknown key" in msg
    msg = error_of(tmp_path, SIMULATE_TOML.replace("optim = {", "optim = { lr_typo = 1, "), SimulateConfig)
    assert "agents[1].optim.lr_typo: unknown key" in msg


@pytest.mark.parametrize("old, new, path, expected", [
    ("steps = 3", 'steps = "ten"', "run.steps", "expected int"),
    ("temperature = 0.7", 'temperature = "hot"', "run.sampling.temperature", "expected float"),
    ('roster = "roster.toml"', "roster = 5", "roster", "expected string"),
    ("[run.sampling]\n", "[run.sampling]\nnot_a_table = 1\n", "run.sampling.not_a_table", "unknown key"),
])
def test_mistyped_key_names_path_and_expected_type(tmp_path: Path, old, new, path, expected):
    assert old in SERVER_TOML
    msg = error_of(tmp_path, SERVER_TOML.replace(old, new), ServerConfig)
    assert f"{path}: " in msg and expected in msg


def test_mistyped_nested_list_items(tmp_path: Path):
    msg = error_of(tmp_path, CLIENT_TOML.replace("lr = 2e-5", 'lr = "fast"'), ClientConfig)
    assert "agent.optim.lr:" in msg and "expected float" in msg and "'fast'" in msg
    msg = error_of(tmp_path, CLIENT_TOML.replace("betas = [0.9, 0.95]", "betas = [0.9]"), ClientConfig)
    assert "agent.optim.betas[1]: item is missing" in msg
    msg = error_of(tmp_path, SIMULATE_TOML.replace("[run]\n", "[run]\nsampling = 5\n"), SimulateConfig)
    assert "run.sampling:" in msg and "expected table" in msg


def test_constraint_and_validator_messages(tmp_path: Path):
    msg = error_of(tmp_path, SERVER_TOML.replace("steps = 3", "steps = 0"), ServerConfig)
    assert "run.steps: Input should be greater than 0 (got 0)" in msg
    msg = error_of(tmp_path, SERVER_TOML.replace('path = "problems.jsonl"', ""), ServerConfig)
    assert "run.data: data.path is required" in msg and "value_error" not in msg
    msg = error_of(tmp_path, SIMULATE_TOML.replace('name = "bob"', 'name = "alice"'), SimulateConfig)
    assert "must be unique" in msg and "alice" in msg
    msg = error_of(tmp_path, SIMULATE_TOML.replace('name = "bob"', 'name = "b o b"'), SimulateConfig)
    assert "agents[1].name" in msg


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path):
    text = SERVER_TOML.replace("steps = 3", 'steps = "x"').replace("port = 18100", "port = 70000\nhost_typo = 1")
    lines = error_of(tmp_path, text, ServerConfig).splitlines()
    assert len(lines) == 3
    assert any("run.steps" in l for l in lines) and any("superlink.port" in l and "65535" in l for l in lines)
    assert any("superlink.host_typo: unknown key" in l for l in lines)


def test_server_needs_a_superlink_section_and_other_errors_stay_visible(tmp_path: Path):
    """A missing [superlink] is reported as such and does not hide the other mistakes."""
    text = SERVER_TOML.split("[superlink]")[0].replace("steps = 3", "stepz = 3")
    msg = error_of(tmp_path, text, ServerConfig)
    assert "superlink: required key is missing" in msg and "run.stepz: unknown key" in msg
    msg = error_of(tmp_path, text.replace("stepz", "steps") + "[superlink]\ninsecure = true\n", ServerConfig)
    assert "superlink: superlink.node_auth needs TLS" in msg
    ok = load_config(write(tmp_path, text.replace("stepz", "steps") + "[superlink]\ninsecure = true\nnode_auth = false\n"),
                     ServerConfig)
    assert ok.superlink.insecure


def test_missing_file_bad_toml_and_unreadable(tmp_path: Path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml", ServerConfig)
    msg = error_of(tmp_path, "[run\nsteps = 3\n", ServerConfig)
    assert "not valid TOML" in msg and "line 1" in msg
    msg = error_of(tmp_path, 'roster = "a"\nroster = "b"\n', ServerConfig)  # duplicate key is invalid TOML
    assert "not valid TOML" in msg
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('roster = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, ServerConfig)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path, ServerConfig)  # a directory


def test_parse_config_names_its_source():
    with pytest.raises(ConfigError, match=r"^cli: run\.steps: Input should be greater than 0"):
        parse_config({"agents": [{"name": "a", "model": {"name_or_path": "x"}}], "run": {"steps": -2}},
                     SimulateConfig, source="cli")
    cfg = parse_config({"agents": [{"name": "a", "model": {"name_or_path": "x"}}]}, SimulateConfig)
    assert cfg.agents[0].model.name_or_path == "x" and cfg.run.steps == 10


def test_mixed_precision_and_behaviour_logprob_options():
    from hacrl_fed.config import ModelConfig

    cfg = ModelConfig(name_or_path="m")
    assert (cfg.autocast, cfg.behaviour_logprobs) == ("none", "auto")
    assert ModelConfig(name_or_path="m", autocast="bfloat16", behaviour_logprobs="generation").autocast == "bfloat16"
    with pytest.raises(ValueError, match="model.autocast = 'bfloat16' needs model.dtype = 'float32'"):
        ModelConfig(name_or_path="m", dtype="bfloat16", autocast="bfloat16")
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        ModelConfig(name_or_path="m", behaviour_logprobs="vllm")


@pytest.mark.parametrize("name", ["tasks_near_family.toml", "tasks_families_trained.toml"])
def test_task_ablations_differ_from_tasks_toml_only_in_their_tasks(name: str):
    """The ablation configs of benchmarks/configs/ are copies of examples/tasks.toml whose cells pair with its
    grid: only the run id, the number of training items and which tasks are trained or held out may differ."""
    base = tomllib.loads((ROOT / "examples" / "tasks.toml").read_text(encoding="utf-8"))
    ablation = tomllib.loads((ROOT / "benchmarks" / "configs" / name).read_text(encoding="utf-8"))
    for cfg in (base, ablation):
        del cfg["run"]["run_id"]
        for key in ("num_problems", "tasks", "eval_tasks"):
            cfg["run"]["data"].pop(key, None)
    assert ablation == base
