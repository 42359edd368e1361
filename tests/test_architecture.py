"""The import rules of the package layout (docs/architecture.md), checked over the code's own imports.

Every ``import`` and ``from … import`` statement under ``hacrl_fed/`` counts, wherever it stands
(module level, inside a function, under ``TYPE_CHECKING``): a deferred import is still a
dependency. A change that breaks a rule fails here, naming the file and line of the import.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hacrl_fed"
MAP = PACKAGE.parent / "docs" / "architecture.md"

MAY_IMPORT: dict[str, set[str]] = {
    "": set(),
    "atomic": set(),
    "logs": set(),
    "status": {"atomic"},
    "tiny_models": set(),
    "v1": set(),
    "tokenization": set(),
    "algo": set(),
    "update": {"algo", "tokenization"},
    "distributed": {"checkpoints", "update"},
    "screen_config": set(),
    "config": {"algo", "screen_config", "update"},
    "envs": {"v1"},
    "reward": {"config", "envs", "protocol"},
    "data": {"config", "envs", "reward", "tokenization"},
    "protocol": {"atomic", "v1"},
    "screens": {"algo", "protocol", "reward", "screen_config", "v1"},
    "rollout": {"tokenization", "update"},
    "play": {"atomic", "config", "data", "envs", "protocol", "reward", "rollout", "tokenization", "v1"},
    "checkpoints": {"atomic", "data"},
    "worker": {"algo", "distributed", "atomic", "checkpoints", "config", "data", "envs", "play", "protocol", "reward", "rollout",
               "screens", "status", "tiny_models", "tokenization", "update", "v1"},
    "contributor": {"config", "protocol", "reward", "rollout", "status", "v1", "worker"},
    "route": {"atomic", "config", "data", "play", "reward", "rollout", "worker"},
    "coordinator": {"algo", "atomic", "config", "protocol", "v1"},
    "async_rounds": {"algo", "coordinator", "protocol", "v1"},
    "site": {"protocol", "v1"},
    "flower": {"", "async_rounds", "config", "coordinator", "data", "logs", "protocol", "reward", "site", "v1"},
    "report": {"config"},
    "launch": {"atomic", "checkpoints", "config", "coordinator", "data", "protocol", "report", "site", "v1", "worker"},
    "cli": {"atomic", "checkpoints", "config", "contributor", "launch", "logs", "play", "protocol", "rollout", "route",
            "worker"},
}
"""Unit → the other units it may import. A unit is a package under ``hacrl_fed/`` (``worker``), a
top-level module (``config``), or ``""`` for ``hacrl_fed/__init__.py`` (the version)."""

for _name in ("cli", "config", "data", "launch", "reward", "worker"):
    MAY_IMPORT[_name].add("registries")   # the extension points' names (hacrl_fed/registries.py, docs/extending.md)
MAY_IMPORT["registries"] = set()

ONLY_IN: dict[str, set[str]] = {
    "flwr": {"flower"},
    "grpc": {"launch", "site", "v1", "worker"},
    "typer": {"cli"},
    "textarena": {"envs"},
}
"""Third-party package → the only units that may import it."""

NEVER_IN: dict[str, set[str]] = {
    "algo": {"cryptography", "google"},
    "update": {"cryptography", "google"},
    "protocol": {"torch", "transformers"},
    "coordinator": {"torch", "transformers"},
    "async_rounds": {"torch", "transformers"},
    "screens": {"torch", "transformers"},
    "site": {"torch", "transformers"},
    "report": {"torch", "transformers"},
    "rollout": {"flwr", "grpc", "cryptography"},
}
"""Unit → third-party packages it must not import: the math stays pure, the light units stay light."""

MAX_MODULES = 12
MAX_LINES = 2500


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module (``hacrl_fed.worker.trainer``)."""
    target: str
    """The imported module, absolute (``hacrl_fed.protocol.envelope``, ``flwr.app``)."""
    line: int

    def __str__(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_ours(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _targets(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # ``from pkg import name`` imports the module pkg.name when there is one
    return [f"{prefix}.{a.name}" if prefix.startswith("hacrl_fed") and _is_ours(f"{prefix}.{a.name}") else prefix
            for a in node.names]


def _imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            found += [Import(module, target, node.lineno) for target in _targets(node, package)]
    return found


def _unit(module: str) -> str:
    """``hacrl_fed.worker.trainer`` → ``worker``, ``hacrl_fed.config`` → ``config``, ``hacrl_fed`` → ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _top(target: str) -> str:
    return target.split(".")[0]


IMPORTS = _imports()
OURS = [i for i in IMPORTS if _top(i.target) == "hacrl_fed"]
THIRD_PARTY = [i for i in IMPORTS if _top(i.target) != "hacrl_fed"]


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a path that ends where it starts, or []."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_every_unit_has_a_rule():
    units = {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert units <= set(MAY_IMPORT), f"add an import rule for {sorted(units - set(MAY_IMPORT))}"


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT), ids=lambda u: u or "hacrl_fed")
def test_a_unit_imports_only_what_its_rule_allows(unit):
    allowed = MAY_IMPORT[unit] | {unit}
    bad = [str(i) for i in OURS if _unit(i.module) == unit and _unit(i.target) not in allowed]
    assert not bad, f"{unit or 'hacrl_fed'} may import only {sorted(MAY_IMPORT[unit])}:\n" + "\n".join(bad)


def test_exactly_one_package_imports_flower():
    assert {_unit(i.module) for i in THIRD_PARTY if _top(i.target) == "flwr"} == {"flower"}


def test_third_party_packages_stay_where_they_belong():
    bad = [str(i) for i in THIRD_PARTY if _top(i.target) in ONLY_IN and _unit(i.module) not in ONLY_IN[_top(i.target)]]
    bad += [str(i) for i in THIRD_PARTY if _top(i.target) in NEVER_IN.get(_unit(i.module), ())]
    assert not bad, "\n".join(bad)


def test_the_worker_imports_neither_flower_nor_the_coordinator():
    bad = [str(i) for i in IMPORTS if _unit(i.module) == "worker"
           and (_top(i.target) == "flwr" or (i in OURS and _unit(i.target) in {"async_rounds", "coordinator", "flower", "launch"}))]
    assert not bad, "\n".join(bad)


def test_the_math_imports_nothing_above_it():
    above = {"config", "cli", "worker", "rollout", "update", "play", "coordinator", "async_rounds", "flower", "launch",
             "protocol", "site"}
    bad = [str(i) for i in IMPORTS if _unit(i.module) == "algo"
           and (_top(i.target) in {"flwr", "grpc"} or (i in OURS and _unit(i.target) in above))]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    modules: dict[str, set[str]] = defaultdict(set)
    units: dict[str, set[str]] = defaultdict(set)
    for i in OURS:
        if i.target != i.module:
            modules[i.module].add(i.target)
        if _unit(i.target) != _unit(i.module):
            units[_unit(i.module)].add(_unit(i.target))
    assert not (found := _cycle(modules)), "modules: " + " → ".join(found)
    assert not (found := _cycle(units)), "packages: " + " → ".join(found)
    assert not (found := _cycle(MAY_IMPORT)), "the rules themselves: " + " → ".join(found)


@pytest.mark.parametrize("folder", sorted(p.parent for p in PACKAGE.glob("*/__init__.py")), ids=lambda p: p.name)
def test_packages_stay_small(folder):
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in modules)
    assert len(modules) <= MAX_MODULES and lines <= MAX_LINES, (
        f"{folder.name}/ holds {len(modules)} modules, {lines} lines (at most {MAX_MODULES} and {MAX_LINES}): "
        "split it by role")


def test_the_architecture_map_states_these_rules():
    """The table of docs/architecture.md lists, per package, exactly what :data:`MAY_IMPORT` allows."""
    stated: dict[str, set[str]] = {}
    for line in MAP.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        allowed = set() if cells[2] == "—" else {
            "" if name == "the version" else name.strip("`") for name in cells[2].split(", ")}
        for unit in cells[1].split(", "):
            stated[unit.strip("`").rstrip("/").removesuffix(".py")] = allowed
    assert stated == {unit: allowed for unit, allowed in MAY_IMPORT.items() if unit}
