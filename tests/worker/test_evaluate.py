"""avg@k / pass@k and the ``hacrl-fed eval`` command."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.play.evaluate import ProblemResult, pass_at_k, summarize

GSM8K_TEST = Path("/work/shared/data/math/gsm8k_test.jsonl")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_at_k(n, n + 1, 1)
    with pytest.raises(ValueError):
        pass_at_k(n, 0, n + 1)


def test_summarize():
    results = [ProblemResult("a", "", "", 2, 4, verdicts=["correct"] * 2 + ["incorrect"] * 2,
                             finish_reasons=["stop"] * 3 + ["length"], response_tokens=[4, 4, 8, 8]),
               ProblemResult("b", "", "", 0, 4, verdicts=["incorrect"] * 3 + ["verifier_error"],
                             finish_reasons=["stop"] * 4, response_tokens=[2] * 4)]
    s = summarize(results)
    assert s["avg@4"] == 0.25 and s["problems"] == 2
    assert s["pass@1"] == pytest.approx(0.25) and s["pass@4"] == 0.5
    assert s["pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert s["verifier_error_frac"] == 1 / 8 and s["length_frac"] == 1 / 8 and s["response_tokens_mean"] == 4.0
    with pytest.raises(ValueError):
        summarize(results + [ProblemResult("c", "", "", 0, 2)])


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="shared GSM8K test file not present")
def test_eval_command_on_gsm8k_rows(tmp_path, model_cache, monkeypatch):
    monkeypatch.setenv("HACRL_FED_CACHE", model_cache)
    out = tmp_path / "res" / "results.jsonl"
    result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", str(GSM8K_TEST), "--limit", "20",
                                      "--samples", "2", "--max-new-tokens", "8", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["problems"] == 20 and 0.0 <= summary["avg@2"] <= summary["pass@2"] <= 1.0
    from hacrl_fed.worker.engines import resolve_engine

    assert summary["engine"] == resolve_engine("auto")            # the default engine, resolved, is recorded
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected_ids = [json.loads(line)["id"] for line in GSM8K_TEST.read_text().splitlines()[:20]]
    assert [r["prompt_id"] for r in rows] == expected_ids
    for r in rows:
        assert r["total"] == 2 and len(r["responses"]) == 2 and 0 <= r["correct"] <= 2
        assert set(r["verdicts"]) <= {"correct", "incorrect", "verifier_error"}
        assert all(1 <= t <= 8 for t in r["response_tokens"])
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]   # no temp files left


def test_eval_command_prints_a_readable_summary(tmp_path, model_cache, monkeypatch):
    monkeypatch.setenv("HACRL_FED_CACHE", model_cache)
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", str(data), "--samples", "2",
                                      "--max-new-tokens", "4", "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("tiny-llama-bpe on "))
    assert lines[head].endswith(" s") and "3 problems × 2 samples (temperature 1)" in lines[head]
    labels = [line.split()[0] for line in lines[head + 1:-1]]
    assert labels == ["avg@2", "pass@1", "pass@2", "truncated", "verifier"]
    assert "hit --max-new-tokens 4" in lines[head + 4] and lines[-1] == f"per-problem results: {tmp_path / 'r.jsonl'}"
    assert not any(line.startswith("{") for line in lines)


def test_eval_command_errors(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "no such data file" in missing.output
    bad = runner.invoke(app, ["eval", "--model", "x", "--data", str(tmp_path), "--dtype", "float64"])
    assert bad.exit_code == 2 and "dtype" in bad.output


def test_eval_on_a_data_file_with_unknown_columns_exits_2_with_one_line(tmp_path):
    """A bad data file is a usage error (exit 2), found before the model loads; it used to exit 1."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "What is 1 + 1?", "a": "2"}\n')
    res = CliRunner().invoke(app, ["eval", "--model", "no-such-model-is-loaded", "--data", str(data)])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {data}:1: no problem text: expected a 'problem', 'question' or 'prompt' column\n"


def test_eval_of_an_unknown_model_ends_with_one_line_before_any_announcement(tmp_path):
    """An unknown ``--model`` is a usage error found before the engine choice or the prompt is announced and before
    anything loads: the one line is the error."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "What is 1 + 1?", "answer": "2"}\n')
    res = CliRunner().invoke(app, ["eval", "--model", "./models/no-such-model", "--data", str(data)])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: no such model directory or file: ./models/no-such-model (known aliases: ")
    assert len(res.stderr.splitlines()) == 1 and res.stdout == "", res.output


def test_eval_logs_progress_on_stderr(tmp_path, model_cache):
    """``hacrl-fed eval`` switches on INFO logging once its inputs are checked: an engine's weight conversion (ct2's
    can take tens of seconds) shows on stderr, as does the progress bar; stdout holds the summary only."""
    import os
    import subprocess
    import sys

    pytest.importorskip("ctranslate2")
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"id": "p0", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "hacrl_fed.cli", "eval", "--model", "tiny-llama-bpe", "--data",
                           str(data), "--max-new-tokens", "4", "--engine", "ct2", "--json"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HACRL_FED_CACHE": model_cache})
    assert proc.returncode == 0, proc.stderr
    assert "ct2: weights version" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["engine"] == "ct2"                                 # stdout: the summary only (progress: stderr)
    assert summary["problems"] == 1 and isinstance(summary["problems"], int)     # a count, printed as one
