"""What one row may cost the verifier: pathological shapes (power towers, huge factorials, exponent chains) are cut
before the symbolic comparison with the right verdict, and a source that spends its CPU budget for the step has
its remaining rows refused with the reason — at the coordinator and at every site that re-verifies them."""

from __future__ import annotations

import pytest

from hacrl_fed.reward import Verifier
from hacrl_fed.reward.compare import MAX_DIGITS, exact_size


@pytest.fixture(scope="module")
def strict():
    """One worker, no retry, 3 CPU s per item: a shape that is not cut shows as a ``timeout`` verdict."""
    with Verifier(timeout_s=3.0, workers=1, retries=0) as v:
        yield v


@pytest.mark.parametrize("answer, reference, verdict, reason", [
    ("x+1", r"(10!)^{(10!)^{(10!)}}", "verifier_error", "reference_too_large"),      # a power tower as reference
    (r"(10!)^{(10!)^{(10!)}}", "x+1", "incorrect", "answer_too_large"),
    (r"2^{2^{2^{2^{2^{2}}}}}", "x", "incorrect", "answer_too_large"),                 # an exponent chain
    (r"(10^{7})!", "x", "incorrect", "answer_too_large"),                             # a huge factorial
    (r"x^{10^{12}}", "x", "incorrect", "answer_too_large"),
    (r"\left(\frac{1}{2}\right)^{(10!)^{10}} + x", "x", "incorrect", "answer_too_large"),
])
def test_pathological_shapes_are_cut_before_the_symbolic_comparison(strict, answer, reference, verdict, reason):
    v = strict.verify_one(rf"The answer is \boxed{{{answer}}}.", reference)
    assert (v.verdict, v.reason) == (verdict, reason)


@pytest.mark.parametrize("answer, reference, verdict", [
    (r"20000! + 1", "20000!", "incorrect"),             # 77 338 digits: still compared exactly
    (r"\frac{1}{2006!}", r"\frac{1}{2004!}", "incorrect"),
    (r"2^{100000}", r"2^{100000}", "correct"),
    (r"2^{2^{4}}", r"2^{16}", "correct"),
    (r"\sqrt{2}", r"2^{1/2}", "correct"),
    (r"x^{10}", r"x^{10}", "correct"),
])
def test_large_but_reasonable_values_are_still_compared(strict, answer, reference, verdict):
    assert strict.verify_one(rf"\boxed{{{answer}}}", reference).verdict == verdict


def test_the_size_bound_is_read_off_the_unevaluated_tree():
    from math_verify import parse

    def size(text: str) -> float:
        return exact_size(parse("\\boxed{" + text + "}", parsing_timeout=None)[0])

    assert size("20000!") < MAX_DIGITS < size("30000!")
    assert size("2^{100000}") <= MAX_DIGITS < size("2^{1000000}")
    assert size("1^{10^{100}}") < 200                    # a power of one costs its exponent only
    assert size(r"(10!)^{(10!)^{(10!)}}") == float("inf")


def test_a_source_past_its_cpu_budget_has_its_remaining_rows_refused():
    """With a budget any row exhausts, each source's first row is verified and its others refused with the
    reason; another source's rows are not touched by it."""
    with Verifier(timeout_s=3.0, workers=1, retries=0, source_budget_s=1e-6) as v:
        out = v.verify([r"\boxed{5}"] * 4 + [r"\boxed{7}"], ["5"] * 4 + ["7"], sources=["mallory"] * 4 + ["alice"])
        plain = v.verify([r"\boxed{5}"] * 2, ["5"] * 2)             # no sources given: no per-source bound
    assert [x.verdict for x in out] == ["correct", "verifier_error", "verifier_error", "verifier_error", "correct"]
    assert all(x.reason.startswith("source_budget") for x in out[1:4]) and out.over_budget == 3
    assert [x.verdict for x in plain] == ["correct", "correct"]


def test_the_coordinator_and_the_sites_pass_each_row_s_source():
    """``reverify`` at the coordinator and the site guard's re-verification give the Verifier each row's agent."""
    from fedutil import make_plan

    from hacrl_fed.coordinator.phases import reverify
    from hacrl_fed.v1 import rollout_pb2 as pb

    plan = make_plan(step=1, b=1, g=3)
    calls = []

    class Recording(Verifier):
        def verify(self, responses, references, styles="boxed", problems=None, *, sources=None):
            calls.append(list(sources or []))
            return super().verify(responses, references, styles, problems, sources=sources)

    class Item:
        def __init__(self, agent: str) -> None:
            self.agent = agent
            self.batch = pb.RolloutBatch(run_id=plan.run_id, step=1, agent_id=agent)
            for j in range(3):
                self.batch.rollouts.add(prompt_id=plan.prompts[0].prompt_id, sample_index=j, response_text=r"\boxed{1}",
                                        finish_reason=pb.STOP, reward=0.0, verdict=pb.INCORRECT)

    with Recording(timeout_s=3.0, workers=1, retries=0, source_budget_s=1e-6) as v:
        out = reverify(v.verify, [Item("alice"), Item("mallory")], plan)
    assert calls == [["alice"] * 3 + ["mallory"] * 3]
    assert [out[a].verifier_errors for a in ("alice", "mallory")] == [2, 2]
