"""Every CLI command answers --help, and every module its body imports lazily exists with the names used; the
table of options (docs/commands.md) is the CLI's own help, and every command the README and docs/ show uses options
that exist.

The commands import their heavy modules inside the function body (fast --help and config errors),
so a missing or renamed module would otherwise only show up when someone runs the command.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from hacrl_fed import cli

runner = CliRunner()


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in group.commands.items():
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


COMMANDS = _commands(typer.main.get_command(cli.app))


def _lazy_imports() -> list[tuple[str, str, str]]:
    """(function, module, name) for every ``from module import name`` inside a function of cli.py."""
    tree = ast.parse(Path(cli.__file__).read_text(encoding="utf-8"))
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found += [(fn.name, node.module, alias.name) for alias in node.names]
                elif isinstance(node, ast.Import):
                    found += [(fn.name, alias.name, "") for alias in node.names]
    return found


def test_every_command_is_listed():
    names = {" ".join(c) for c in COMMANDS}
    assert {"keys", "keys gen", "keys certs", "worker", "eval", "server", "client", "simulate"} <= names


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_of_every_command(command):
    result = runner.invoke(cli.app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and "--help" in result.output


@pytest.mark.parametrize(("function", "module", "name"), _lazy_imports(), ids=lambda v: str(v))
def test_lazily_imported_modules_exist(function, module, name):
    mod = importlib.import_module(module)
    if name:
        assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, \
            f"{function}: {module} has no {name}"


def test_the_lazy_import_list_covers_every_command_module():
    modules = {m for _, m, _ in _lazy_imports()}
    assert {"hacrl_fed.launch.server_cmd", "hacrl_fed.launch.client_cmd", "hacrl_fed.launch.simulate",
            "hacrl_fed.worker.service", "hacrl_fed.play.evaluate", "hacrl_fed.protocol.keys",
            "hacrl_fed.protocol.certs"} <= modules


def test_every_option_has_a_description():
    missing = []
    for command in COMMANDS:
        cmd = typer.main.get_command(cli.app)
        for part in command:
            cmd = cmd.commands[part]
        missing += [f"{' '.join(command)} {p.opts[0]}" for p in cmd.params
                    if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert missing == []


def test_version_and_the_order_of_the_commands():
    from hacrl_fed import __version__

    result = runner.invoke(cli.app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"hacrl-fed {__version__}"
    listed = list(typer.main.get_command(cli.app).list_commands(None))
    assert listed.index("simulate") < listed.index("eval") < listed.index("worker")
    assert listed[:2] == ["simulate", "eval"]


ROOT = Path(__file__).resolve().parents[1]
OPTIONS_PAGE = ROOT / "docs" / "commands.md"
OPTIONS_HEADING = "### Options of every command"
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _default(p: click.Parameter) -> str:
    if p.required:
        return "required"
    if isinstance(p, click.Option) and p.is_flag:
        return "on" if p.default else "off"
    return "—" if p.default is None else f"`{p.default}`"


def options_table() -> str:
    """The table of options of docs/commands.md, made from the CLI itself: one row per option of every command."""
    rows = ["| command | option | default | what |", "|---|---|---|---|"]
    for command in COMMANDS:
        cmd = typer.main.get_command(cli.app)
        for part in command:
            cmd = cmd.commands[part]
        if isinstance(cmd, click.Group):
            continue
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            names = " / ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            what = " ".join((p.help or "").split()).replace("|", "\\|")
            rows.append(f"| `hacrl-fed {' '.join(command)}` | {names} | {_default(p)} | {what} |")
    return "\n".join(rows) + "\n"


def test_the_docs_table_of_options_is_the_cli_help():
    """Every option of every command is in docs/commands.md's table with its default and its help text, and the
    table holds nothing else. On a change of the CLI, paste the table this test prints into docs/commands.md."""
    readme = OPTIONS_PAGE.read_text(encoding="utf-8")
    assert OPTIONS_HEADING in readme, f"docs/commands.md has no {OPTIONS_HEADING!r} section"
    section = readme.split(OPTIONS_HEADING, 1)[1]
    start = section.index("| command | option |")
    table = section[start:]
    table = table[:table.index("\n\n") + 1] if "\n\n" in table else table
    expected = options_table()
    assert table == expected, "docs/commands.md's table of options differs from the CLI's help; the table now:\n" \
        + expected


def _readme_invocations() -> list[tuple[str, list[str]]]:
    """``hacrl-fed …`` as README.md and the pages of docs/ show it, with the page: in bash blocks (up to a
    redirection or the next command) and in inline code (the Commands table, synopses); ``[--opt X]`` brackets and
    ``...`` dropped."""
    return [(page.relative_to(ROOT).as_posix(), argv) for page in DOC_PAGES
            for argv in _invocations(page.read_text(encoding="utf-8"))]


def _invocations(text: str) -> list[list[str]]:
    found = []
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    snippets = [line for block in blocks for line in block.splitlines()]
    snippets += re.findall(r"`(hacrl-fed [^`]*)`", text)
    for snippet in snippets:
        for part in re.split(r"&&|\|\||;|\|", snippet):
            at = re.search(r"(^|[\s/])hacrl-fed\s", part + " ")
            if not at:
                continue
            text = part[at.end(1):].replace("[", " ").replace("]", " ")
            try:
                words = shlex.split(text, comments=True)
            except ValueError:      # an unbalanced quote in prose: the words as written
                words = text.split()
            cut = next((i for i, w in enumerate(words) if w in {">", ">>", "2>", "&"}), len(words))
            found.append(words[1:cut])
    return found


def test_every_command_in_the_readme_and_docs_uses_options_that_exist():
    found = _readme_invocations()
    assert len(found) >= 10 and {page for page, _ in found} >= {"README.md", "docs/commands.md"}
    for page, argv in found:
        cmd: click.Command = typer.main.get_command(cli.app)
        rest = list(argv)
        while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
            cmd = cmd.commands[rest.pop(0)]
        if isinstance(cmd, click.Group):
            assert not rest or rest[0].startswith("-"), f"{page}: `hacrl-fed {' '.join(argv)}`: no such command"
            continue
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        unknown = [w for w in rest if w.startswith("--") and w.split("=")[0] not in known]
        assert not unknown, f"{page}: `hacrl-fed {' '.join(argv)}`: unknown option(s) {unknown}"


def _help(command: tuple[str, ...], option: str) -> str:
    cmd = typer.main.get_command(cli.app)
    for part in command:
        cmd = cmd.commands[part]
    return " ".join(next(p for p in cmd.params if option in p.opts).help.split())


def test_the_run_name_does_not_seed_sampling_and_the_help_says_so():
    """The sampling seeds derive from run.seed, the step and the agent (docs/simulate.md); --run-name's help
    used to say the run id seeds the agents' sampling."""
    from hacrl_fed.config import SamplingConfig
    from hacrl_fed.coordinator.phases import build_round_plan
    from hacrl_fed.data.problem import Problem
    from hacrl_fed.worker.agent import generation_seed

    plans = [build_round_plan(run_id=name, step=1, problems=[Problem("a", "1 + 1?", "2")], samples_per_prompt=2,
                              sampling=SamplingConfig(), seed=0, deadline_unix_s=0.0)
             for name in ("hacrl-demo-20261202-044815", "another-name")]
    assert plans[0].sampling.seed == plans[1].sampling.seed
    assert len({generation_seed(p.sampling.seed, p.step, "smollm2") for p in plans}) == 1
    text = _help(("simulate",), "--run-name")
    assert "Sampling does not depend on it" in text and "seeds the agents" not in text
