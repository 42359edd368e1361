"""Process and site-directory helpers of the command tests (tests/launch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

MARKER = "HACRL_FED_TEST_MARKER"
"""Environment variable a test sets on the commands it starts, to find every process they leave behind."""


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries ``MARKER=marker``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def command_line(p: psutil.Process) -> str:
    """``p``'s command line as one string; "" once it has exited or become a zombie (a listed process may end
    at any moment)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def lay_out_site(root: Path, federation) -> Path:
    """``root`` laid out as the client how-to says: ``keys/`` (alice's and bob's keys) and ``roster.toml``."""
    (root / "keys").mkdir()
    for agent in ("alice", "bob"):
        for kind in ("ed25519", "node"):
            shutil.copy(federation.root / f"{agent}.{kind}.key", root / "keys" / f"{agent}.{kind}.key")
    shutil.copy(federation.roster_path, root / "roster.toml")
    return root
