"""Smoke test of benchmarks/bench_fsdp_memory.py on a tiny model: each of 2 ranks holds about half of the
parameters, gradients and AdamW state one process holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_hold_half_the_training_state(tmp_path):
    out = tmp_path / "mem.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fsdp_memory.py"), "--model", "tiny-llama-bpe",
                           "--nprocs", "1", "2", "--rows", "2", "--tokens", "8", "--cache", str(tmp_path / "cache"),
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    one = [r for r in rows if r["world"] == 1]
    two = sorted((r for r in rows if r["world"] == 2), key=lambda r: r["rank"])
    assert len(one) == 1 and [r["rank"] for r in two] == [0, 1]
    assert all(r["peak_rss_gib"] > 0 for r in rows)
    whole = one[0]["state_gib"]
    for r in two:
        assert 0.4 * whole < r["state_gib"] < 0.6 * whole, (r, whole)
    assert abs(sum(r["state_gib"] for r in two) - whole) < 0.05 * whole
    assert "peak RSS GiB" in done.stdout


def test_bad_arguments_exit_2():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fsdp_memory.py"), "--nprocs", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--nprocs" in done.stderr
