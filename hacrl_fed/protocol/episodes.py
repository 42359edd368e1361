"""An episode as the verifier's text items (docs/multi-turn.md): answer style ``episode``.

The verifier's items are text (``response, reference, style, problem``) so that they run in its killable process
pool under a CPU-time limit like any answer check. An episode travels as two texts:

* the **reference**: the plan's environment instance (:func:`episode_reference`: ``EpisodeSpec`` as JSON);
* the **response**: the trajectory (:func:`trajectory_response`: ``[[role, text], …]``, role ``env`` or ``agent``).

:func:`hacrl_fed.reward.episode_check.check_episode` replays them. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hacrl_fed.v1.rollout_pb2 import AGENT, ENV, LENGTH

__all__ = ["EPISODE_STYLE", "REPLAY_MISMATCH", "episode_reference", "trajectory_response", "verifier_columns",
           "verifier_item", "zeroed_unverified"]

EPISODE_STYLE = "episode"
"""The answer style of an episode prompt (``PromptItem.answer_style``)."""
REPLAY_MISMATCH = "replay_mismatch"
"""Prefix of the verdict reason of a trajectory its replay does not reproduce."""
_ROLES = {ENV: "env", AGENT: "agent"}


def episode_reference(spec: Any) -> str:
    """The reference text of an episode: ``spec`` (a ``hacrl_fed.v1.EpisodeSpec``) as canonical JSON."""
    return json.dumps({"env_id": spec.env_id, "config_json": spec.config_json, "seed": int(spec.seed),
                       "max_turns": int(spec.max_turns)}, sort_keys=True, separators=(",", ":"))


def trajectory_response(turns: Sequence[Any]) -> str:
    """The response text of an episode: its turns (``hacrl_fed.v1.Turn``) as ``[[role, text], …]`` JSON; a turn
    of an unknown role is written as ``"?"`` (the replay refuses it)."""
    return json.dumps([[_ROLES.get(int(t.role), "?"), t.text] for t in turns], separators=(",", ":"),
                      ensure_ascii=False)


def zeroed_unverified(rollout: Any, truncated_zero: bool) -> bool:
    """The rollout gets reward 0 without being verified: a one-shot response cut at ``max_new_tokens`` when
    truncated responses are zeroed (``VerifierConfig.truncated_reward = "zero"``); an episode is always replayed
    (its last turn's cut says nothing of how the episode ended)."""
    return truncated_zero and rollout.finish_reason == LENGTH and not rollout.turns


def verifier_columns(prompts: Mapping[str, Any], rollouts: Sequence[Any]) -> list[list[str]]:
    """The verifier's four argument lists ``[responses, references, styles, problems]`` for ``rollouts``
    (:func:`verifier_item` of each, against ``prompts``: prompt id → ``PromptItem``); four empty lists for none."""
    items = [verifier_item(prompts[r.prompt_id], r) for r in rollouts]
    return [list(column) for column in zip(*items, strict=True)] if items else [[], [], [], []]


def verifier_item(prompt: Any, rollout: Any) -> tuple[str, str, str, str]:
    """``(response, reference, style, problem)`` of one rollout for the verifier: an episode prompt's (its
    ``episode`` set) as above with style ``episode``, else the response text, reference answer, answer style
    (``boxed`` when empty) and problem text."""
    if prompt.HasField("episode"):
        return trajectory_response(rollout.turns), episode_reference(prompt.episode), EPISODE_STYLE, ""
    return rollout.response_text, prompt.reference_answer, prompt.answer_style or "boxed", prompt.text
