"""The deployment kits (server/, client/): their how-tos name real commands and options, what they
create inside the clone is git-ignored, and the local trial config is small and loopback-only."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import typer

from hacrl_fed.cli import app
from hacrl_fed.config import ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "server" / "README.md", ROOT / "client" / "README.md"]
STOP = {">", ">>", "|", "&&", ";", "2>"}


def _shell_commands(readme: Path) -> list[list[str]]:
    """``hacrl-fed …`` invocations in the README's bash blocks (after ``cd …&&``), as argv lists."""
    text = readme.read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            for part in re.split(r"&&", line):
                words = shlex.split(part, comments=True)
                if words[:1] == ["hacrl-fed"]:
                    cut = next((i for i, w in enumerate(words) if w in STOP), len(words))
                    found.append(words[1:cut])
    return found


def _resolve(argv: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = typer.main.get_command(app)
    rest = list(argv)
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.name)
def test_readme_commands_use_existing_commands_and_options(readme):
    commands = _shell_commands(readme)
    assert len(commands) >= 3
    for argv in commands:
        cmd, rest = _resolve(argv)
        assert not isinstance(cmd, click.Group), f"{readme.name}: `hacrl-fed {' '.join(argv)}`: no such command"
        known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
        unknown = [w for w in rest if w.startswith("--") and w not in known]
        assert not unknown, f"{readme.name}: `hacrl-fed {' '.join(argv)}`: unknown option(s) {unknown}"


def test_the_kits_are_used_from_a_clone():
    for readme in READMES:
        text = readme.read_text(encoding="utf-8")
        assert "git clone" in text and "pip install -e ." in text and ".gitignore" in text, readme


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_what_the_howtos_create_is_ignored_by_git():
    created = ["server/tls/ca.key", "server/tls/server.key", "server/roster.toml", "server/runs/x/metrics.jsonl",
               "client/keys/org-a.ed25519.key", "client/keys/org-a.node.key", "client/ca.crt", "client/roster.toml",
               "client/runs/org-a/checkpoints/x", "somewhere/else/org-b.node.key"]
    res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"], input="\n".join(created),
                         capture_output=True, text=True, timeout=30)
    if res.returncode == 128:
        pytest.skip(f"not a git work tree: {res.stderr.strip()}")
    assert sorted(res.stdout.split()) == sorted(created)
    shipped = ["server/local-trial.toml", "server/server.toml", "server/roster.example.toml", "client/smollm2.toml"]
    res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"], input="\n".join(shipped),
                         capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == []


def test_local_trial_is_small_and_stays_on_loopback():
    cfg = load_config(ROOT / "server" / "local-trial.toml", ServerConfig)
    run = cfg.run
    assert run.steps * run.prompts_per_step * run.samples_per_prompt <= 16 and run.sampling.max_new_tokens <= 32
    assert 0 < run.data.eval_size <= 4 and run.join_timeout_s <= 120 and run.min_agents == 2
    assert cfg.superlink.host == "127.0.0.1" and cfg.superlink.node_auth and not cfg.superlink.insecure
    readme = (ROOT / "server" / "README.md").read_text(encoding="utf-8")
    assert f"--server 127.0.0.1:{cfg.superlink.port}" in readme  # the recipe's sites reach this coordinator
    for model in ("tiny-llama-bpe", "tiny-gemma-unigram"):
        assert f"--model {model}" in readme
