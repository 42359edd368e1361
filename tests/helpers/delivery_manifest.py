"""The Flower app directory that runs ``delivery_app:app`` against the project's ClientApp, shared by
tests/flower/test_delivery_relay.py and benchmarks/bench_delivery_cuts.py."""

from __future__ import annotations

from pathlib import Path

import tomli_w


def delivery_app_dir(root: Path, config: dict, *, name: str, publisher: str) -> Path:
    """Write ``root/app/pyproject.toml`` (``delivery_app:app`` as the ServerApp, the project's ClientApp, ``config``
    as the app's run config) and return ``root/app``. Raises ``FileExistsError`` when ``root/app`` exists."""
    app = root / "app"
    app.mkdir()
    manifest = {
        "build-system": {"requires": ["setuptools>=68"], "build-backend": "setuptools.build_meta"},
        "project": {"name": name, "version": "0.1.0", "dependencies": []},
        "tool": {"flwr": {"app": {"publisher": publisher,
                                  "components": {"serverapp": "delivery_app:app",
                                                 "clientapp": "hacrl_fed.flower.client_app:app"},
                                  "config": config}}},
    }
    (app / "pyproject.toml").write_text(tomli_w.dumps(manifest), encoding="utf-8")
    return app
