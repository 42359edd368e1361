"""Every CLI command answers --help, and every module its body imports lazily exists with the names used.

The commands import their heavy modules inside the function body (fast --help and config errors),
so a missing or renamed module would otherwise only show up when someone runs the command.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
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
            "hacrl_fed.worker.service", "hacrl_fed.worker.evaluate", "hacrl_fed.protocol.keys",
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
