"""Fixtures of the sharded-trainer tests: tiny model directories and a launcher of N-rank scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_fed.distributed.group import free_port, rank_env
from hacrl_fed.tiny_models import TINY_KINDS, build_tiny_model

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """Saved tiny model directories of both tokenizer families."""
    return {kind: str(build_tiny_model(kind, tmp_path_factory.mktemp(kind))) for kind in TINY_KINDS}


def run_ranks(script: str, args: list[str], world: int, *, timeout_s: float = 240, collective_s: float = 60,
              env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Run ``script`` (in this folder) as ranks 0..world−1 of one group (world 1: one plain process); every rank
    must exit 0, else the test fails with each rank's output."""
    port = free_port()
    procs = []
    for r in range(world):
        e = os.environ | (env or {}) | (rank_env(r, world, "127.0.0.1", port, collective_s, "cpu") if world > 1 else {})
        e["PYTHONFAULTHANDLER"] = "1"   # a rank that crashes (signal) prints its Python stack into the failure
        e["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), e.get("PYTHONPATH", "")])
        procs.append(subprocess.Popen([sys.executable, str(HERE / script), *args], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    done = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out))
    bad = [(r, c) for r, c in enumerate(done) if c.returncode != 0]
    assert not bad, "\n".join(f"rank {r} exited {c.returncode}:\n{c.stdout[-6000:]}" for r, c in bad)
    return done
