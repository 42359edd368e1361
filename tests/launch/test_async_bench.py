"""benchmarks/async_vs_sync.py reads a sync and an async run's metrics.jsonl into the comparison it reports: updates
per hour, accuracy after N own updates and at the sync run's end, staleness and the share of rows dropped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import async_vs_sync as bench  # noqa: E402


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def sync_run(tmp_path: Path) -> Path:
    recs = [{"event": "run_start", "time": 100.0},
            {"event": "eval", "step": 0, "time": 110.0, "agents": {"fast": {"avg@1": 0.2}, "slow": {"avg@1": 0.2}}}]
    for step in (1, 2):
        recs.append({"event": "step", "step": step, "time": 100.0 + 300 * step, "agents": {
            n: {"status": "trained", "per_source": {o: {"rows": 16.0}}} for n, o in (("fast", "slow"), ("slow", "fast"))}})
    recs.append({"event": "eval", "step": 2, "time": 720.0, "agents": {"fast": {"avg@1": 0.3}, "slow": {"avg@1": 0.25}}})
    return write(tmp_path / "sync.jsonl", recs)


def async_run(tmp_path: Path) -> Path:
    recs = [{"event": "run_start", "time": 0.0},
            {"event": "eval", "step": 0, "time": 10.0, "agents": {"fast": {"avg@1": 0.2}, "slow": {"avg@1": 0.2}}}]
    for k in range(1, 7):   # the fast site: six updates, 100 s apart; rows of the slow one, one batch dropped
        recs.append({"event": "update", "agent": "fast", "own_step": k, "status": "trained", "time": 100.0 * k,
                     "peer_rows": {"slow": 16} if k % 3 == 0 else {}, "staleness_rows": {"0": 16} if k % 3 == 0 else {},
                     "dropped_rows": {}})
        if k == 2:
            recs.append({"event": "eval", "step": 2, "agent": "fast", "time": 210.0, "agents": {"fast": {"avg@1": 0.3}}})
        if k == 6:
            recs.append({"event": "eval", "step": 6, "agent": "fast", "time": 610.0, "agents": {"fast": {"avg@1": 0.4}}})
    for k in (1, 2):
        recs.append({"event": "update", "agent": "slow", "own_step": k, "status": "trained", "time": 300.0 * k,
                     "peer_rows": {"fast": 32}, "staleness_rows": {"1": 16, "2": 16}, "dropped_rows": {"fast": {"versions": 16}}})
    recs.append({"event": "eval", "step": 2, "agent": "slow", "time": 700.0, "agents": {"slow": {"avg@1": 0.35}}})
    return write(tmp_path / "async.jsonl", recs)


def test_the_comparison_reads_both_runs(tmp_path):
    cells = {"sync": bench.cell_from_metrics(sync_run(tmp_path), "sync"),
             "async": bench.cell_from_metrics(async_run(tmp_path), "async")}
    md, data = bench.summarize(cells, steps=2)
    fast, slow = data["sites"]["fast"], data["sites"]["slow"]
    assert data["sync_run_s"] == 620.0
    assert fast["sync"]["updates_per_hour"] == 3600 * 2 / 600 and fast["async"]["updates_per_hour"] == 3600 * 6 / 600
    assert fast["sync"]["at_steps"] == 0.3 and fast["async"]["at_steps"] == 0.3            # after N = 2 own updates
    assert fast["async"]["at_sync_time"] == 0.4 and fast["async"]["own_step_at_sync_time"] == 6
    assert slow["async"]["at_sync_time"] == 0.2                                             # its eval came at 700 s
    assert slow["async"]["staleness_rows"] == {"1": 32, "2": 32}
    assert slow["async"]["dropped_share"] == 32 / (32 + 64)
    assert fast["sync"]["peer_rows"] == 32 and "| fast |" in md


def test_seeds_are_summarized_each_and_averaged(tmp_path):
    cells = {"sync": bench.cell_from_metrics(sync_run(tmp_path), "sync"),
             "async": bench.cell_from_metrics(async_run(tmp_path), "async")}
    other = json.loads(json.dumps(cells))
    other["async"]["sites"]["fast"]["updates"] = other["async"]["sites"]["fast"]["updates"][:3]   # 3 in 300 s
    md, data = bench.summarize_seeds({0: cells, 1: other, 2: {"sync": cells["sync"]}}, steps=2)
    assert set(data["seeds"]) == {"0", "1"}                          # seed 2 lacks its async cell
    fast = data["mean"]["fast"]["async"]
    assert fast["updates_per_hour"] == (3600 * 6 / 600 + 3600 * 3 / 300) / 2
    assert data["mean"]["slow"]["async"]["staleness_rows"] == {"1": 64, "2": 64}
    assert "## Seed 0" in md and "## Seed 1" in md and "## Seed 2" not in md


def test_the_config_gets_each_mode_and_seed(tmp_path):
    cfg = tmp_path / "a.toml"
    cfg.write_text('[run]\nmode = "async"\nseed = 0\nsampling = { temperature = 0.7 }\n')
    text = bench.mode_config(cfg, "sync", 3, tmp_path).read_text()
    assert 'mode = "sync"' in text and "seed = 3" in text and "seed = 0" not in text
