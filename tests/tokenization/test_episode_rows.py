"""TrainingRow's episode fields (token_mask, turn_eos) and their conventions; single-turn rows unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hacrl_fed.tokenization.views import TrainingRow, collate, own_row


def episode(*, own=False, eos_lp=-0.75, truncated=False, finish="stop", behaviour_count=12) -> TrainingRow:
    # response: turn 1 (3 ids, EOS at 2) | glue (2) | turn 2 (2 ids, cut: no EOS) | glue (3) | turn 3 (3 ids, EOS at 12)
    mask = (1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1)
    return TrainingRow(prompt_id="e", sample_index=0, source_agent="a" if own else "b", is_own=own,
                       prompt_ids=(90, 91), response_ids=tuple(range(10, 23)), reward=1.0,
                       behaviour_logprob_sum=-20.0, behaviour_token_count=behaviour_count,
                       learner_token_count=sum(mask), truncated=truncated, finish_reason=finish,
                       behaviour_eos_logprob=eos_lp, token_mask=mask, turn_eos=(2, 12))


def test_episode_row_conventions():
    row = episode()
    assert row.is_episode and row.trained_token_count == row.learner_token_count == 8
    assert row.eos_positions == (2, 12) and row.ends_with_eos
    # the cross ratio leaves out both stopped turns' EOS, on both sides
    assert row.ratio_excludes_eos and row.ratio_eos_positions == (2, 12)
    assert row.ratio_source == (pytest.approx(-19.25), 10) and row.ratio_learner_tokens == 6
    assert row.token_ratio == 8 / 12
    # an unknown EOS log-prob, an own row, a truncated row, no content left: whole sums
    for other in (episode(eos_lp=None), episode(own=True), episode(truncated=True), episode(behaviour_count=2)):
        assert not other.ratio_excludes_eos and other.ratio_eos_positions == ()
        assert other.ratio_source == (other.behaviour_logprob_sum, other.behaviour_token_count)
        assert other.ratio_learner_tokens == other.learner_token_count
    # the last turn cut at max_new_tokens: incomplete, yet the earlier stopped turns' EOS are still left out
    cut = replace(episode(), finish_reason="length", turn_eos=(2,), behaviour_eos_logprob=-0.25)
    assert not cut.ends_with_eos and cut.ratio_eos_positions == (2,) and cut.ratio_source == (-19.75, 11)


def test_single_turn_rows_keep_their_conventions():
    stop = own_row(prompt_id="p", sample_index=0, agent="a", prompt_ids=[1, 2], response_ids=[5, 6, 7, 0],
                   reward=1.0, behaviour_logprob_sum=-3.0, finish_reason="stop", max_response_tokens=16)
    assert not stop.is_episode and stop.token_mask is None and stop.turn_eos == ()
    assert stop.eos_positions == (3,) and stop.trained_token_count == 4 and stop.ratio_eos_positions == ()
    foreign = replace(stop, is_own=False, source_agent="b", behaviour_eos_logprob=-0.5, behaviour_token_count=5)
    assert foreign.ratio_eos_positions == (3,) and foreign.ratio_source == (-2.5, 4)
    assert foreign.ratio_learner_tokens == 3
    length = replace(stop, finish_reason="length")
    assert length.eos_positions == () and not replace(foreign, finish_reason="length").ratio_excludes_eos


@pytest.mark.parametrize("change, match", [
    ({"token_mask": (1, 0)}, "token_mask"),
    ({"token_mask": (2,) * 13}, "token_mask"),
    ({"turn_eos": (12, 2)}, "turn_eos"),
    ({"turn_eos": (3,)}, "turn_eos"),      # a glue position
    ({"turn_eos": (13,)}, "turn_eos"),
    ({"token_mask": None}, "episode rows"),
])
def test_inconsistent_episode_fields_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        replace(episode(), **change)


def test_collate_marks_only_the_agent_turns_as_response():
    single = own_row(prompt_id="p", sample_index=0, agent="a", prompt_ids=[1, 2, 3], response_ids=[5, 6, 0],
                     reward=1.0, behaviour_logprob_sum=-3.0, finish_reason="stop", max_response_tokens=16)
    ep = episode()
    batch = collate([single, ep], pad_id=0)
    width = 2 + 13
    assert batch["input_ids"].shape == (2, width)
    assert batch["input_ids"][1].tolist() == [90, 91, *range(10, 23)]
    assert batch["attention_mask"].tolist() == [[1] * 6 + [0] * (width - 6), [1] * width]
    # single-turn: the whole response (its EOS equal to the pad id included); episode: prompt 0, then the mask
    assert batch["response_mask"].tolist() == [[0, 0, 0, 1, 1, 1] + [0] * (width - 6), [0, 0, *ep.token_mask]]
    assert batch["response_lens"].tolist() == [3, 13] and batch["prompt_lens"].tolist() == [3, 2]
    alone = collate([single], pad_id=0)
    assert torch.equal(alone["response_mask"][0], batch["response_mask"][0, :6])
