"""The two commands of the quickstart and CI: what they install is what the README says, CI runs the README's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _setup_packages() -> list[str]:
    text = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    block = re.search(r"HACRL_MODEL_PACKAGES=\(([^)]*)\)", text).group(1)
    return block.split()


def test_quickstart_is_the_two_scripts_and_they_are_executable():
    quick = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split()[0] for line in quick.strip().splitlines()] == ["./scripts/demo", "./scripts/test"]
    for name in ("demo", "test"):
        assert os.access(ROOT / "scripts" / name, os.X_OK)
    assert "./scripts/test" in README.split("## Tests", 1)[1].split("##", 1)[0]


def test_setup_installs_what_the_manual_steps_say():
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    manual = README.split("The same by hand:", 1)[1].split("```", 2)[1]
    assert re.search(r'HACRL_TORCH="2\.13\.0"', setup) and "pip install torch==2.13.0" in manual
    assert '-e ".[dev]"' in setup and 'pip install -e ".[dev]"' in manual
    no_deps = next(line for line in manual.splitlines() if "--no-deps" in line).split("--no-deps", 1)[1].split()
    assert _setup_packages() == no_deps


def test_ci_runs_the_readme_test_command_in_a_fresh_environment():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'python3 -m venv "\$venv"', ci) and 'HACRL_VENV="$venv" ./scripts/test' in ci
    for script in (".ci/run", "scripts/demo", "scripts/test", "scripts/setup.sh"):
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_setup_refuses_an_old_python_with_one_line(tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = os.environ | {"HACRL_VENV": str(tmp_path / "venv"), "PYTHON": str(fake)}
    res = subprocess.run([str(ROOT / "scripts" / "test"), "--co"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "needs Python >= 3.11" in res.stderr and not (tmp_path / "venv").exists()
