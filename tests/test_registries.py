"""The extension points' registries (hacrl_fed/registries.py) and docs/extending.md.

Each new kind — a task source, an answer style, a rollout engine — is one small module under tests/helpers/
(toy_source.py, toy_style.py, toy_engine.py) plus one registration line here, and is then used through the
normal config path: the config names it, the run's own loader, verifier and engine builder use it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_fed.config import ConfigError, DataConfig, ModelConfig, RunConfig, parse_config
from hacrl_fed.registries import ANSWER_STYLES, DATA_SOURCES, ROLLOUT_ENGINES, Registry

REGISTRIES = (DATA_SOURCES, ANSWER_STYLES, ROLLOUT_ENGINES)
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture(autouse=True)
def _registries_as_before():
    """Every name a test registers is gone after it (the registries are process-wide)."""
    before = [set(r.names()) for r in REGISTRIES]
    yield
    for registry, names in zip(REGISTRIES, before, strict=True):
        for name in set(registry.names()) - names:
            registry.unregister(name)


# ----------------------------------------------------------------------------------- the three new kinds


def test_a_task_source_is_one_module_and_one_line():
    from hacrl_fed.data.datasets import load_problems

    with pytest.raises(ConfigError, match=r"unknown data source 'toy_products'; registered: arithmetic, episodes, "
                                          r"file, hf, reasoning_gym \(or an import path package\.module:attr\)"):
        parse_config({"data": {"source": "toy_products"}}, RunConfig)

    DATA_SOURCES.register("toy_products", "toy_source:load")

    run = parse_config({"data": {"source": "toy_products", "options": {"count": 10}, "eval_size": 2}}, RunConfig)
    train, held = load_problems(run.data)
    assert [p.id for p in held] == ["toy-1x1", "toy-1x2"] and len(train) == 8
    for p in train + held:
        a, b = map(int, re.findall(r"\d+", p.problem))
        assert p.answer == str(a * b) and p.answer_style == "boxed"


def test_a_source_may_be_named_by_import_path_and_what_it_returns_is_checked(monkeypatch):
    from hacrl_fed.data.datasets import DataError, load_problems

    train, _ = load_problems(DataConfig(source="toy_source:load", eval_size=1, options={"count": 3}))
    assert [p.id for p in train] == ["toy-1x2", "toy-1x3"]
    with pytest.raises(DataError, match=r"data.options.count must be an integer in 1..81, got 'x'"):
        load_problems(DataConfig(source="toy_source:load", options={"count": "x"}))
    import toy_source

    monkeypatch.setattr(toy_source, "load", lambda cfg: [("not", "a problem")])
    DATA_SOURCES.register("toy_broken", "toy_source:load")
    with pytest.raises(DataError, match=r"data source 'toy_broken' must return \(train, held_out\), two lists"):
        load_problems(DataConfig(source="toy_broken"))
    with pytest.raises(DataError, match=r"data.source: toy_source:nothing: toy_source has no attribute 'nothing'"):
        load_problems(DataConfig(source="toy_source:nothing"))


def test_an_answer_style_is_one_module_and_one_line_and_reaches_the_verifiers_processes():
    from hacrl_fed.reward import Verifier, check_answer
    from hacrl_fed.reward.extract import answer_end, is_answer_style

    with pytest.raises(ConfigError, match=r"unknown answer style 'arrow'; registered: boxed, gsm8k"):
        parse_config({"answer_style": "arrow"}, DataConfig)

    ANSWER_STYLES.register("arrow", "toy_style:extract")

    cfg = parse_config({"answer_style": "arrow"}, DataConfig)
    responses = ["6 * 7 => 42", "so \\boxed{42}", "=> 41\nthen nothing", "42"]
    with Verifier(timeout_s=30, workers=1) as verifier:   # the check runs in a spawned worker process
        verdicts = verifier.verify(responses, ["42"] * 4, cfg.answer_style)
    assert [v.verdict for v in verdicts] == ["correct", "incorrect", "incorrect", "incorrect"]
    assert [v.reason for v in verdicts][1:] == ["no_final_answer", "mismatch", "no_final_answer"]
    assert check_answer("=> 42", "42", "arrow").verdict == "correct"     # the same in-process
    assert answer_end("=> 42. Visit example.org", "arrow") == len("=> 42. Visit example.org")
    assert answer_end("x => 42\nVisit example.org", "arrow") == len("x => 42")
    assert not is_answer_style("toy_style:extract"), "a style named by a peer is never imported"


def test_an_answer_style_may_bring_its_own_checker():
    from hacrl_fed.reward import Verdict, check_answer

    class CaseFree:
        @staticmethod
        def extract(response: str) -> str | None:
            return response.strip() or None

        @staticmethod
        def check(answer, reference, problem) -> Verdict:
            return Verdict.correct("same_word", answer) if (answer or "").lower() == reference.lower() else (
                Verdict.incorrect("other_word", answer))

    ANSWER_STYLES.register("case_free", CaseFree())
    assert check_answer("Paris", "paris", "case_free") == Verdict.correct("same_word", "Paris")
    assert check_answer("Lyon", "paris", "case_free").reason == "other_word"


def test_a_rollout_engine_is_one_module_and_one_line(tmp_path):
    from hacrl_fed.launch.preflight import check_models
    from hacrl_fed.config import AgentConfig
    from hacrl_fed.worker.engines import build_engine
    from hacrl_fed.worker.models import load_model
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.rollout.engine import Sampling

    with pytest.raises(ConfigError, match=r"unknown rollout engine 'canned'; registered: auto, ct2, hf, loop, vllm"):
        parse_config({"name_or_path": "tiny-llama-bpe", "engine": "canned"}, ModelConfig)

    ROLLOUT_ENGINES.register("canned", "toy_engine:make_engine")

    cfg = parse_config({"name_or_path": "tiny-llama-bpe", "engine": "canned", "cache_dir": str(tmp_path),
                        "engine_options": {"text": "=> 6"}}, ModelConfig)
    check_models([AgentConfig(name="a", model=cfg)])                    # the pre-flight finds it
    lm = load_model(cfg)
    engine = build_engine(lm, cfg, work_dir=tmp_path)
    prompts = [render_prompt(lm.tokenizer, q, system_prompt="Solve.") for q in ("2 + 4?", "3 + 4?")]
    samples = engine.generate(prompts, 2, Sampling(max_new_tokens=8), seed=0)
    assert [(s.prompt_index, s.sample_index, s.text, s.finish_reason) for s in samples] == [
        (0, 0, "=> 6", "stop"), (0, 1, "=> 6", "stop"), (1, 0, "=> 6", "stop"), (1, 1, "=> 6", "stop")]


def test_the_three_together_through_a_runs_config(tmp_path):
    """A toy source's problems, generated by the toy engine, checked in the toy style: rewards as expected."""
    from hacrl_fed.data.datasets import load_problems
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.reward import Verifier
    from hacrl_fed.rollout.engine import Sampling
    from hacrl_fed.worker.engines import build_engine
    from hacrl_fed.worker.models import load_model

    DATA_SOURCES.register("toy_products", "toy_source:load")
    ANSWER_STYLES.register("arrow", "toy_style:extract")
    ROLLOUT_ENGINES.register("canned", "toy_engine:make_engine")

    run = parse_config({"data": {"source": "toy_products", "answer_style": "arrow", "eval_size": 1,
                                 "options": {"count": 7}}}, RunConfig)
    model = parse_config({"name_or_path": "tiny-llama-bpe", "engine": "canned", "cache_dir": str(tmp_path),
                          "engine_options": {"text": "it is => 4"}}, ModelConfig)
    train, _ = load_problems(run.data)
    lm = load_model(model)
    samples = build_engine(lm, model, work_dir=tmp_path).generate(
        [render_prompt(lm.tokenizer, p.problem, system_prompt=model.system_prompt) for p in train], 1,
        Sampling(max_new_tokens=8), seed=0)
    with Verifier(timeout_s=30, workers=1) as verifier:
        verdicts = verifier.verify([s.text for s in samples], [train[s.prompt_index].answer for s in samples],
                                   [train[s.prompt_index].answer_style for s in samples])
    assert {train[s.prompt_index].id: v.reward for s, v in zip(samples, verdicts)} == {
        "toy-1x2": 0.0, "toy-1x3": 0.0, "toy-1x4": 1.0, "toy-1x5": 0.0, "toy-1x6": 0.0, "toy-1x7": 0.0}


def test_an_engine_may_be_named_by_import_path_and_a_factory_must_return_an_engine(tmp_path):
    from types import SimpleNamespace

    from hacrl_fed.worker.engines import build_engine, require_engine

    loaded = SimpleNamespace(model=None, tokenizer=None, source=None, autocast_dtype=None)
    cfg = ModelConfig(name_or_path="tiny-llama-bpe", engine="toy_engine:CannedEngine.name")
    with pytest.raises(ImportError, match=r"model.engine = 'toy_engine:CannedEngine.name' names a str, not a"):
        require_engine(cfg.engine)
    ROLLOUT_ENGINES.register("nothing", "toy_engine:CannedEngine.prepare_update")   # returns None
    with pytest.raises(TypeError, match=r"model.engine = 'nothing': the factory returned a NoneType, not a rollout"):
        build_engine(loaded, ModelConfig(name_or_path="x", engine="nothing"), work_dir=tmp_path)


# ----------------------------------------------------------------------------------- the registry itself


def test_a_registry_refuses_taken_and_malformed_names_and_lists_the_names_it_knows():
    r = Registry("gadget", "x.gadget", "hacrl_fed.test_gadgets", {"one": "toy_style:extract"}, import_paths=False)
    assert r.names() == ("one",) and "one" in r and "two" not in r
    r.register("one", "toy_style:extract")                       # the same target again: no-op
    with pytest.raises(ValueError, match=r"gadget 'one' is already registered \(toy_style:extract\)"):
        r.register("one", "toy_source:load")
    for bad in ("One", "a-b", "", "x" * 65):
        with pytest.raises(ValueError, match="gadget name must match"):
            r.register(bad, "toy_style:extract")
    with pytest.raises(ValueError, match="is not an import path"):
        r.register("two", "toy_style.extract")
    with pytest.raises(TypeError, match="must be callable or an import path"):
        r.register("two", 3)

    @r.register("two")
    def two(x):
        return x

    assert r.get("two") is two and r.get("one")("=> 5") == "5"
    with pytest.raises(ValueError, match=r"^unknown gadget 'three'; registered: one, two$"):
        r.get("three")
    with pytest.raises(ValueError, match=r"unknown gadget 'toy_style:extract'"):   # no import paths here
        r.get("toy_style:extract")
    with pytest.raises(ValueError, match="is built in"):
        r.unregister("one")
    r.unregister("two")
    assert r.names() == ("one",)


def test_added_entries_travel_to_another_process_as_import_paths():
    import toy_style

    ANSWER_STYLES.register("arrow", toy_style.extract)
    ANSWER_STYLES.register("local_only", lambda text: text)
    assert ANSWER_STYLES.added() == {"arrow": "toy_style:extract"}
    r = Registry("answer style", "k", "hacrl_fed.test_none", {}, import_paths=False)
    r.restore(ANSWER_STYLES.added())
    assert r.get("arrow") is toy_style.extract


def test_an_installed_packages_entry_points_add_names_imported_only_when_used(monkeypatch):
    import importlib.metadata

    points = [importlib.metadata.EntryPoint("arrow", "toy_style:extract", "hacrl_fed.test_styles"),
              importlib.metadata.EntryPoint("Bad-Name", "toy_style:extract", "hacrl_fed.test_styles"),
              importlib.metadata.EntryPoint("worse", "not a path", "hacrl_fed.test_styles")]
    asked = []

    def entry_points(group):
        asked.append(group)
        return [p for p in points if p.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    r = Registry("answer style", "k", "hacrl_fed.test_styles", {"one": "toy_style:extract"}, import_paths=False)
    assert "one" in r and asked == [], "a known name reads no metadata"
    assert "arrow" in r and r.names() == ("arrow", "one") and asked == ["hacrl_fed.test_styles"]
    assert r.get("arrow")("=> 3") == "3"


def test_checking_a_config_imports_no_data_reward_or_rollout_code():
    code = ("import sys; from hacrl_fed.config import RunConfig, ModelConfig; "
            "RunConfig(data={'source': 'file', 'path': 'x.jsonl', 'answer_style': 'gsm8k'}); "
            "ModelConfig(name_or_path='x', engine='vllm', device='cuda'); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['hacrl_fed', 'data'], ['hacrl_fed', 'reward'], ['hacrl_fed', 'rollout'], ['hacrl_fed', 'worker'])"
            " or m == 'vllm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------------- docs/extending.md


def _documented() -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", DOC.read_text(encoding="utf-8")))


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.key)
def test_every_registered_name_is_documented(registry):
    missing = set(registry.names()) - _documented()
    assert not missing, f"docs/extending.md does not name the {registry.kind}s {sorted(missing)}"


_BUILTIN_PARTS = """
import json
from hacrl_fed.algo import registry as algo
from hacrl_fed.envs import env_ids
names = set(env_ids())
for table in (algo.ADVANTAGE_ESTIMATORS, algo.SELF_OBJECTIVES, algo.CROSS_OBJECTIVES, algo.LOSS_AGGREGATIONS):
    names |= set(table.names())
print(json.dumps(sorted(names)))
"""


def test_every_environment_and_algorithm_part_is_documented():
    """The package's own environments and algorithm parts, read in a fresh interpreter: environments that other
    tests register in this process (``test/...``) are not the package's."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _BUILTIN_PARTS], capture_output=True, text=True, check=True,
                         timeout=300)
    names = set(json.loads(out.stdout.strip().splitlines()[-1]))
    missing = names - _documented()
    assert not missing, f"docs/extending.md does not name {sorted(missing)}"


def test_the_page_has_a_section_per_extension_point():
    headings = re.findall(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    for point in ("A task source", "An answer style", "A rollout engine", "An environment", "A site kind"):
        assert any(h.startswith(point) for h in headings), f"docs/extending.md has no section {point!r}"
