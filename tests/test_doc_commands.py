"""The shell commands of README.md and docs/ stay true (issue 28).

* A fenced ``bash`` block right after the line ``<!-- ci: run -->`` is safe to run in CI: it is run, the blocks of
  one page in their order in one scratch directory (like a reader following the page), with the ``hacrl-fed`` of
  this environment first on PATH; each must exit 0.
* Every other fenced shell block is checked without running it: a ``python benchmarks/X.py`` command uses only
  options that script defines, and every repository file a command names (``benchmarks/…``, ``scripts/…``,
  ``examples/…``, ``protos/…``, ``server/…``, ``client/…``) exists, except where the command writes (``--out``,
  ``--output-dir``, a redirection). (``hacrl-fed …`` commands, in blocks and inline,
  are checked against the CLI by ``tests/test_cli_commands.py``.)

Mark a block ``<!-- ci: run -->`` only when it needs no network, no model, no GPU, writes only below the current
directory and ends within seconds.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- ci: run -->"
_FENCE = re.compile(r"^(?P<mark><!-- ci: run -->\n)?```(?:bash|sh|shell)\n(?P<body>.*?)^```$", re.M | re.S)
_WRITES = {"--out", "--output-dir", ">", ">>"}
_REPO_PATH = re.compile(r"(?<![\w/.<-])((?:benchmarks|scripts|examples|protos|server|client)/[\w./-]*\w)")


def _blocks(page: Path) -> list[tuple[bool, str]]:
    """(marked safe for CI, body) of every fenced shell block of ``page``, in order."""
    return [(bool(m.group("mark")), m.group("body")) for m in _FENCE.finditer(page.read_text(encoding="utf-8"))]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _commands(body: str) -> list[str]:
    """The command lines of a block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.split(" #", 1)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_mark_stands_before_a_shell_block():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        marks = text.count(MARK)
        assert marks == sum(marked for marked, _ in _blocks(page)), \
            f"{_name(page)}: a {MARK!r} line must be followed directly by a ```bash block"


def test_the_readme_has_commands_ci_runs():
    """The marks cannot silently disappear: the README's install check and its key set-up run in CI."""
    marked = [body for marked, body in _blocks(ROOT / "README.md") if marked]
    assert any("hacrl-fed --version" in b for b in marked) and any("hacrl-fed keys gen" in b for b in marked)


_RUN_PAGES = [p for p in PAGES if any(marked for marked, _ in _blocks(p))]


@pytest.mark.parametrize("page", _RUN_PAGES, ids=_name)
def test_the_blocks_marked_safe_for_ci_run(page, tmp_path):
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HOME": str(tmp_path),
    }
    for i, body in enumerate(body for marked, body in _blocks(page) if marked):
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, f"{_name(page)}, marked block {i + 1}:\n{body}\nexit {res.returncode}:\n" \
                                    f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}"


def _script_options(script: Path) -> set[str]:
    """The ``--options`` a benchmark script defines: the string literals of its ``add_argument`` calls."""
    found = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return {o for o in found if o.startswith("--")}


def test_benchmark_commands_use_options_their_scripts_define():
    checked = 0
    for page in PAGES:
        for _, body in _blocks(page):
            for line in _commands(body):
                for m in re.finditer(r"python3? (benchmarks/\w+\.py)((?:\s+[^|;&>]+)?)", line):
                    script = ROOT / m.group(1)
                    assert script.is_file(), f"{_name(page)}: `{line}`: no {m.group(1)}"
                    defined = _script_options(script) | {"--help"}
                    used = {w.split("=")[0] for w in m.group(2).split() if w.startswith("--")}
                    assert used <= defined, f"{_name(page)}: `{line}`: {m.group(1)} has no {sorted(used - defined)}"
                    checked += 1
    assert checked >= 10


def test_the_files_the_commands_name_exist():
    """Every repository path a documented command names exists, but for placeholders, where a command writes, and
    what lies under a directory an earlier command of the same block wrote (``--out DIR`` then ``DIR/file``)."""
    checked = 0
    for page in PAGES:
        for _, body in _blocks(page):
            written: set[str] = set()
            for line in _commands(body):
                words = line.split()
                for path in _REPO_PATH.findall(line):
                    at = next((i for i, w in enumerate(words) if path in w), 0)
                    if at and words[at - 1] in _WRITES:
                        written.add(path)
                        continue                    # where the command writes
                    if "<" in path or "*" in path or any(path == d or path.startswith(d + "/") for d in written):
                        continue                    # a placeholder, or what an earlier command of the block wrote
                    assert (ROOT / path).exists(), f"{_name(page)}: `{line}`: no {path} in the repository"
                    checked += 1
    assert checked >= 10


def test_a_file_written_by_an_earlier_command_of_its_block_is_not_asked_for(monkeypatch, tmp_path):
    """The rule above, on a page of its own: ``DIR/union.toml`` passes after ``--out DIR``, fails without it."""
    page = tmp_path / "page.md"
    produced = "python benchmarks/specialists.py --out benchmarks/results/nowhere\n"
    used = "python benchmarks/run_collab.py --config benchmarks/results/nowhere/union.toml\n"
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    filler = "".join(f"cat examples/{p.name}\n" for p in sorted((ROOT / "examples").glob("*.toml"))[:10])
    page.write_text(f"```bash\n{filler}{produced}{used}```\n", encoding="utf-8")
    test_the_files_the_commands_name_exist()
    page.write_text(f"```bash\n{filler}{used}```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="nowhere/union.toml"):
        test_the_files_the_commands_name_exist()


def test_the_links_between_the_pages_resolve():
    """Every relative link of README.md and docs/ (``[text](path)``, ``#anchor`` dropped) names a file that exists."""
    checked = 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            assert (page.parent / path).exists(), f"{_name(page)}: link to {target}: no such file"
            checked += 1
    assert checked >= 20
