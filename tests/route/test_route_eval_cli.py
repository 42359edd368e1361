"""``hacrl-fed route eval`` end to end on two tiny local models (real generation, the real verifier), and its
one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.route.router import Router

runner = CliRunner()


def _queries(path, n=6):
    rows = [{"id": f"{t}-{i}", "problem": f"What is {i} {op} {i + 1}?", "answer": str(i + i + 1 if op == "+" else i * (i + 1)),
             "source": t} for t, op in (("add", "+"), ("mul", "*")) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_route_eval_compares_policies_writes_its_files_and_reuses_outcomes(tmp_path):
    data = _queries(tmp_path / "q.jsonl")
    args = ["route", "eval", "--model", "llama=tiny-llama-bpe", "--model", "gemma=tiny-gemma-unigram",
            "--data", str(data), "--out", str(tmp_path / "out"), "--max-new-tokens", "4", "--k", "2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "| best_single |" in res.output and "| oracle |" in res.output and "| knn |" in res.output
    out = tmp_path / "out"
    rec = json.loads((out / "route.json").read_text())
    assert rec["models"] == ["llama", "gemma"] and rec["queries"] == 6 and rec["calibration_queries"] == 6
    assert rec["cost_kind"] == "param_tokens"
    from hacrl_fed.worker.engines import resolve_engine

    assert rec["engine"] == resolve_engine("auto")               # auto, resolved to the engine that generated
    for name, row in rec["policies"].items():
        assert sum(row["share"].values()) == pytest.approx(1.0), name
        assert row["accuracy"] <= rec["policies"]["oracle"]["accuracy"] + 1e-9, name
        assert len(row["per_query_accuracy"]) == 6
    assert (out / "route.png").stat().st_size > 0 and (out / "route.md").read_text().startswith("# Routing")
    for name in ("llama", "gemma"):
        cached = json.loads((out / "outcomes" / f"{name}.json").read_text())
        assert len(cached["outcomes"]["query_ids"]) == 12 and cached["outcomes"]["params"] > 0
    router = Router.load(out / "router.json")
    assert set(router.rank("What is 3 * 4?")) == {"llama", "gemma"}
    # a second run with the same inputs measures nothing again: same outcomes, same table
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "outcomes").iterdir()}
    again = runner.invoke(app, [*args, "--json"])
    assert again.exit_code == 0, again.output
    assert {p.name: p.stat().st_mtime_ns for p in (out / "outcomes").iterdir()} == mtimes
    summary = json.loads(again.output.strip().splitlines()[-1])
    assert summary["knn"]["accuracy"] == pytest.approx(rec["policies"]["knn"]["accuracy"])


@pytest.mark.parametrize("extra, message", [
    (["--model", "only=tiny-llama-bpe"], "at least two"),
    (["--model", "a=tiny-llama-bpe", "--model", "a=tiny-gemma-unigram"], "given twice"),
    (["--model", "a=tiny-llama-bpe", "--model", "noequals"], "expected NAME=DIR_OR_URL"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--cost", "dollars"], "--cost"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--params", "c=1M"], "which no --model names"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=http://127.0.0.1:9"], "has no path"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--params", "b=-3"], "--params"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--embedder", "/no/such/dir"], "--embedder"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=http://127.0.0.1:9/v1", "--api-key-env", "b=HACRL_NO_SUCH_VAR"],
     "not set"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--engine", "no-such-engine"],
     "--engine: unknown rollout engine 'no-such-engine'"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram", "--engine", "vllm"], "--device cuda"),
    (["--model", "a=tiny-llama-bpe", "--model", "b=./models/no-such-model"],     # before the engine line is printed
     "--model b: no such model directory or file: ./models/no-such-model"),
])
def test_bad_options_end_with_one_line_and_exit_2(tmp_path, extra, message):
    data = _queries(tmp_path / "q.jsonl")
    res = runner.invoke(app, ["route", "eval", "--data", str(data), "--out", str(tmp_path / "o"), *extra])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_engine_option_reaches_every_local_model_and_the_cache_key(tmp_path, monkeypatch):
    """``--engine loop`` builds the loop engine for each local model (as ``hacrl-fed eval --engine``); its outcomes
    are not those cached under another engine: a rerun with another engine measures again. The default, ``auto``,
    runs the engine it resolves to and says which."""
    import hacrl_fed.worker.engines as engines

    built = []
    real = engines.build_engine

    def spy(loaded, model_cfg, **kw):
        engine = real(loaded, model_cfg, **kw)
        built.append((model_cfg.engine, type(engine).__name__))
        return engine

    monkeypatch.setattr(engines, "build_engine", spy)
    data = _queries(tmp_path / "q.jsonl", n=2)
    args = ["route", "eval", "--model", "llama=tiny-llama-bpe", "--model", "gemma=tiny-gemma-unigram",
            "--data", str(data), "--out", str(tmp_path / "out"), "--max-new-tokens", "3", "--k", "2"]
    res = runner.invoke(app, [*args, "--engine", "loop"])
    assert res.exit_code == 0, res.output
    assert [e for e, _ in built] == ["loop", "loop"], built
    assert all("Loop" in cls for _, cls in built), built
    built.clear()
    res = runner.invoke(app, args)                       # the default engine: measured again, not reused
    assert res.exit_code == 0, res.output
    auto = engines.resolve_engine("auto")                # ct2 where ctranslate2 is installed (the dev extra), else hf
    runs = "CT2RolloutEngine" if auto == "ct2" else "HFRolloutEngine"
    assert built == [("auto", runs), ("auto", runs)], built   # auto's factory builds it (hf if ct2 cannot)
    assert f"engine: {auto} (auto: " in res.output
    built.clear()
    res = runner.invoke(app, [*args, "--engine", "hf"])  # hf by name: a third engine, a third measurement
    assert res.exit_code == 0, res.output
    assert [e for e, _ in built] == ["hf", "hf"] and "engine: " not in res.output, (built, res.output)


def test_a_missing_data_file_ends_with_one_line(tmp_path):
    res = runner.invoke(app, ["route", "eval", "--model", "a=tiny-llama-bpe", "--model", "b=tiny-gemma-unigram",
                              "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "none.jsonl" in res.output and len(res.output.strip().splitlines()) == 1


def test_route_eval_with_a_real_transformers_serve_endpoint(tmp_path):
    """One model local, one behind a real OpenAI-compatible server (``transformers serve``): both answer every
    query; the endpoint's parameters come from --params, its seconds are measured per request."""
    from tf_serve import transformers_serve

    from hacrl_fed.tiny_models import build_tiny_model

    model = build_tiny_model("tiny-llama-bpe", tmp_path / "model")
    data = _queries(tmp_path / "q.jsonl", n=3)
    with transformers_serve(model, tmp_path / "serve.log") as url:
        res = runner.invoke(app, ["route", "eval", "--model", "local=tiny-gemma-unigram", "--model", f"api={url}",
                                  "--api-model", f"api={model}", "--params", "api=1M", "--data", str(data),
                                  "--out", str(tmp_path / "out"), "--max-new-tokens", "4", "--k", "2"])
    assert res.exit_code == 0, res.output
    api = json.loads((tmp_path / "out" / "outcomes" / "api.json").read_text())["outcomes"]
    assert api["params"] == 1e6 and len(api["query_ids"]) == 6
    assert all(f in ("stop", "length") for f in api["finish"])           # every request answered
    assert all(s > 0 for s in api["seconds"]) and all(0 < t <= 4 for t in api["tokens"])
    rec = json.loads((tmp_path / "out" / "route.json").read_text())
    assert rec["cost_kind"] == "param_tokens" and set(rec["policies"]["random"]["share"]) == {"local", "api"}
