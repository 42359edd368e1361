"""The strong contributor of the benchmarks (``benchmarks/strong_contributor.py``): a real HTTP server speaking the
chat-completions API, whose answers the project's own verifier scores right at the configured accuracy, and which
a rollout-only site's endpoint engine reads like any API."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import strong_contributor as sc  # noqa: E402

from hacrl_fed.config import DataConfig  # noqa: E402
from hacrl_fed.data.datasets import load_problems  # noqa: E402
from hacrl_fed.reward.verifier import Verifier  # noqa: E402

DATA = DataConfig(source="reasoning_gym", num_problems=24, eval_size=4, tasks=[
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}},
    {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}},
], eval_tasks=[{"name": "decimal_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_num_decimal_places": 1,
                                                       "max_num_decimal_places": 1, "precision": 4}}])


@pytest.fixture(scope="module")
def problems():
    train, held = load_problems(DATA)
    return train + held


@pytest.fixture(scope="module")
def verifier():
    with Verifier(timeout_s=5, workers=1) as v:
        yield v


def _ask(url: str, text: str, n: int, seed: int = 0) -> list[str]:
    r = httpx.post(f"{url}/chat/completions", json={
        "model": "strong-contributor", "n": n, "seed": seed, "temperature": 0.7,
        "messages": [{"role": "system", "content": "Answer in \\boxed{}."}, {"role": "user", "content": text}]})
    r.raise_for_status()
    return [c["message"]["content"] for c in r.json()["choices"]]


def _right(verifier, problems, texts_per_problem) -> list[bool]:
    flat = [(t, p) for p, texts in zip(problems, texts_per_problem, strict=True) for t in texts]
    verdicts = verifier.verify([t for t, _ in flat], [p.answer for _, p in flat], [p.answer_style for _, p in flat])
    return [v.verdict == "correct" for v in verdicts]


def test_worked_solutions_are_right_at_p_1_and_wrong_at_p_0(problems, verifier):
    with sc.serve_strong_contributor(DATA, accuracy=1.0) as url:
        right = _right(verifier, problems, [_ask(url, p.problem, 2) for p in problems])
    assert all(right), f"{right.count(False)} of {len(right)} worked solutions scored wrong at p = 1"
    with sc.serve_strong_contributor(DATA, accuracy=0.0) as url:
        right = _right(verifier, problems, [_ask(url, p.problem, 2) for p in problems])
    assert not any(right)


def test_accuracy_p_is_the_share_right_and_a_request_repeats(problems, verifier):
    with sc.serve_strong_contributor(DATA, accuracy=0.5, seed=3) as url:
        texts = [_ask(url, p.problem, 16) for p in problems]
        again = [_ask(url, p.problem, 16) for p in problems[:3]]
        other_seed = [_ask(url, p.problem, 16, seed=1) for p in problems[:3]]
    right = _right(verifier, problems, texts)
    share = sum(right) / len(right)
    # 16 choices × 32 items = 512 Bernoulli(0.5) draws: sd 0.022, so ±0.1 is > 4 sd
    assert 0.4 < share < 0.6, share
    assert again == texts[:3]
    assert other_seed != texts[:3]


def test_solutions_are_brief_worked_steps():
    item = sc.Item("leg_counting-7", "leg_counting", "16", {"animals": {"chicken": 2, "cow": 3}})
    text = sc.worked_solution(item, "how many legs", "16")
    assert text == "2 chickens have 2 × 2 = 4 legs, 3 cows have 3 × 4 = 12 legs, 4 + 12 = 16. \\boxed{16}"
    item = sc.Item("decimal_arithmetic-0", "decimal_arithmetic", "13.1", {})
    assert sc.worked_solution(item, "Only reply with the final value.\n3.3+9.8 = ?", "13.1") == \
        "3.3 + 9.8 = 13.1. \\boxed{13.1}"
    assert sc.wrong_answer("13.1", random.Random(0)) in {"13.0", "13.2"}
    assert sc.wrong_answer("7", random.Random(0)) in {"6", "8"}


def test_an_unknown_problem_is_refused_and_a_bad_request_gets_400():
    with sc.serve_strong_contributor(DATA, accuracy=1.0) as url:
        assert _ask(url, "What is the capital of France?", 1) == [sc.REFUSAL]
        bad = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 10_000})
        assert bad.status_code == 400 and "n must be" in bad.json()["error"]["message"]
        junk = httpx.post(f"{url}/chat/completions", content=b"not json", headers={"content-type": "application/json"})
        assert junk.status_code == 400
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "strong-contributor"


def test_a_rollout_only_site_reads_it_like_any_api(problems):
    from hacrl_fed.rollout.endpoint import EndpointRolloutSource, EndpointSettings

    with sc.serve_strong_contributor(DATA, accuracy=1.0) as url:
        source = EndpointRolloutSource(EndpointSettings(base_url=url, model="strong-contributor", max_retries=0))
        out = source.generate([[{"role": "user", "content": problems[0].problem}]], 2, temperature=0.7, top_p=1.0,
                              max_tokens=64, seed=0)
    assert len(out) == 2 and {s.prompt_index for s in out} == {0}
    assert all("\\boxed{" + problems[0].answer + "}" in s.text and s.logprob_sum is None for s in out)
