"""The deployment kits (server/, client/): their how-tos name real commands and options, what they
create inside the clone is git-ignored, and the local trial config is small and loopback-only."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
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


def _trial_setup_lines() -> list[str]:
    """The first bash block of server/README.md "Local trial" up to (not including) the long-running server."""
    text = (ROOT / "server" / "README.md").read_text(encoding="utf-8").split("## Local trial", 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[-1].startswith("hacrl-fed server "), lines[-1]
    return lines[:-1]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_local_trial_leaves_the_clone_as_it_found_it(tmp_path):
    """The trial's set-up, run as written (real `hacrl-fed keys …`) from a copy of the kits, writes only into its
    scratch directory: nothing in server/ or client/ (a roster.toml copied into client/ used to break
    test_deployment_kit_configs_are_valid). The scratch directory then holds what both parties need."""
    clone = tmp_path / "clone"
    for kit in ("server", "client"):
        shutil.copytree(ROOT / kit, clone / kit)
    before = _tree(clone)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "hacrl-fed"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hacrl_fed.cli "$@"\n')
    shim.chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(scratch),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    script = "set -euo pipefail\n" + "\n".join(_trial_setup_lines()) + "\n"
    res = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _tree(clone) == before, sorted(set(_tree(clone)) ^ set(before))
    trial = scratch / "hacrl-trial"
    for made in ("server/local-trial.toml", "server/roster.toml", "server/tls/ca.crt", "server/tls/server.pem",
                 "client/roster.toml", "client/ca.crt", "client/keys/alice.ed25519.key", "client/keys/bob.node.key"):
        assert (trial / made).is_file(), made
    cfg = load_config(trial / "server" / "local-trial.toml", ServerConfig)   # relative to the trial's server/
    assert cfg.roster == "roster.toml" and cfg.superlink.ca_cert == "tls/ca.crt"
