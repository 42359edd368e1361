"""The collaboration benchmark with a rollout-only contributor (``run_collab.py --contributor DIR``), end to end with
the tiny models: the script serves an export-like tiny model directory with a real ``transformers serve``, the
in-process federation (``benchmarks/inproc.py``) runs two learners plus the contributor for 2 steps, and the cell,
``meta.json`` and the summary say what it contributed.

* the contributor's roster entry says ``role = "rollout_only"``; its batch passes the coordinator's validation and
  re-verification (it has an accuracy, it is pooled) and it is never sent ``train``;
* both learners' reports list its rows by source, without a behaviour log-prob;
* the ``+contrib`` cell records, per learner and step, its rows in the update and those that reached the gradient,
  and the summary pairs ``recipe+contrib`` with ``recipe`` by seed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import inproc  # noqa: E402
import run_collab  # noqa: E402

RECIPE = "hacpo_cross_family"
LEARNERS = ("gemma-unigram", "llama-bpe")


def _export_like(out: Path) -> Path:
    """A tiny model directory as an export holds it: weights, tokenizer, chat template, hacrl_fed_prompt.json."""
    from transformers import AutoTokenizer

    from hacrl_fed.data.prompts import PROMPT_FILE, prompt_record
    from hacrl_fed.tiny_models import build_tiny_model

    model = build_tiny_model("tiny-llama-bpe", out, seed=1)
    tok = AutoTokenizer.from_pretrained(model)
    rec = prompt_record(tok, system_prompt="Reply with \\boxed{answer}.", eos_token_ids=[tok.eos_token_id])
    (model / PROMPT_FILE).write_text(json.dumps(rec))
    return model


def _main(out: Path, *extra: str) -> None:
    argv = ["--pair", "tiny-tasks", "--seeds", "1", "--steps", "2", "--recipes", RECIPE, "--out", str(out), *extra]
    assert run_collab.main(argv) == 0


def test_a_rollout_only_contributor_in_the_collaboration_benchmark(tmp_path, monkeypatch):
    from hacrl_fed.contributor import EndpointWorker

    model = _export_like(tmp_path / "export")
    out = tmp_path / "collab"
    _main(out)                                                 # the cell without the contributor
    steps, feds, trained = [], [], []
    run, init = inproc.Federation.run, inproc.Federation.__init__

    def keep_steps(self, **kw):
        res = run(self, **kw)
        steps.extend(res)
        return res

    def keep_fed(self, *a, **kw):
        init(self, *a, **kw)
        feds.append(self)

    def train(self, req):
        trained.append(self.name)
        raise AssertionError("a rollout-only site was sent train")

    monkeypatch.setattr(inproc.Federation, "run", keep_steps)
    monkeypatch.setattr(inproc.Federation, "__init__", keep_fed)
    monkeypatch.setattr(EndpointWorker, "train", train)
    _main(out, "--contributor", str(model), "--contributor-name", "api")

    fed = feds[0]
    assert fed.roster.rollout_only("api") and fed.contributors == ["api"] and sorted(fed.learners) == list(LEARNERS)
    assert isinstance(fed.workers["api"], EndpointWorker) and "api" not in fed.initial
    assert len(steps) == 2 and not trained
    for s in steps:
        assert s.contributed == ["api"] and "api" not in s.rejected      # validated and pooled
        assert s.accuracy["api"] is not None                            # re-verified, in the capability window
        assert set(s.reports) == set(LEARNERS) and "api" not in s.train_s
        for learner in LEARNERS:
            src = s.reports[learner]["per_source"]["api"]
            # of B·G = 2·2 rows (the learner's screens may drop some), none with a behaviour log-prob
            assert 1 <= src["rows"] <= 4 and src["no_logprob_rows"] == src["rows"]
            assert "capability_ratio" in src

    assert not (out / "contributor-serve.log").read_text().count("Traceback")
    cell = json.loads((out / "cells" / f"{RECIPE}+contrib-s0.json").read_text())
    assert cell["recipe"] == f"{RECIPE}+contrib" and set(cell["after"]) == set(LEARNERS)
    assert cell["contributor"]["source"] == str(model.resolve()) and cell["contributor"]["served"]
    assert cell["contributor"]["prompt_from"].endswith("hacrl_fed_prompt.json")
    assert cell["contributor"]["system_prompt"] == "Reply with \\boxed{answer}."
    assert [c["accepted"] for c in cell["contributor_steps"]] == [True, True]
    for learner in LEARNERS:
        for rec in cell["per_step"][learner]:
            c = rec["contributor"]
            assert c["delivered"] == 4 and 1 <= c["rows"] <= 4 and c["no_logprob_rows"] == c["rows"]
            assert 0 <= c["grad_rows"] <= c["rows"] and "api" not in rec["peers"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["contributor"]["url"].startswith("http://127.0.0.1:") and set(meta["models"]) == set(LEARNERS)
    # the directory's command stays the one of its cells without the contributor; the contributor's is its own
    assert "--contributor" not in meta["command"] and "--contributor" in meta["contributor"]["command"]

    summary = json.loads((out / "results.json").read_text())
    with_c = summary["recipes"][f"{RECIPE}+contrib"]["agents"]["llama-bpe"]
    assert with_c["held_out"]["vs_without_contrib"] is not None
    assert with_c["contributor"]["delivered"] == 8 and with_c["contributor"]["share"] is not None
    md = (out / "results.md").read_text()
    assert "## With a rollout-only contributor" in md and f"Command: `{meta['contributor']['command']}`" in md
    assert "contributor" not in summary["recipes"][RECIPE]["agents"]["llama-bpe"]

    with pytest.raises(SystemExit):      # the same directory never takes another contributor's cells
        _main(out, "--contributor", str(tmp_path), "--contributor-name", "api")


def test_contributor_rows_counts_the_rows_with_a_gradient_and_the_share():
    def step(rows: float, grad_frac: float, accepted: bool = True):
        per_source = {"api": {"rows": rows, "grad_frac": grad_frac, "no_logprob_rows": rows, "pos_adv_rows": 3.0,
                              "pos_adv_grad_rows": 3.0}} if rows else {}
        return SimpleNamespace(step=1, contributed=["api"] if accepted else [],
                               generate_metrics={"api": {"rollouts": 8.0}},
                               reports={"a": {"metrics": {}, "per_source": per_source, "rejected": []}})

    got = run_collab.contributor_rows(step(8, 0.375), "a", "api")
    assert got["delivered"] == 8 and got["rows"] == 8 and got["grad_rows"] == 3 and not got["rejected_by_learner"]
    refused = run_collab.contributor_rows(step(0, 0.0, accepted=False), "a", "api")
    assert refused["delivered"] == 0 and refused["rows"] == 0 and refused["grad_rows"] == 0

    cells = [{"per_step": {"a": [{"contributor": run_collab.contributor_rows(step(8, g), "a", "api")}
                                 for g in (0.25, 0.5)]}} for _ in range(2)]
    s = run_collab.contributor_summary(cells, "a")
    assert s["delivered"] == 32 and s["grad_rows"] == 12 and s["share"] == 12 / 32
    assert s["share_per_step"] == [0.25, 0.5] and s["in_update_share"] == 1.0


def test_a_contributor_run_keeps_the_directory_command_and_its_seeds(tmp_path):
    """meta.json describes the directory's command (the cells without a contributor); a later ``--contributor`` run
    with fewer seeds keeps that command's seed count (so the summary still says which of its seeds the cells hold)
    and records its own command with the contributor."""
    from collab.results import merge_meta

    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"command": "run_collab.py --seeds 2", "seeds": 2, "steps": 20}))
    site = {"name": "strong", "command": "run_collab.py --seeds 1 --contributor strong:0.9"}
    got = merge_meta(path, {"command": "run_collab.py --seeds 1 --contributor strong:0.9", "seeds": 1, "steps": 20},
                     site)
    assert got["command"] == "run_collab.py --seeds 2" and got["seeds"] == 2 and got["contributor"] == site
    path.write_text(json.dumps(got))
    plain = merge_meta(path, {"command": "run_collab.py --seeds 3", "seeds": 3, "steps": 20}, None)
    assert plain["command"] == "run_collab.py --seeds 3" and plain["seeds"] == 3 and plain["contributor"] == site
    assert plain["commands"] == ["run_collab.py --seeds 2", "run_collab.py --seeds 3"]


def test_a_run_with_other_recipes_keeps_the_earlier_commands_on_record(tmp_path):
    """Cells added to a directory by a second command (other recipes, fewer seeds) leave the first command and its
    seed count on record; the summary names both commands."""
    from collab.render import command_line
    from collab.results import merge_meta

    path = tmp_path / "meta.json"
    first = {"command": "run_collab.py --recipes gspo,hacpo_cross_family --seeds 2", "seeds": 2, "steps": 20}
    path.write_text(json.dumps(merge_meta(path, first, None)))
    second = {"command": "run_collab.py --recipes hacpo_cross_family_distill --seeds 1", "seeds": 1, "steps": 20}
    got = merge_meta(path, second, None)
    assert got["commands"] == [first["command"], second["command"]] and got["seeds"] == 2
    path.write_text(json.dumps(got))
    assert merge_meta(path, second, None)["commands"] == got["commands"]     # the same command again: once
    assert command_line(got) == f"Commands (each added cells): `{first['command']}`; `{second['command']}`"
    assert command_line(first) == f"Command: `{first['command']}`"     # a directory of one command, as before
