"""``route serve --router``: a hostile or oversized router.json costs one line and exit 2, bounded CPU and memory —
never a traceback, minutes of fitting, or a dense calibration matrix of gigabytes."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app as cli_app
from hacrl_fed.route import router as R

BACKENDS = ["--model", "a=http://127.0.0.1:9/v1", "--model", "b=http://127.0.0.1:8/v1"]


def record(texts: list[str], **change) -> dict:
    n = len(texts)
    return {"format": R.ROUTER_FORMAT, "models": ["a", "b"], "texts": texts, "tasks": ["t"] * n,
            "correct": [[1.0] * n, [0.0] * n], "cost": [1.0, 2.0], "k": 3, "embedder": "tfidf"} | change


def serve_with(path: Path):
    """``route serve --router path`` on a port this test holds: a file that passes its checks fails to listen
    (exit 1) instead of serving."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = str(held.getsockname()[1])
        return CliRunner().invoke(cli_app, ["route", "serve", *BACKENDS, "--router", str(path), "--port", port])


def one_line(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_deeply_nested_router_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "router.json"
    path.write_text('{"format": "hacrl-fed-router/1", "models": ' + "[" * 200_000 + "]" * 200_000 + "}")
    one_line(serve_with(path), "router.json", "nested")


@pytest.mark.parametrize("change, words", [
    ({"texts": ["What is 1 + 2?"] * (R.MAX_CALIBRATION + 1)}, ("texts", str(R.MAX_CALIBRATION))),
    ({"texts": ["x" * 8000] * (R.MAX_CALIBRATION_CHARS // 8000 + 1)}, ("characters", "router needs")),
    ({"models": [f"m{i}" for i in range(R.MAX_MODELS + 1)]}, ("models",)),
    ({"correct": [[[[1.0]]], [0.0]]}, ("correct",)),                        # nested where numbers belong
    ({"correct": [[True, 1.0], [0.0, 0.0]]}, ("correct",)),
    ({"k": True}, ("k must",)),
    ({"tasks": ["t" * (R.MAX_NAME_CHARS + 1)] * 2}, ("tasks",)),
])
def test_a_router_file_beyond_what_a_router_needs_is_refused_before_fitting(tmp_path, change, words):
    texts = change.pop("texts", ["What is 1 + 2?", "How many legs?"])
    path = tmp_path / "router.json"
    path.write_text(json.dumps(record(texts, **change)))
    one_line(serve_with(path), "router.json", *words)


def test_a_router_file_over_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "router.json"
    text = json.dumps(record(["What is 1 + 2?", "How many legs?"]))
    path.write_text(text[:-1] + " " * (32 * 2**20 + 1 - len(text)) + "}")        # valid JSON, one byte too many
    one_line(serve_with(path), "router.json", f"larger than {R.MAX_ROUTER_BYTES} bytes")


def test_calibration_embeddings_stay_sparse_under_a_memory_cap(tmp_path):
    """1 200 random texts have ≈ 300 000 distinct character n-grams: their dense embedding is over 1 GiB. Under a
    1 GiB address-space cap the router still loads and ranks."""
    rng = random.Random(0)
    chars = "abcdefghijklmnopqrstuvwxyz0123456789+-*/"
    texts = ["".join(rng.choice(chars) for _ in range(200)) for _ in range(1200)]
    path = tmp_path / "router.json"
    path.write_text(json.dumps(record(texts)))
    script = textwrap.dedent(f"""
        import resource
        from hacrl_fed.route.router import Router
        cap = 1024 * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        r = Router.load({str(path)!r})
        rank = r.request_ranker(["a", "b"])
        print("dense would be", len(r.texts) * len(r._fitted[0]._state.vocabulary_) * 4 // 2**20, "MiB")
        print(rank({{"messages": [{{"role": "user", "content": {texts[7]!r}}}]}}))
    """)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    dense_mib = int(done.stdout.split("dense would be")[1].split()[0])
    assert dense_mib > 1024, done.stdout                       # the cap cannot hold the dense array
    assert done.stdout.strip().splitlines()[-1] == "['a', 'b']"
