"""A real ``transformers serve`` process (the OpenAI-compatible server that ships with ``transformers``) on a
tiny local model directory, for the rollout-only site tests. CPU, 127.0.0.1 only, no hub access."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command() -> list[str]:
    """``transformers serve`` of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("transformers")
    return [str(exe) if exe.exists() else shutil.which("transformers") or "transformers", "serve"]


@contextmanager
def transformers_serve(model_dir: str | Path, log_path: Path, *, start_timeout_s: float = 300.0):
    """Start ``transformers serve MODEL_DIR`` (the model preloaded, CPU) and yield its ``/v1`` base URL once
    ``/health`` answers; the process group is stopped on exit. Fails with the server's log when it exits or does
    not answer within ``start_timeout_s`` (a generous cap: a busy machine is slow, the wait follows /health)."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*serve_command(), str(model_dir), "--device", "cpu", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        end = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"transformers serve did not answer /health:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
