"""``benchmarks/gpu_check.sh``: without a CUDA device it stops at once and says why (exit 1, nothing measured);
on a CUDA machine with the packaged models it runs the short simulate and writes ``gpu_check.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _run(out: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"   # hacrl-fed of this venv
    env = dict(os.environ, PYTHON=sys.executable, PATH=path, **env)
    return subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_without_cuda_it_stops_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: test_the_gpu_check_on_cuda runs the script")
    proc = _run(tmp_path / "gpu-check", timeout=300)
    assert proc.returncode == 1 and "torch sees no CUDA device" in proc.stderr
    assert not (tmp_path / "gpu-check" / "gpu_check.json").exists()


@pytest.mark.gpu
@pytest.mark.slow
def test_the_gpu_check_on_cuda(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "gpu-check"
    proc = _run(out, timeout=3600, STEPS="1", REPS="1", SIZES="1x2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["simulate"]["wall_s"] > 0 and summary["gpu"]
    assert summary["bench_vs_trl"]["status"] == "ok" or summary["bench_vs_trl"]["status"].startswith("skipped")
