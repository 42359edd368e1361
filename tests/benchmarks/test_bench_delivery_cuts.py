"""Smoke test of ``benchmarks/bench_delivery_cuts.py``: a real SuperLink, one SuperNode through the cutting
relay and a fake worker, two train exchanges; both are answered and the summary is written. Slow: it starts
Flower processes (about a minute on 2 cores), like ``tests/flower/test_delivery_relay.py``."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_two_exchanges_through_the_relay(tmp_path, bench):
    out = tmp_path / "cuts.json"
    bench("bench_delivery_cuts.py", "--insecure", "--nodes", "1", "--exchanges", "2", "--every-s", "30",
          "--timeout-s", "90", "--pool-mib", "0.25", "--work-s", "0", "--out", out, timeout=600)
    s = json.loads(out.read_text())
    assert s["nodes"] == 1 and s["exchanges"] == 2 and s["tls"] is False
    assert s["answered"] == 2 and s["timed_out"] == 0 and s["errors"] == []
    assert len(s["exchange_s"]) == 2 and s["wall_s"] > 0
