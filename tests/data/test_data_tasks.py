"""The reasoning-gym task source: seeded, disjoint training and held-out items, each with its task and scorer."""

from __future__ import annotations

from collections import Counter

import pytest

from hacrl_fed.config import ConfigError, DataConfig, SimulateConfig, TaskSpec
from hacrl_fed.data.datasets import load_problems
from hacrl_fed.data.problem import DataError
from hacrl_fed.data.tasks import TRAIN_SEED_BASE, answer_style_for, generate_task, task_counts

SUITE = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}, "label": "sums"},
         {"name": "spell_backward", "config": {"max_word_len": 4}, "weight": 3.0}]


def _cfg(**kw) -> DataConfig:
    return DataConfig(**{"source": "reasoning_gym", "num_problems": 60, "eval_size": 6, "tasks": SUITE,
                         "eval_tasks": [{"name": "gsm_symbolic"}], **kw})


def test_train_and_held_out_never_coincide_and_carry_their_task():
    train, held = load_problems(_cfg())
    assert {p.id for p in train}.isdisjoint(p.id for p in held)
    assert {p.problem for p in train}.isdisjoint(p.problem for p in held)
    # one-digit sums repeat across generator seeds: the text check removed the coinciding ones
    assert 0 < len(train) <= 60
    assert Counter(p.source for p in held) == {"sums": 6, "spell_backward": 6, "gsm_symbolic": 6}
    assert {p.source for p in train} == {"sums", "spell_backward"}        # eval_tasks are never trained
    assert all(p.problem.endswith("Put the final answer within \\boxed{}.") for p in train + held)
    assert all(int(p.id.rsplit("-", 1)[1]) >= TRAIN_SEED_BASE for p in train)
    assert all(int(p.id.rsplit("-", 1)[1]) < 6 for p in held)


def test_held_out_is_the_same_for_every_seed_and_training_differs():
    train0, held0 = load_problems(_cfg(seed=0))
    train1, held1 = load_problems(_cfg(seed=1))
    assert held0 == held1
    assert [p.id for p in train0] != [p.id for p in train1]
    assert load_problems(_cfg(seed=0)) == (train0, held0)               # deterministic


def test_weights_split_the_training_items():
    assert task_counts([TaskSpec(name="a", weight=1.0), TaskSpec(name="b", weight=3.0)], 60) == [15, 45]
    assert task_counts([TaskSpec(name="a"), TaskSpec(name="b"), TaskSpec(name="c")], 10) == [4, 3, 3]
    assert task_counts([TaskSpec(name="a", weight=100.0), TaskSpec(name="b", weight=0.001)], 5) == [4, 1]
    spell = [p for p in load_problems(_cfg())[0] if p.source == "spell_backward"]
    assert len(spell) == 45                                              # words do not repeat in 45 draws


def test_numbers_go_to_math_verify_and_other_answers_to_the_task_scorer():
    train, _ = load_problems(_cfg())
    styles = {p.source: p.answer_style for p in train}
    assert styles == {"sums": "boxed", "spell_backward": "task:spell_backward"}
    assert answer_style_for(" 0.3125 ", "coin_flip") == "boxed"
    assert answer_style_for("0x5b993", "bitwise_arithmetic") == "task:bitwise_arithmetic"


@pytest.mark.parametrize(("spec", "match"), [
    ({"name": "no_such_generator"}, "no generator 'no_such_generator'"),
    ({"name": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}, "bad config"),
    ({"name": "chain_sum", "config": {"not_a_field": 1}}, "bad config"),
    ({"name": "calendar_arithmetic"}, "needs the item's metadata"),
])
def test_bad_tasks_fail_before_the_run_naming_the_task(spec, match):
    with pytest.raises(DataError, match=match):
        generate_task(TaskSpec(**spec), seed=0, size=2, held_out=False, instruction="")


def test_config_checks_labels_and_source():
    with pytest.raises(ValueError, match="unique"):
        DataConfig(source="reasoning_gym", tasks=[{"name": "chain_sum"}, {"name": "chain_sum"}])
    DataConfig(source="reasoning_gym", tasks=[{"name": "chain_sum"}, {"name": "chain_sum", "label": "chain_sum-l2"}])
    with pytest.raises(ValueError, match="at least one task"):
        DataConfig(source="reasoning_gym")
    with pytest.raises(ValueError, match="apply to data.source = 'reasoning_gym'"):
        DataConfig(source="arithmetic", tasks=[{"name": "chain_sum"}])
    with pytest.raises(ValueError):
        TaskSpec(name="../etc")


def test_the_committed_task_suite_config_loads(tmp_path):
    from pathlib import Path

    from hacrl_fed.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "tasks.toml", SimulateConfig)
    train, held = load_problems(cfg.run.data)
    assert {p.source for p in train} == {t.label for t in cfg.run.data.tasks}
    assert {p.source for p in held} >= {t.label for t in cfg.run.data.eval_tasks}


def test_unknown_key_in_a_task_is_a_config_error(tmp_path):
    from hacrl_fed.config import load_config

    bad = tmp_path / "bad.toml"
    bad.write_text('[run]\ndata = { source = "reasoning_gym", tasks = [{ name = "chain_sum", wieght = 2 }] }\n'
                   '[[agents]]\nname = "a"\n[agents.model]\nname_or_path = "x"\n')
    with pytest.raises(ConfigError, match="wieght"):
        load_config(bad, SimulateConfig)
