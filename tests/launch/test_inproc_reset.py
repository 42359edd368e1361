"""The benchmarks' in-process federation (``benchmarks/inproc.py``) runs one cell after another in one process:
``Federation.reset`` must give each cell what a fresh site process has, the screens' state included (windows, key
ledger, source standings, cumulative counts), or a cell inherits the quarantines and counts of the cell before."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import inproc  # noqa: E402

from hacrl_fed.config import SimulateConfig, load_config  # noqa: E402


def _screen_state(fed) -> dict:
    out = {}
    for name in fed.learners:
        g = fed.workers[name].trainer.guard
        out[name] = ({s: dict(c) for s, c in g.totals.items()}, {s: list(w) for s, w in g.windows.items()},
                     list(g.own_window), sorted(g.standing))
    return out


def test_a_cell_after_another_starts_with_fresh_screens_and_repeats_the_first(tmp_path):
    cfg = load_config(ROOT / "examples" / "tiny_tasks.toml", SimulateConfig)
    fed = inproc.Federation(cfg, workdir=tmp_path)
    try:
        verify = {n: fed.workers[n].trainer.guard.verify for n in fed.learners}
        fed.reset(algo={"name": "hacpo_cross_family", "kl_coef": 0.0}, optim={"seed": 0})
        fed.run(run_id="cell-a", steps=2, seed=0)
        first = _screen_state(fed)
        assert all(totals for totals, *_ in first.values()), "the peers' rows reached the screens"
        guards = {n: fed.workers[n].trainer.guard for n in fed.learners}

        fed.reset(algo={"name": "hacpo_cross_family", "kl_coef": 0.0}, optim={"seed": 0})
        for n in fed.learners:
            g = fed.workers[n].trainer.guard
            assert g is not guards[n] and not g.totals and not g.windows and not g.own_window and not g.standing
            assert g.verify is verify[n] and g.verify is not None and g.cfg == fed.agent_cfgs[n].screens
        fed.run(run_id="cell-b", steps=2, seed=0)
        assert _screen_state(fed) == first
    finally:
        fed.close()
