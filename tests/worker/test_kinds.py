"""The two kinds of row (hacrl_fed.play.kinds): which kind a plan, a prompt, a sample and a peer's rollout are,
and what each kind does with them — checks, screens, rows — without the caller asking "is this an episode?"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hacrl_fed.envs import EpisodeSpec
from hacrl_fed.play.episodes import EpisodeSample
from hacrl_fed.rollout.engine import GeneratedSample
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.play.kinds import (EPISODES, KINDS, ONE_SHOT, PromptError, check_one_kind, claimed_kind, plan_kind,
                                  rollout_kind, rollouts_kind, sample_kind, split_by_kind)

GUESS = "textarena/GuessTheNumber-v0"


def one_shot(i: int = 0, **kw) -> pb.PromptItem:
    return pb.PromptItem(**{"prompt_id": f"p{i}", "text": "What is 2 + 3?", "reference_answer": "5",
                            "answer_style": "boxed", **kw})


def episode(i: int = 0) -> pb.PromptItem:
    return pb.PromptItem(prompt_id=f"guess-{i}", answer_style="episode", task="guess",
                         episode=EpisodeSpec(GUESS, {}, i, 3).to_proto())


def episode_rollout(source_prompt: str = "guess-0") -> pb.Rollout:
    r = pb.Rollout(prompt_id=source_prompt, sample_index=0, reward=1.0)
    r.turns.add(role=pb.ENV, text="Guess a number between 1 and 20.")
    r.turns.add(role=pb.AGENT, text="[10]", finish_reason=pb.STOP)
    return r


def test_a_plan_is_of_one_kind_and_a_mix_is_refused():
    assert plan_kind([one_shot(0), one_shot(1)]) is ONE_SHOT
    assert plan_kind([episode(0), episode(1)]) is EPISODES
    assert plan_kind([]) is ONE_SHOT
    assert plan_kind([one_shot(), episode()]) is ONE_SHOT    # not all episodes
    check_one_kind([episode(0), episode(1)])
    with pytest.raises(PromptError, match="mixes episodes and one-shot prompts"):
        check_one_kind([one_shot(), episode()])


def test_a_prompt_that_only_claims_to_be_an_episode_is_checked_as_one_and_refused():
    half = one_shot(answer_style="episode", text="")
    assert plan_kind([half]) is ONE_SHOT            # no environment instance
    assert claimed_kind(half) is EPISODES           # but its style says episode
    with pytest.raises(PromptError, match="an episode needs answer_style 'episode'"):
        claimed_kind(half).check_prompt(half)
    EPISODES.check_prompt(episode())                # a well-made episode passes


def test_each_kind_checks_its_own_fields():
    ONE_SHOT.check_prompt(one_shot())
    with pytest.raises(PromptError, match="has no text"):
        ONE_SHOT.check_prompt(one_shot(text="  "))
    with pytest.raises(PromptError, match="unknown answer_style"):
        ONE_SHOT.check_prompt(one_shot(answer_style="no-such-style"))
    unknown_env = episode()
    unknown_env.episode.env_id = "nowhere/NoGame-v0"
    with pytest.raises(PromptError, match="is not known here"):
        EPISODES.check_prompt(unknown_env)


def test_samples_and_rollouts_say_their_kind():
    generated = GeneratedSample(prompt_index=0, sample_index=0, prompt_ids=(1,), response_ids=(5, 6), text="5",
                                finish_reason="stop", logprob_sum=-1.0, token_count=2)
    played = EpisodeSample(prompt_index=0, sample_index=0, prompt_ids=(1,))
    assert sample_kind(generated) is ONE_SHOT and sample_kind(played) is EPISODES
    flat = pb.Rollout(prompt_id="p0", sample_index=0, response_text="\\boxed{5}")
    assert rollout_kind(flat) is ONE_SHOT and rollout_kind(episode_rollout()) is EPISODES
    assert rollouts_kind({"bob": [flat]}) is ONE_SHOT
    assert rollouts_kind({"bob": [flat], "carol": [episode_rollout()]}) is EPISODES
    assert rollouts_kind({}) is ONE_SHOT


def test_split_by_kind_keeps_order_within_a_kind_and_lists_every_kind():
    rollouts = [pb.Rollout(prompt_id="a"), episode_rollout("e1"), pb.Rollout(prompt_id="b"), episode_rollout("e2")]
    split = split_by_kind(rollouts, rollout_kind)
    assert list(split) == list(KINDS) == [ONE_SHOT, EPISODES]
    assert [r.prompt_id for r in split[ONE_SHOT]] == ["a", "b"]
    assert [r.prompt_id for r in split[EPISODES]] == ["e1", "e2"]
    assert split_by_kind([], rollout_kind) == {ONE_SHOT: [], EPISODES: []}


class RecordingGuard:
    def __init__(self):
        self.calls = []

    def screen_text(self, foreign, own_texts, styles, rewards, prompt_texts):
        self.calls.append(("screen_text", styles, prompt_texts))
        return {}

    def pass_episodes(self, foreign, rewards):
        self.calls.append(("pass_episodes",))
        return dict(foreign)


def test_one_shot_rows_go_through_the_text_screens_and_episodes_are_passed_on():
    prompts = {"p0": one_shot()}
    guard = RecordingGuard()
    ONE_SHOT.screen(guard, {"bob": []}, {}, prompts, {})
    assert guard.calls == [("screen_text", {"p0": "boxed"}, {"p0": "What is 2 + 3?"})]
    guard = RecordingGuard()
    foreign = {"bob": [episode_rollout()]}
    assert EPISODES.screen(guard, foreign, {}, {"guess-0": episode()}, {}) == foreign
    assert guard.calls == [("pass_episodes",)]


def test_own_one_shot_rows_are_cut_to_the_response_cap_and_carry_no_turn_mask():
    trainer = SimpleNamespace(agent="alice", max_response_tokens=2)
    sample = GeneratedSample(prompt_index=0, sample_index=1, prompt_ids=(1, 2), response_ids=(5, 6, 7), text="567",
                             finish_reason="stop", logprob_sum=-1.5, token_count=3, token_logprobs=(-0.25, -0.5, -0.75))
    rows = ONE_SHOT.own_rows(trainer, {"p0": (1, 2)}, {("p0", 1): sample}, {("alice", "p0", 1): 1.0})
    assert [(r.prompt_id, r.sample_index, r.response_ids, r.token_mask, r.is_own) for r in rows] == \
        [("p0", 1, (5, 6), None, True)]
    assert rows[0].truncated and rows[0].behaviour_logprob_sum == pytest.approx(-0.75)   # the kept prefix re-summed


def test_peer_episodes_need_the_learners_episode_template_and_none_need_nothing():
    trainer = SimpleNamespace(episode_template=None, max_episode_tokens=64)
    assert EPISODES.foreign_rows(trainer, {}, {"bob": []}, {}) == []
    with pytest.raises(ValueError, match="without an episode template"):
        EPISODES.foreign_rows(trainer, {}, {"bob": [episode_rollout()]}, {})
