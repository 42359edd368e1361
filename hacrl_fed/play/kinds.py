"""One-shot prompts and multi-turn episodes as two kinds of row: the difference in one place (docs/multi-turn.md).

A plan is of one kind: every prompt a one-shot problem (text, reference answer, answer style) or every prompt an
environment instance (``PromptItem.episode``, answer style ``episode``). What differs between the two is a method
of the kind, :data:`ONE_SHOT` or :data:`EPISODES`:

=====================  ==========================================  ==========================================
                       one-shot                                    episode
=====================  ==========================================  ==========================================
``check_prompt``       text, a known answer style, a task label    an environment this site can make, no text
``render``             the chat template over the prompt's text    the environment's first observation
``generate``           one batched generation, then the verifier   the turn loop; the environment's reward
``add_rollout``        response text, behaviour sum, EOS log-prob  turns, per-turn EOS log-probs
``evaluate``           avg@k / pass@k with the verifier            one episode per sample, its reward
``example_text``       the prompt's text                           the first observation
``own_rows``           the generated ids, cut to the response cap  every turn and glue, the agent turns trained
``foreign_rows``       the peer's text re-tokenized                the peer's turns re-rendered in the template
``screen``             the text screens                            counted only: the replay is their check
=====================  ==========================================  ==========================================

The agent and the trainer pick the kind once — of a plan's prompts (:func:`plan_kind`), of a generated sample
(:func:`sample_kind`), of a peer's rollout (:func:`rollout_kind`) — and then call it; the question "is this an
episode?" is asked here only. :data:`KINDS` lists both in the order their rows enter a step (one-shot rows first).

``site`` arguments are the :class:`~hacrl_fed.worker.agent.AgentWorker` (its engine, tokenizer, verifier, config,
episode template and ``render_text``), ``trainer`` arguments the :class:`~hacrl_fed.worker.trainer.Trainer`; a refused
prompt raises :class:`PromptError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from hacrl_fed.envs import EpisodeSpec, env_ids, make_env
from hacrl_fed.play.episodes import (EpisodeSample, episode_metrics, episode_prompt_ids, episode_rollout,
                                     episode_specs, evaluate_episodes, own_episode_rows, play_episodes)
from hacrl_fed.play.evaluate import EvalItem, ProblemResult, evaluate_items
from hacrl_fed.protocol.episodes import EPISODE_STYLE
from hacrl_fed.reward.extract import is_answer_style
from hacrl_fed.tokenization.episodes import foreign_episode_row
from hacrl_fed.tokenization.views import TrainingRow, build_rows, own_row
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["EPISODES", "KINDS", "ONE_SHOT", "Episodes", "OneShot", "PromptError", "check_one_kind", "claimed_kind",
           "plan_kind", "rollout_kind", "rollouts_kind", "sample_kind", "split_by_kind"]

MAX_ID_CHARS = 256
"""Characters of a prompt id, run id or task label, at most."""
_FINISH = {"stop": pb.STOP, "length": pb.LENGTH}

T = TypeVar("T")


class PromptError(ValueError):
    """A request's prompt that its kind refuses (the worker answers it as an invalid request)."""


class OneShot:
    """A one-shot prompt: a problem statement answered in one response, scored by the site's verifier."""

    name = "one-shot"

    def __repr__(self) -> str:
        return "ONE_SHOT"

    # ------------------------------------------------------------------ the agent

    def check_prompt(self, p: pb.PromptItem) -> None:
        """Raises :class:`PromptError` for no text, an unknown answer style or a bad task label."""
        if not p.text.strip():
            raise PromptError(f"prompt {p.prompt_id!r} has no text")
        if p.answer_style and not is_answer_style(p.answer_style):
            raise PromptError(f"prompt {p.prompt_id!r}: unknown answer_style {p.answer_style[:80]!r}")
        if len(p.task) > MAX_ID_CHARS or not p.task.isprintable():
            raise PromptError(f"prompt {p.prompt_id!r}: task label must be printable and at most "
                                      f"{MAX_ID_CHARS} characters")

    def render(self, site: Any, prompts: Sequence[pb.PromptItem]) -> dict[str, tuple[int, ...]]:
        """Prompt id → the site's rendering of the prompt's text (its chat template and system prompt)."""
        return {p.prompt_id: site.render_text(p.text) for p in prompts}

    def generate(self, site: Any, plan: pb.RoundPlan, prompt_ids: Mapping[str, Sequence[int]], order: Sequence[str],
                 n: int, sampling: Any, seed: int) -> tuple[list, list[tuple[float, int]], dict[str, float], float]:
        """``(samples, (reward, verdict) per sample, metrics, generation end time)``: n samples per prompt in one
        batched generation, then the site's verifier."""
        samples = site.engine.generate([prompt_ids[i] for i in order], n, sampling, seed)
        t_gen = time.perf_counter()
        site.status.set("verifying", step=plan.step, rollouts=len(samples))
        verdicts, counts = site._verify(plan.prompts, samples)
        return samples, verdicts, counts, t_gen

    def add_rollout(self, batch: pb.RolloutBatch, sample: Any, prompts: Sequence[pb.PromptItem],
                    order: Sequence[str], reward: float, verdict: int) -> None:
        """Append the sample's wire rollout (response text, behaviour log-prob sum and count, EOS log-prob)."""
        r = batch.rollouts.add(prompt_id=order[sample.prompt_index], sample_index=sample.sample_index,
                               response_text=sample.text, reward=reward, verdict=verdict,
                               behaviour_logprob_sum=sample.logprob_sum, behaviour_token_count=sample.token_count,
                               finish_reason=_FINISH[sample.finish_reason])
        if sample.eos_logprob is not None:
            r.behaviour_eos_logprob = sample.eos_logprob

    def evaluate(self, site: Any, prompts: Sequence[pb.PromptItem], samples: int, sampling: Any,
                 seed: int) -> list[ProblemResult]:
        """``samples`` responses per prompt scored by the site's verifier (avg@k, pass@k)."""
        m = site.cfg.model
        items = [EvalItem(p.prompt_id, p.text, p.reference_answer, p.answer_style or "boxed") for p in prompts]
        return evaluate_items(site.engine, site.tokenizer, site.verifier, items, samples=samples, sampling=sampling,
                              seed=seed, system_prompt=m.system_prompt, template=m.chat_template,
                              max_prompt_tokens=m.max_prompt_tokens,
                              chunk_prompts=max(1, site.engine.max_batch_sequences // samples))

    def example_text(self, p: pb.PromptItem) -> str | None:
        """The prompt's text (an export's example prompt)."""
        return p.text

    # ------------------------------------------------------------------ the trainer

    def own_rows(self, trainer: Any, prompt_ids: Mapping[str, Sequence[int]], samples: Mapping[tuple[str, int], Any],
                 rewards: Mapping) -> list[TrainingRow]:
        """The learner's own rows: its generated ids, cut to ``max_response_tokens``."""
        return [own_row(prompt_id=pid, sample_index=idx, agent=trainer.agent, prompt_ids=prompt_ids[pid],
                        response_ids=s.response_ids, reward=rewards[(trainer.agent, pid, idx)],
                        behaviour_logprob_sum=s.logprob_sum, finish_reason=s.finish_reason,
                        max_response_tokens=trainer.max_response_tokens, behaviour_token_logprobs=s.token_logprobs)
                for (pid, idx), s in samples.items()]

    def foreign_rows(self, trainer: Any, prompt_ids: Mapping[str, Sequence[int]], foreign: Mapping[str, list],
                     rewards: Mapping) -> list[TrainingRow]:
        """Peers' responses re-tokenized against the learner's rendering of their prompts, sources in sorted order.
        Raises ``ValueError`` for a rollout of an unknown prompt id."""
        return build_rows(trainer.tokenizer, prompt_ids, [], foreign, trainer.max_response_tokens, rewards=rewards,
                          separator=trainer.response_separator)

    def screen(self, guard: Any, foreign: dict[str, list], own_texts: Mapping, prompts: Mapping[str, pb.PromptItem],
               rewards: dict) -> dict[str, list]:
        """The text screens (:meth:`~hacrl_fed.screens.SiteGuard.screen_text`) over the peers' responses."""
        return guard.screen_text(foreign, own_texts, {pid: p.answer_style for pid, p in prompts.items()}, rewards,
                                 {pid: p.text for pid, p in prompts.items()})


class Episodes:
    """A multi-turn episode: an environment instance played turn by turn, scored by the environment (replayed by
    every verifier)."""

    name = "episode"

    def __repr__(self) -> str:
        return "EPISODES"

    # ------------------------------------------------------------------ the agent

    def check_prompt(self, p: pb.PromptItem) -> None:
        """Style ``episode``, an environment instance this site can make (``hacrl_fed.envs.EpisodeSpec`` bounds, a
        registered environment), no text or reference answer. Raises :class:`PromptError`."""
        if not p.HasField("episode") or p.answer_style != EPISODE_STYLE or p.text or p.reference_answer:
            raise PromptError(f"prompt {p.prompt_id!r}: an episode needs answer_style {EPISODE_STYLE!r}, an "
                                      "episode and no text or reference answer")
        try:
            spec = EpisodeSpec.from_proto(p.episode)
        except ValueError as err:
            raise PromptError(f"prompt {p.prompt_id!r}: {err}") from None
        if spec.env_id not in env_ids():
            raise PromptError(f"prompt {p.prompt_id!r}: environment {spec.env_id[:80]!r} is not known here "
                                      f"(known: {', '.join(sorted(env_ids()))})")

    def render(self, site: Any, prompts: Sequence[pb.PromptItem]) -> dict[str, tuple[int, ...]]:
        """Prompt id → the site's rendering of each episode's first observation. Raises :class:`PromptError`
        for an environment that cannot be made."""
        try:
            return episode_prompt_ids(site.episode_template, prompts)
        except ValueError as err:
            raise PromptError(f"episode: {err}") from None

    def generate(self, site: Any, plan: pb.RoundPlan, prompt_ids: Mapping[str, Sequence[int]], order: Sequence[str],
                 n: int, sampling: Any, seed: int) -> tuple[list, list[tuple[float, int]], dict[str, float], float]:
        """As :meth:`OneShot.generate`: n episodes per prompt played to the end; the environment's reward is the
        verdict (correct at 1); metrics ``episode/*``."""
        samples = play_episodes(site.engine, site.episode_template, make_env, episode_specs(plan.prompts), n,
                                sampling, seed, max_episode_tokens=site.cfg.model.max_episode_tokens)
        t_gen = time.perf_counter()
        verdicts = [(s.reward, pb.CORRECT if s.reward >= 1.0 else pb.INCORRECT) for s in samples]
        return samples, verdicts, episode_metrics(samples), t_gen

    def add_rollout(self, batch: pb.RolloutBatch, sample: EpisodeSample, prompts: Sequence[pb.PromptItem],
                    order: Sequence[str], reward: float, verdict: int) -> None:
        """Append the episode's wire rollout (turns, behaviour sums, per-turn EOS log-probs)."""
        batch.rollouts.append(episode_rollout(sample, prompts[sample.prompt_index], reward, verdict))

    def evaluate(self, site: Any, prompts: Sequence[pb.PromptItem], samples: int, sampling: Any,
                 seed: int) -> list[ProblemResult]:
        """One episode per sample, won or not; its reward counts."""
        return evaluate_episodes(site.engine, site.episode_template, prompts, samples=samples, sampling=sampling,
                                 seed=seed, max_episode_tokens=site.cfg.model.max_episode_tokens)

    def example_text(self, p: pb.PromptItem) -> str | None:
        """The episode's first observation (its environment made and reset); ``None`` when it cannot be made."""
        try:
            return make_env(EpisodeSpec.from_proto(p.episode)).reset()
        except ValueError:
            return None

    # ------------------------------------------------------------------ the trainer

    def own_rows(self, trainer: Any, prompt_ids: Mapping[str, Sequence[int]], samples: Mapping[tuple[str, int], Any],
                 rewards: Mapping) -> list[TrainingRow]:
        """The learner's own episodes: every turn and the glue between them, the agent turns trained, capped at
        ``max_episode_tokens``."""
        return own_episode_rows(samples, {k: rewards[(trainer.agent, *k)] for k in samples}, trainer.agent,
                                trainer.max_episode_tokens)

    def foreign_rows(self, trainer: Any, prompt_ids: Mapping[str, Sequence[int]], foreign: Mapping[str, list],
                     rewards: Mapping) -> list[TrainingRow]:
        """Peers' episodes re-rendered in the learner's template, sources in sorted order. Raises ``ValueError`` when
        there are some and the trainer has no episode template."""
        todo = [(a, r) for a in sorted(foreign) for r in foreign[a]]
        if not todo:
            return []
        if trainer.episode_template is None:
            raise ValueError("peer episodes reached a learner without an episode template")
        template = trainer.episode_template()
        return [foreign_episode_row(template, r, a, trainer.max_episode_tokens,
                                    reward=rewards.get((a, r.prompt_id, r.sample_index))) for a, r in todo]

    def screen(self, guard: Any, foreign: dict[str, list], own_texts: Mapping, prompts: Mapping[str, pb.PromptItem],
               rewards: dict) -> dict[str, list]:
        """Counted and quarantine-checked only (:meth:`~hacrl_fed.screens.SiteGuard.pass_episodes`): the text
        screens read one-shot responses; an episode's check is its replay."""
        return guard.pass_episodes(foreign, rewards)


ONE_SHOT = OneShot()
EPISODES = Episodes()
KINDS: tuple[OneShot | Episodes, ...] = (ONE_SHOT, EPISODES)
"""Both kinds, in the order their rows enter a step."""

Kind = OneShot | Episodes


def plan_kind(prompts: Sequence[pb.PromptItem]) -> Kind:
    """The kind of a plan's prompts: :data:`EPISODES` when there are prompts and every one is an environment
    instance, else :data:`ONE_SHOT`."""
    return EPISODES if prompts and all(p.HasField("episode") for p in prompts) else ONE_SHOT


def check_one_kind(prompts: Sequence[pb.PromptItem]) -> None:
    """Raises :class:`PromptError` for a request whose prompts mix episodes and one-shot prompts."""
    if len({p.HasField("episode") for p in prompts}) > 1:
        raise PromptError("a request mixes episodes and one-shot prompts")


def claimed_kind(p: pb.PromptItem) -> Kind:
    """The kind one prompt claims to be, by either of its fields (an environment instance or the ``episode``
    answer style), so that :meth:`Episodes.check_prompt` refuses a half-made episode."""
    return EPISODES if p.HasField("episode") or p.answer_style == EPISODE_STYLE else ONE_SHOT


def sample_kind(sample: Any) -> Kind:
    """The kind of a sample the site generated (an :class:`~hacrl_fed.play.episodes.EpisodeSample` or one
    generation)."""
    return EPISODES if isinstance(sample, EpisodeSample) else ONE_SHOT


def rollout_kind(rollout: pb.Rollout) -> Kind:
    """The kind of a peer's rollout: an episode carries its turns."""
    return EPISODES if rollout.turns else ONE_SHOT


def rollouts_kind(foreign: Mapping[str, Iterable[pb.Rollout]]) -> Kind:
    """The kind whose screens a step's peer rollouts go through: :data:`EPISODES` when any of them is an episode
    (a step's rollouts are of one kind: the plan's)."""
    return EPISODES if any(rollout_kind(r) is EPISODES for rs in foreign.values() for r in rs) else ONE_SHOT


def split_by_kind(items: Iterable[T], kind_of: Callable[[T], Kind]) -> dict[Kind, list[T]]:
    """``items`` grouped by kind, every kind present (an empty list for none), order kept within a kind."""
    out: dict[Kind, list[T]] = {k: [] for k in KINDS}
    for item in items:
        out[kind_of(item)].append(item)
    return out
