"""The two commands of the quickstart and CI: what they install is what the README says, CI runs the README's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SIMULATE_PAGE = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")


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
    for script in (".ci/run", "scripts/demo", "scripts/test", "scripts/setup", "scripts/setup.sh"):
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_setup_refuses_an_old_python_with_one_line(tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = os.environ | {"HACRL_VENV": str(tmp_path / "venv"), "PYTHON": str(fake)}
    res = subprocess.run([str(ROOT / "scripts" / "test"), "--co"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "needs Python >= 3.11" in res.stderr and not (tmp_path / "venv").exists()


def test_setup_says_what_each_step_does_and_how_long_it_takes(tmp_path):
    """Every step that runs prints one line with its expected duration before it starts and one with the time it
    took, and pip is not silenced (its progress is the sign of life during a long download). A fake interpreter
    records what pip is asked to do; nothing is installed."""
    log = tmp_path / "pip.log"
    fake = tmp_path / "python3"
    fake.write_text(f"""#!/bin/sh
case "$1" in
  -c) exit 0 ;;                                   # the version check
  -) cat > /dev/null; exit 1 ;;                   # _installed: nothing is installed
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
      shift 2; echo "$*" >> {log}; echo "pip progress"; exit 0 ;;
esac
exit 1
""")
    fake.chmod(0o755)
    env = os.environ | {"HACRL_VENV": str(tmp_path / "venv"), "PYTHON": str(fake)}
    res = subprocess.run(["bash", "-c", f'. "{ROOT / "scripts" / "setup.sh"}" && hacrl_setup && echo ok'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr    # pip's output goes to stderr
    lines = res.stderr.splitlines()
    starts = [line for line in lines if re.match(r"setup: step \d/4: ", line)]
    assert [line.split()[2] for line in starts] == ["1/4:", "2/4:", "3/4:", "4/4:"], lines
    for line in starts:
        assert re.search(r"≈ [\d–]+ (s|min)\)", line), f"no expected duration: {line}"
    assert [line for line in lines if re.match(r"setup: step \d/4 done in \d+ s$", line)] and \
        len([line for line in lines if " done in " in line and "step" in line]) == 4
    assert lines.count("pip progress") == 4
    calls = log.read_text().splitlines()
    assert len(calls) == 4 and not any("--quiet" in c or " -q" in c for c in calls), calls


def _minutes(text: str) -> set[float]:
    """The durations in minutes that ``text`` states: ``≈ 4 min``, ``about 20 minutes``, ``22 min measured``,
    ``about a minute``."""
    found = {float(m) for m in re.findall(r"(?:≈|~|about)\s*(\d+(?:\.\d+)?)\s*min", text)}
    found |= {float(m) for m in re.findall(r"(\d+(?:\.\d+)?)\s*min measured", text)}
    return found | ({1.0} if re.search(r"about a minute", text) else set())


def test_the_examples_state_the_times_the_readme_gives():
    """The header of an example config that says how long it runs says what the table of configs in
    docs/simulate.md says (default.toml said ≈ 10 minutes where the README measured 4)."""
    table = SIMULATE_PAGE.split("Configs (`examples/`):", 1)[1].split("\n\n", 2)[1]
    checked = 0
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.match(r"`([^`]+\.toml)`", cells[0]).group(1)
        header = "".join(line for line in (ROOT / "examples" / name).read_text(encoding="utf-8").splitlines(True)
                         if line.startswith("#"))
        claimed = _minutes(header)
        if claimed:
            assert claimed <= _minutes(cells[-1]), f"examples/{name} says {claimed} min, docs/simulate.md: {cells[-1]}"
            checked += 1
    assert checked >= 3


def test_the_setup_script_only_sets_up(tmp_path):
    """``./scripts/setup``: the set-up steps, then one line saying how to use the environment; nothing else runs
    (a fake interpreter that says every package is installed: no step has anything to do)."""
    fake = tmp_path / "python3"
    fake.write_text("""#!/bin/sh
case "$1" in
  -c) exit 0 ;;
  -) cat > /dev/null; exit 0 ;;
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi; exit 0 ;;
esac
exit 1
""")
    fake.chmod(0o755)
    assert os.access(ROOT / "scripts" / "setup", os.X_OK)
    env = os.environ | {"HACRL_VENV": str(tmp_path / "venv"), "PYTHON": str(fake)}
    res = subprocess.run([str(ROOT / "scripts" / "setup")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("setup: ready: . ") and res.stdout == ""
