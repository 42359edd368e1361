"""Smoke test of ``benchmarks/app_import_cost.py``: the measurement on light modules (one run each) writes the
table with a row per module, cold and warm task processes, and the heavy packages a module pulled in; the
modules it measures for real exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import app_import_cost


def test_the_table_on_light_modules(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(app_import_cost, "APPS", {"ClientApp": "json", "ServerApp": "numpy"})
    monkeypatch.setattr(app_import_cost, "ENTRY", {"ClientApp": "csv", "ServerApp": "email.parser"})
    out = tmp_path / "import-cost" / "results.md"
    monkeypatch.setattr(sys, "argv", ["app_import_cost.py", "--repeat", "1", "--out", str(out)])
    app_import_cost.main()
    text = out.read_text()
    assert text.startswith("`python benchmarks/app_import_cost.py --repeat 1`")
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    assert rows["| `import json` (ClientApp)"][3].rstrip(" |") == "-"                # no heavy package
    assert rows["| `import numpy` (ServerApp)"][3].rstrip(" |") == "numpy"         # a heavy package, named
    assert float(rows["| `import numpy` (ServerApp)"][1]) > 0                        # CPU seconds measured
    assert sum(line.startswith("| ClientApp task process") for line in text.splitlines()) == 2   # cold, warm
    assert sum(line.startswith("| ServerApp task process") for line in text.splitlines()) == 2
    assert capsys.readouterr().out.strip() == text.split("\n\n", 1)[1].strip()     # printed as written


def _module_file(module: str) -> Path | None:
    """The source file of a dotted module name, found from its top-level package without importing anything."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def test_the_measured_modules_exist():
    for module in [*app_import_cost.APPS.values(), *app_import_cost.ENTRY.values()]:
        assert _module_file(module) is not None, f"{module}: no such module (app_import_cost.py measures it)"
