"""Verifying an episode by replay (docs/multi-turn.md): answer style ``episode``.

An episode reaches the verifier as two texts (:mod:`hacrl_fed.protocol.episodes`): the environment instance as
the reference and the trajectory as the response. :func:`check_episode` re-creates the environment, replays the
agent's messages and compares every environment turn with the replay's (``hacrl_fed.envs.check_trajectory``). The
verdict is ``correct`` for reward 1, ``incorrect`` otherwise with the replay's reward (an environment may give a
fraction), and ``incorrect`` with reason ``replay_mismatch: …`` and reward 0 for a trajectory the replay does not
reproduce: the coordinator refuses such a batch as a whole (``Reason.REPLAY_MISMATCH``). Unreadable texts are a
``verifier_error``. Runs in the verifier's process pool, under its CPU-time limit.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from hacrl_fed.protocol.episodes import REPLAY_MISMATCH
from hacrl_fed.reward.verdict import Verdict

__all__ = ["MAX_TRAJECTORY_CHARS", "check_episode"]

MAX_TRAJECTORY_CHARS = 1 << 20
"""A trajectory or instance text longer than this is not parsed (the batch size bound keeps honest ones far
below)."""


def _parse(response: str, reference: str) -> tuple[Any, list[tuple[str, str]]] | str:
    """(EpisodeSpec, turns) from the two texts, or why they cannot be read."""
    from hacrl_fed.envs import EpisodeSpec

    if len(response) > MAX_TRAJECTORY_CHARS or len(reference) > MAX_TRAJECTORY_CHARS:
        return "episode text too long"
    try:
        ref, turns = json.loads(reference), json.loads(response)
        spec = EpisodeSpec.from_proto(SimpleNamespace(**{k: ref[k] for k in ("env_id", "config_json", "seed",
                                                                            "max_turns")}))
    except (ValueError, TypeError, KeyError) as err:
        return f"unreadable episode: {type(err).__name__}: {str(err)[:200]}"
    if not (isinstance(turns, list) and all(isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t)
                                            for t in turns)):
        return "unreadable trajectory: expected [[role, text], ...]"
    return spec, [(role, text) for role, text in turns]


def check_episode(response: str, reference: str) -> Verdict:
    """Replay the trajectory ``response`` in the environment instance ``reference`` (module docstring)."""
    from hacrl_fed.envs import check_trajectory

    parsed = _parse(response, reference)
    if isinstance(parsed, str):
        return Verdict.error(parsed)
    spec, turns = parsed
    try:
        result = check_trajectory(spec, turns)
    except ValueError as err:   # an environment that refuses its configuration
        return Verdict.error(f"environment: {str(err)[:200]}")
    if not result.ok:
        return Verdict.incorrect(f"{REPLAY_MISMATCH}: {result.reason}"[:300])
    reward = min(1.0, max(0.0, float(result.reward)))
    return Verdict("correct" if reward >= 1.0 else "incorrect", reward, "episode_replayed")
