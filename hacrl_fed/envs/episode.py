"""The episode rule, replays and the check of a trajectory against its replay (docs/multi-turn.md).

The rule: an episode starts with the environment's first observation; each agent message gets the
environment's answer; the episode ends when the environment says done (reward: its reward clipped to [0, 1])
or after ``max_turns`` agent messages without that (reward 0). Nothing follows the end.

:class:`Episode` runs the rule live (a generating site), :func:`replay` re-runs it from the agent's messages
(any peer), and :func:`check_trajectory` decides whether a trajectory — (role, text) turns — is exactly what
the environment produces for its agent turns, naming the first turn that is not. All three are deterministic:
the same spec and messages give the same observations and reward, in any process
(:class:`~hacrl_fed.envs.isolation.IsolatedEnv`).

A replay runs the environment's code on the agent's text in the calling process and thread; replays of
untrusted trajectories belong in a killable process (:class:`hacrl_fed.reward.pool.KillablePool`), like every
answer check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hacrl_fed.envs.base import EnvStep, EpisodeSpec
from hacrl_fed.envs.registry import make_env

__all__ = ["AGENT", "ENV", "Episode", "Replay", "TrajectoryCheck", "check_trajectory", "replay", "turns_from_proto"]

ENV = "env"
AGENT = "agent"


def clip_reward(reward: float) -> float:
    """``reward`` clipped to [0, 1]; NaN → 0."""
    return 0.0 if math.isnan(reward) else min(max(float(reward), 0.0), 1.0)


class Episode:
    """One episode of ``spec`` under the rule, step by step.

    After construction :attr:`observations` holds the first observation. :meth:`step` adds the answer to
    each agent message. Raises :class:`ValueError` for a spec :func:`~hacrl_fed.envs.registry.make_env` refuses.
    """

    def __init__(self, spec: EpisodeSpec) -> None:
        self.spec = spec
        self._env = make_env(spec)
        self.observations: list[str] = [self._env.reset()]
        self.agent_turns = 0
        self.done = False
        self.reward = 0.0

    @property
    def over(self) -> bool:
        """The episode has ended: the environment said done, or ``max_turns`` agent messages were taken."""
        return self.done or self.agent_turns >= self.spec.max_turns

    def step(self, message: str) -> EnvStep:
        """The environment's answer to ``message`` (reward clipped to [0, 1]; 0 unless done). Raises
        :class:`ValueError` when the episode is already over."""
        if self.over:
            raise ValueError(f"agent message {self.agent_turns} comes after the episode ended "
                             f"({self._end_reason()})")
        out = self._env.step(message)
        self.agent_turns += 1
        self.observations.append(out.observation)
        if out.done:
            self.done, self.reward = True, clip_reward(out.reward)
        return EnvStep(out.observation, out.done, self.reward)

    def _end_reason(self) -> str:
        if self.done:
            return f"the environment said done after agent message {self.agent_turns - 1}"
        return f"max_turns = {self.spec.max_turns} agent messages taken"


@dataclass(frozen=True)
class Replay:
    """An episode re-run from the agent's messages.

    Attributes:
        observations: the first observation, then the answer to each agent message (``1 + agent_turns``).
        done: the environment said done (at the last agent message).
        reward: the episode's reward in [0, 1]: the environment's when done, else 0.
        agent_turns: agent messages taken.
    """

    observations: list[str]
    done: bool
    reward: float
    agent_turns: int


def replay(spec: EpisodeSpec, agent_messages: Sequence[str]) -> Replay:
    """Re-run ``spec`` with ``agent_messages``.

    Raises :class:`ValueError` for a spec the registry refuses or an agent message after the episode ended
    (after done, or beyond ``spec.max_turns``).
    """
    episode = Episode(spec)
    for message in agent_messages:
        episode.step(message)
    return Replay(list(episode.observations), episode.done, episode.reward, episode.agent_turns)


@dataclass(frozen=True)
class TrajectoryCheck:
    """The verdict on one trajectory: ``ok`` with the replay's reward, or not ok (reward 0) with the reason,
    which names the first turn (its index) that disagrees with the replay."""

    ok: bool
    reward: float
    reason: str


def _refuse(index: int | str, why: str) -> TrajectoryCheck:
    where = f"turn {index}" if isinstance(index, int) else index
    return TrajectoryCheck(False, 0.0, f"{where}: {why}")


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_trajectory(spec: EpisodeSpec, turns: Sequence[tuple[str, str]]) -> TrajectoryCheck:
    """Check ``turns`` — ``(role, text)`` pairs, role ``"env"`` or ``"agent"`` — against a replay of ``spec``.

    Accepted exactly when: roles alternate, starting with ``env``; every ``env`` turn equals the replay's
    observation at that point, character for character; the episode ends at the last agent turn (the
    environment said done there, or it is the ``max_turns``-th), so there is no agent turn after the end; the
    last turn is that agent turn or the environment's answer to it. The reward is then the replay's. A
    trajectory that stops before the end (the site ran out of its token budget, ``model.max_episode_tokens``)
    is accepted as a forfeit with reward 0. Never raises on a malformed trajectory or an environment that fails
    (``ok`` False, reason given); at most ``2 · max_turns + 1`` turns are looked at.
    """
    if len(turns) > 2 * spec.max_turns + 1:
        return _refuse(2 * spec.max_turns + 1, f"beyond the longest episode ({2 * spec.max_turns + 1} turns for "
                                               f"max_turns = {spec.max_turns})")
    for i, turn in enumerate(turns):
        if not (isinstance(turn, tuple | list) and len(turn) == 2 and isinstance(turn[1], str)):
            return _refuse(i, "not a (role, text) pair of strings")
        expected = ENV if i % 2 == 0 else AGENT
        if turn[0] != expected:
            return _refuse(i, f"role {turn[0]!r:.20}, expected {expected!r} (turns alternate, starting with env)")
    if not turns:
        return _refuse(0, "missing: a trajectory starts with the environment's first observation")
    try:
        episode = Episode(spec)
    except Exception as err:  # noqa: BLE001 - a spec the registry refuses, an environment that fails to start
        return _refuse("spec", f"{type(err).__name__}: {err}")
    for i, (role, text) in enumerate(turns):
        if role == ENV:
            observed = episode.observations[i // 2]
            if text != observed:
                return _refuse(i, f"env observation differs from the replay's at character "
                                  f"{_first_difference(text, observed)}")
            continue
        if episode.over:
            return _refuse(i, f"agent turn after the episode ended ({episode._end_reason()})")
        try:
            episode.step(text)
        except Exception as err:  # noqa: BLE001 - the environment failed on this message
            return _refuse(i, f"the environment failed on this message: {type(err).__name__}: {err}")
    if not episode.over:   # the site ended it early (its token budget): a forfeit, reward 0
        return TrajectoryCheck(True, 0.0, f"ok: ended by the site after {episode.agent_turns} agent turns, not done")
    return TrajectoryCheck(True, episode.reward, "ok")


def turns_from_proto(turns: Iterable[Any]) -> list[tuple[str, str]]:
    """``hacrl_fed.v1.Turn`` messages → ``(role, text)`` pairs (``ENV`` → ``"env"``, ``AGENT`` → ``"agent"``,
    anything else → ``"unspecified"``, which :func:`check_trajectory` refuses)."""
    from hacrl_fed.v1 import rollout_pb2

    names = {rollout_pb2.ENV: ENV, rollout_pb2.AGENT: AGENT}
    return [(names.get(t.role, "unspecified"), t.text) for t in turns]
