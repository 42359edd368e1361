"""Playing episodes of multi-turn environments with the site's own model (docs/multi-turn.md).

:func:`play_episodes` runs every episode of a plan's episode prompts, G per prompt, turn by turn: each turn the
engine generates one message for every episode still running (one batched ``generate`` over their contexts), each
environment answers its message, and the context of an episode that goes on grows by the message's ids and the
glue (the template's end of turn, the observation as a user turn, the next generation prompt;
:class:`EpisodeRenderer`). The ids an episode's turn was conditioned on are exactly the ids its training row
holds. An episode ends when its environment says done (reward: the environment's), after ``max_turns`` agent
turns (reward 0), or when the next turn would not fit ``max_episode_tokens`` (reward 0, counted).

Pure of I/O besides the engine and the environments. :func:`episode_rollout` turns an episode into its wire
rollout (turns, behaviour sums, per-turn EOS log-probs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hacrl_fed.data.prompts import conversation_template, response_separator
from hacrl_fed.envs import EpisodeSpec, make_env
from hacrl_fed.rollout.engine import GeneratedSample
from hacrl_fed.tokenization.episodes import EpisodeTemplate, episode_template, own_episode_row
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.play.evaluate import ProblemResult

__all__ = ["EpisodeRenderer", "EpisodeSample", "episode_metrics", "episode_prompt_ids", "episode_rollout", "episode_specs",
           "episode_template_of", "evaluate_episodes", "own_episode_rows", "play_episodes", "turn_seed"]

_FINISH = {"stop": pb.STOP, "length": pb.LENGTH}


class EpisodeRenderer(Protocol):
    """One model's rendering of an episode (``hacrl_fed.tokenization.episodes``)."""

    def prompt_ids(self, observation: str) -> tuple[int, ...]:
        """The conversation up to the first generation prompt."""
        ...

    def glue_ids(self, observations: Sequence[str], next_observation: str, *, turn_stopped: bool) -> tuple[int, ...]:
        """The ids after an agent turn up to the next generation prompt, with ``next_observation`` as the next user
        turn (``observations``: the environment turns so far; the glue does not depend on the agent's text)."""
        ...


@dataclass
class EpisodeSample:
    """One played episode: its turns as the wire carries them and the ids of the site's own training row."""

    prompt_index: int
    sample_index: int
    prompt_ids: tuple[int, ...]
    """The first observation rendered up to the first generation prompt."""
    turns: list[tuple[str, str]] = field(default_factory=list)
    """``("env" | "agent", text)`` in order, the first observation first."""
    turn_samples: list[GeneratedSample] = field(default_factory=list)
    """Each agent turn as generated (ids with the EOS iff it stopped, per-token behaviour log-probs, text)."""
    glue: list[tuple[int, ...]] = field(default_factory=list)
    """The glue after each agent turn the episode went on from (one fewer than agent turns, or as many when the
    episode was cut by the context budget after an observation)."""
    done: bool = False
    reward: float = 0.0
    cut_by_context: bool = False

    @property
    def context(self) -> tuple[int, ...]:
        """The ids the next agent turn is conditioned on."""
        ids = list(self.prompt_ids)
        for i, s in enumerate(self.turn_samples):
            ids += s.response_ids
            if i < len(self.glue):
                ids += self.glue[i]
        return tuple(ids)

    @property
    def finish_reason(self) -> str:
        """The last agent turn's finish reason."""
        return self.turn_samples[-1].finish_reason if self.turn_samples else "length"

    @property
    def logprob_sum(self) -> float:
        return float(sum(s.logprob_sum for s in self.turn_samples))

    @property
    def token_count(self) -> int:
        return sum(s.token_count for s in self.turn_samples)

    @property
    def text(self) -> str:
        """What text screens and reward functions read of an episode: its agent turns, one per line."""
        return "\n".join(t for role, t in self.turns if role == "agent")


def turn_seed(seed: int, turn: int) -> int:
    """The generation seed of turn ``turn`` of a plan's episodes (63 bits of SHA-256 over ``seed|turn``)."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{turn}".encode()).digest()[:8], "big") >> 1


def play_episodes(engine: Any, renderer: EpisodeRenderer, make_env: Callable[[Any], Any], specs: Sequence[Any],
                  n: int, sampling: Any, seed: int, *, max_episode_tokens: int) -> list[EpisodeSample]:
    """``n`` episodes of every environment instance of ``specs`` (``hacrl_fed.envs.EpisodeSpec``), prompt-major.

    Args:
        engine: the site's rollout engine (``generate(prompts, 1, sampling, seed)``).
        renderer: the site's :class:`EpisodeRenderer`.
        make_env: ``hacrl_fed.envs.make_env``.
        sampling: per-turn sampling (``max_new_tokens`` per agent turn).
        seed: the plan's generation seed; turn t uses :func:`turn_seed` (seed, t).
        max_episode_tokens: an episode whose next turn could take it past this many ids after its first prompt
            (turns and glue so far + ``max_new_tokens``) ends there with reward 0 (``cut_by_context``);
            ``ModelConfig.max_episode_tokens``.

    Raises ``ValueError`` from an environment that refuses its instance.
    """
    episodes: list[tuple[EpisodeSample, Any, int]] = []
    rendered: dict[str, tuple[int, ...]] = {}   # first observation → its prompt ids (the n episodes of an instance)
    for pi, spec in enumerate(specs):
        for si in range(n):
            env = make_env(spec)
            first = env.reset()
            if first not in rendered:
                rendered[first] = tuple(renderer.prompt_ids(first))
            episodes.append((EpisodeSample(pi, si, rendered[first], turns=[("env", first)]), env, int(spec.max_turns)))
    budget = max_episode_tokens - int(sampling.max_new_tokens)
    for turn in range(max((m for _, _, m in episodes), default=0)):
        running, contexts = [], []
        for ep, env, max_turns in episodes:
            if ep.done or ep.cut_by_context or len(ep.turn_samples) >= max_turns:
                continue
            context = ep.context
            if len(context) - len(ep.prompt_ids) > budget:
                ep.cut_by_context = True
                continue
            running.append((ep, env, max_turns))
            contexts.append(context)
        if not running:
            break
        samples = engine.generate(contexts, 1, sampling, turn_seed(seed, turn))
        for (ep, env, max_turns), sample in zip(running, samples, strict=True):
            _advance(ep, env, max_turns, sample, renderer)
    return [ep for ep, _, _ in episodes]


def _advance(ep: EpisodeSample, env: Any, max_turns: int, sample: GeneratedSample,
             renderer: EpisodeRenderer) -> None:
    """One agent turn of ``ep``: record it, let the environment answer, and add the glue when the episode goes on."""
    ep.turn_samples.append(sample)
    ep.turns.append(("agent", sample.text))
    result = env.step(sample.text)
    if result.observation or not result.done:
        ep.turns.append(("env", result.observation))
    if result.done:
        ep.done, ep.reward = True, min(1.0, max(0.0, float(result.reward)))
        return
    if len(ep.turn_samples) >= max_turns:
        return
    seen = [text for role, text in ep.turns[:-1] if role == "env"]
    ep.glue.append(tuple(renderer.glue_ids(seen, result.observation, turn_stopped=sample.finish_reason == "stop")))


def episode_rollout(ep: EpisodeSample, prompt: pb.PromptItem, reward: float, verdict: int) -> pb.Rollout:
    """The wire rollout of one episode (docs/multi-turn.md): the plan's instance, every turn, the behaviour sum
    and count over the agent turns' tokens, per-turn finish reasons and EOS log-probs, and the site's ``reward``
    and ``verdict`` (``hacrl_fed.v1.Verdict``) of the episode."""
    r = pb.Rollout(prompt_id=prompt.prompt_id, sample_index=ep.sample_index, reward=reward, verdict=verdict,
                   behaviour_logprob_sum=ep.logprob_sum, behaviour_token_count=ep.token_count,
                   finish_reason=_FINISH[ep.finish_reason])
    r.episode.CopyFrom(prompt.episode)
    agent_turns = iter(ep.turn_samples)
    for role, text in ep.turns:
        if role == "env":
            r.turns.add(role=pb.ENV, text=text)
            continue
        s = next(agent_turns)
        t = r.turns.add(role=pb.AGENT, text=text, finish_reason=_FINISH[s.finish_reason])
        if s.eos_logprob is not None:
            t.behaviour_eos_logprob = s.eos_logprob
    return r


# ---------------------------------------------------------------------- the worker's glue


def episode_specs(prompts: Sequence[pb.PromptItem]) -> list[Any]:
    """The environment instances of episode prompts (``hacrl_fed.envs.EpisodeSpec``). Raises ``ValueError``."""
    return [EpisodeSpec.from_proto(p.episode) for p in prompts]


def episode_metrics(samples: Sequence[EpisodeSample]) -> dict[str, float]:
    """Generate metrics of a plan's episodes: ``episode/turns_mean`` (agent turns), ``episode/done_frac`` (ended by
    the environment), ``episode/context_cut_frac`` (ended by ``max_episode_tokens``)."""
    n = max(1, len(samples))
    return {"episode/turns_mean": sum(len(s.turn_samples) for s in samples) / n,
            "episode/done_frac": sum(s.done for s in samples) / n,
            "episode/context_cut_frac": sum(s.cut_by_context for s in samples) / n}


def episode_template_of(tokenizer, model_cfg) -> EpisodeTemplate:
    """The site's :class:`~hacrl_fed.tokenization.episodes.EpisodeTemplate`: its chat template (the plain
    template's ``Question:`` / ``Answer:`` turns for a base model), system prompt and response separator."""
    return episode_template(tokenizer, system_prompt=model_cfg.system_prompt,
                            chat_template=conversation_template(tokenizer, model_cfg.chat_template),
                            separator=response_separator(tokenizer, model_cfg.chat_template))


def episode_prompt_ids(template: EpisodeTemplate, prompts: Sequence[pb.PromptItem]) -> dict[str, tuple[int, ...]]:
    """Prompt id → the site's rendering of each episode's first observation (the environment made and reset)."""
    return {p.prompt_id: tuple(template.prompt_ids(make_env(spec).reset()))
            for p, spec in zip(prompts, episode_specs(prompts), strict=True)}


def own_episode_rows(samples: Mapping[tuple[str, int], EpisodeSample], rewards: Mapping[tuple[str, int], float],
                     agent: str, max_episode_tokens: int) -> list[Any]:
    """The learner's own training rows of its played episodes (``(prompt id, sample index)`` → sample)."""
    return [own_episode_row(prompt_id=pid, sample_index=idx, agent=agent, prompt_ids=ep.prompt_ids,
                            turn_ids=[s.response_ids for s in ep.turn_samples],
                            glue_ids=ep.glue[:len(ep.turn_samples) - 1],
                            turn_logprobs=[s.token_logprobs if len(s.token_logprobs) == s.token_count
                                           else s.logprob_sum for s in ep.turn_samples],
                            finish_reasons=[s.finish_reason for s in ep.turn_samples], reward=rewards[(pid, idx)],
                            max_episode_tokens=max_episode_tokens)
            for (pid, idx), ep in samples.items()]


def evaluate_episodes(engine: Any, template: EpisodeTemplate, prompts: Sequence[pb.PromptItem], *, samples: int,
                      sampling: Any, seed: int, max_episode_tokens: int) -> list[ProblemResult]:
    """Held-out evaluation of episode prompts: ``samples`` episodes each (greedy at temperature 0); an episode
    counts as correct at reward 1. One :class:`~hacrl_fed.play.evaluate.ProblemResult` per prompt (its
    responses: the agent turns; ``response_tokens``: agent tokens of the episode; ``rewards``: each episode's
    reward, by the episode rule of :mod:`hacrl_fed.envs`)."""
    played = play_episodes(engine, template, make_env, episode_specs(prompts), samples, sampling, seed,
                           max_episode_tokens=max_episode_tokens)
    out = [ProblemResult(p.prompt_id, "", "", 0, samples) for p in prompts]
    for ep in played:
        r = out[ep.prompt_index]
        r.correct += ep.reward >= 1.0
        r.responses.append(ep.text)
        r.verdicts.append("correct" if ep.reward >= 1.0 else "incorrect")
        r.reasons.append("done" if ep.done else "context" if ep.cut_by_context else "turns")
        r.finish_reasons.append(ep.finish_reason)
        r.response_tokens.append(ep.token_count)
        r.rewards.append(ep.reward)
    return out
