"""PromptSampler: epoch-wise without replacement, seeded, and resumable to the exact next batch."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hacrl_fed.data.arithmetic import generate
from hacrl_fed.data.sampler import PromptSampler

PROBLEMS = generate(23, 2, seed=0)


def ids(batch):
    return [p.id for p in batch]


def test_each_epoch_visits_every_problem_once():
    s = PromptSampler(PROBLEMS, batch_size=5, seed=7)
    drawn = [p.id for _ in range(23) for p in s.next_batch()]  # 115 problems = exactly 5 epochs
    for epoch in range(5):
        assert Counter(drawn[epoch * 23 : (epoch + 1) * 23]) == Counter(p.id for p in PROBLEMS)
    assert drawn[:23] != drawn[23:46]  # reshuffled between epochs
    assert (s.epoch, s.offset) == (5, 0)


def test_seeded():
    a = [ids(PromptSampler(PROBLEMS, 4, seed=1).next_batch()) for _ in range(2)]
    b = ids(PromptSampler(PROBLEMS, 4, seed=2).next_batch())
    assert a[0] == a[1] and a[0] != b


@pytest.mark.parametrize("stop_after", [0, 1, 4, 5, 11])
def test_resume_is_exact(stop_after):
    reference = PromptSampler(PROBLEMS, batch_size=5, seed=3)
    expected = [ids(reference.next_batch()) for _ in range(15)]
    s = PromptSampler(PROBLEMS, batch_size=5, seed=3)
    for _ in range(stop_after):
        s.next_batch()
    state = json.loads(json.dumps(s.state_dict()))  # survives a JSON round trip (checkpoint files)
    resumed = PromptSampler(list(PROBLEMS), batch_size=5, seed=3)
    resumed.load_state_dict(state)
    assert [ids(resumed.next_batch()) for _ in range(15 - stop_after)] == expected[stop_after:]


def test_mismatched_state_is_refused():
    state = PromptSampler(PROBLEMS, 5, seed=3).state_dict()
    with pytest.raises(ValueError, match="seed: saved 3, now 4"):
        PromptSampler(PROBLEMS, 5, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="fingerprint"):
        PromptSampler(PROBLEMS[::-1], 5, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        PromptSampler(PROBLEMS, 6, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="malformed"):
        PromptSampler(PROBLEMS, 5, seed=3).load_state_dict({"version": 1})
    with pytest.raises(ValueError, match="out of range"):
        PromptSampler(PROBLEMS, 5, seed=3).load_state_dict({**state, "offset": 23})


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one"):
        PromptSampler([], 1)
    with pytest.raises(ValueError, match=r"batch_size must be in 1\.\.23"):
        PromptSampler(PROBLEMS, 24)
