"""A rank that crashes in native code (a signal, not a Python exception) leaves its Python stack in the site's log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from hacrl_fed.distributed.group import rank_env

ROOT = Path(__file__).resolve().parents[2]


def test_segfaulting_rank_prints_its_python_stack():
    # rank 1 of 2 with no rank 0: a bare listening socket stands in for the rendezvous store, so the rank connects
    # (main() has run, faulthandler included) and then waits there for an answer that never comes
    with socket.create_server(("127.0.0.1", 0)) as store:
        store.settimeout(120)
        env = os.environ | rank_env(1, 2, "127.0.0.1", store.getsockname()[1], 60, "cpu")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env.pop("PYTHONFAULTHANDLER", None)   # the rank must enable it itself
        proc = subprocess.Popen([sys.executable, "-m", "hacrl_fed.distributed.rank"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            conn, _ = store.accept()
            with conn:
                assert proc.poll() is None, proc.communicate()[0]
                proc.send_signal(signal.SIGSEGV)
                out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in out, out
    assert "hacrl_fed/distributed/rank.py" in out, out
