"""One multi-turn episode in a model's tokens (docs/multi-turn.md, "One episode in a model's tokens").

Every site renders an episode with its own chat template as the messages
``[system?, user(observation 0), assistant(message 1), user(observation 1), …]``; as one training row::

    prompt_ids | turn 1 | glue 1 | turn 2 | glue 2 | … | turn n
               trained  context  trained  context       trained      (TrainingRow.token_mask: 1 / 0)

* **prompt**: the conversation up to the first generation prompt — for the same tokenizer, system prompt and
  template exactly :func:`hacrl_fed.data.prompts.render_prompt` of observation 0 (an observation holding a
  control string is encoded as text, like ``render_prompt(literal=encode_response_text)``);
* **turn**: an own row keeps the generated ids, the EOS included iff the turn stopped; a peer's turn is its
  text encoded like a single-turn foreign response (:func:`~hacrl_fed.tokenization.views.encode_response_text`
  of the template's response separator + the text without leading whitespace) plus the learner's EOS when the
  turn stopped;
* **glue**: the template's text after an agent message up to and including the next generation prompt — its
  end of turn, the next observation as a user turn, the generation prompt. It is taken from the template as
  text, rendered with placeholder agent messages, so it never depends on the agent's text and is the same
  after a generated turn and after a peer's re-encoded one. A turn that stopped already holds its EOS: when the
  end of turn starts with that EOS (ChatML's ``<|im_end|>``) the glue starts after it; a turn cut at
  ``max_new_tokens`` has none and the glue keeps the whole end-of-turn marker (context, not trained). The glue
  text is encoded without adding special tokens (template markers become their ids) the way the tokenizer
  reads text that follows a special token, which is where it stands after a stopped turn (no SentencePiece
  dummy prefix before the ``\\n`` of a Llama-2-style tokenizer).

The generating site conditions each turn on exactly ``prompt + turn ids + glue …`` (:meth:`EpisodeTemplate.
prompt_ids`, :meth:`EpisodeTemplate.glue_ids`), so its own row is what it generated plus the glue
(:func:`own_episode_row`); a learner re-renders a peer's trajectory the same way (:func:`foreign_episode_row`).
A template that rewrites earlier turns when one is added (not prefix-stable) is refused (``ValueError``).

This package imports nothing of the project above it: the template is given as text. The caller resolves a
model's template kind with :func:`hacrl_fed.data.prompts.conversation_template` (the tokenizer's own chat
template, or :data:`~hacrl_fed.data.prompts.PLAIN_CHAT_TEMPLATE`'s ``Question:`` / ``Answer:`` turns for a
plain-template model) and :func:`hacrl_fed.data.prompts.response_separator`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence

from jinja2.exceptions import TemplateError

from .views import TrainingRow, _finish_reason, _has_logprob, control_strings, encode_response_text

__all__ = ["EpisodeTemplate", "episode_template", "foreign_episode_row", "own_episode_row", "trajectory"]

_AGENT = "\u2063hacrl-agent\u2063"
"""Stands for an agent message while the template is rendered (invisible separators: no template writes it)."""
_OBS = "\u2063hacrl-observation\u2063"
"""Stands for an observation that holds a control string (encoded literally, apart from the template)."""
_PROBE = ("Observation A.", "Observation B.", "Observation C.")
"""Observations of the prefix-stability check made when a template is built."""
_ROLES = {1: "env", 2: "agent"}  # hacrl_fed.v1.Role: ENV = 1, AGENT = 2


class EpisodeTemplate:
    """How one model renders an episode: its tokenizer, system prompt, chat template and response separator.

    Args:
        tokenizer: the model's tokenizer.
        system_prompt: the model's system prompt ("" = no system turn). A template without a system role gets it
            folded into the first user turn (``"{system}\\n\\n{observation 0}"``), as ``render_prompt`` does.
        chat_template: the template text; None = the tokenizer's own. A plain-template model renders with
            :data:`hacrl_fed.data.prompts.PLAIN_CHAT_TEMPLATE` (``conversation_template`` picks it).
        separator: the template's response separator (``response_separator``): a peer's agent text is stripped
            of leading whitespace and follows it.
        eos_id: the id a stopped turn ends with; defaults to ``tokenizer.eos_token_id``.

    Raises:
        ValueError: no chat template, or a template that is not prefix-stable (checked on a probe conversation
            here, and on every conversation :meth:`glue_ids` renders).
    """

    def __init__(self, tokenizer, *, system_prompt: str = "", chat_template: str | None = None, separator: str = "",
                 eos_id: int | None = None) -> None:
        template = getattr(tokenizer, "chat_template", None) if chat_template is None else chat_template
        if not isinstance(template, str) or not template:
            raise ValueError("an episode is rendered with a chat template: the tokenizer has none, pass "
                             "chat_template (hacrl_fed.data.prompts.conversation_template)")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.chat_template = template
        self.separator = separator
        eos = tokenizer.eos_token_id if eos_id is None else eos_id
        self.eos_id = None if eos is None else int(eos)
        self._control = control_strings(tokenizer)
        self._fold_system = False
        if system_prompt:
            try:
                self._render(self._messages(["x"], 0), True)
            except TemplateError:  # raised by templates without a system role
                self._fold_system = True
        self._eos_text, self._anchor = self._eos_anchor()
        for k in range(1, len(_PROBE)):
            self._glue_text(_PROBE[:k], _PROBE[k])

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _messages(self, observations: Sequence[str], agent_turns: int) -> list[dict[str, str]]:
        """``[system?, user(obs 0), assistant(placeholder), user(obs 1), …]`` with ``agent_turns`` agent messages
        (each after the observation it answers)."""
        out = []
        if self.system_prompt and not self._fold_system:
            out.append({"role": "system", "content": self.system_prompt})
        for i, obs in enumerate(observations):
            text = f"{self.system_prompt}\n\n{obs}" if i == 0 and self.system_prompt and self._fold_system else obs
            out.append({"role": "user", "content": text})
            if i < agent_turns:
                out.append({"role": "assistant", "content": _AGENT})
        return out

    def _has_control(self, text: str) -> bool:
        return any(c in text for c in self._control)

    def _eos_anchor(self) -> tuple[str | None, int | None]:
        """(the EOS token's text, its id) when the EOS is one token of its own text (a special token), else
        (None, None)."""
        if self.eos_id is None:
            return None, None
        text = self.tokenizer.convert_ids_to_tokens(self.eos_id)
        if not isinstance(text, str) or not text:
            return None, None
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return (text, self.eos_id) if ids == [self.eos_id] else (None, None)

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False).input_ids]

    def _encode_after_special(self, text: str) -> list[int]:
        """``text`` encoded as the tokenizer reads it right after a special token (the EOS), without adding any."""
        if not text:
            return []
        if self._anchor is not None:
            ids = self._encode(self._eos_text + text)
            if ids and ids[0] == self._anchor:
                return ids[1:]
        return self._encode(text)

    def _literal(self, text: str) -> list[int]:
        return encode_response_text(self.tokenizer, text)

    def _glue_text(self, observations: Sequence[str], next_observation: str) -> str:
        """Template text after the last agent message of a conversation with ``len(observations)`` observations
        and as many agent turns, up to and including the next generation prompt. Raises ``ValueError`` for a
        template that is not prefix-stable or does not write the agent message exactly once."""
        k = len(observations)
        if k < 1:
            raise ValueError("an agent turn answers at least the first observation")
        before = self._render(self._messages(observations, k - 1), True)
        after = self._render(self._messages([*observations, next_observation], k), True)
        closed = self._render(self._messages(observations, k), False)
        if not after.startswith(before) or not after.startswith(closed):
            raise ValueError("the chat template is not prefix-stable: adding an agent turn and the next observation "
                             f"rewrites the conversation before it (turn {k}); multi-turn episodes need a template "
                             "whose rendering of n + 1 messages starts with its rendering of n (docs/multi-turn.md)")
        tail = after[len(before):]
        if tail.count(_AGENT) != 1:
            raise ValueError("the chat template does not write the agent message exactly once after the generation "
                             "prompt")
        return tail.split(_AGENT, 1)[1]

    # ------------------------------------------------------------------ ids

    def prompt_ids(self, observation: str, *, max_tokens: int | None = None) -> tuple[int, ...]:
        """The episode's prompt: ``[system?, user(observation)]`` with the generation prompt — the single-turn
        ``render_prompt(tokenizer, observation, literal=encode_response_text)`` of the same template.
        ``max_tokens`` keeps the last ``max_tokens`` ids (``ModelConfig.max_prompt_tokens``). Raises
        ``ValueError`` for ``max_tokens < 1`` or a template that does not place the observation exactly once."""
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not self._has_control(observation):
            ids = self._encode(self._render(self._messages([observation], 0), True))
        else:
            parts = self._render(self._messages([_OBS], 0), True).split(_OBS)
            if len(parts) != 2:
                raise ValueError("the chat template does not place the observation exactly once")
            ids = self._encode(parts[0]) + self._literal(observation) + self._encode(parts[1])
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[-max_tokens:]
        return tuple(ids)

    def glue_ids(self, observations: Sequence[str], next_observation: str, *, turn_stopped: bool) -> tuple[int, ...]:
        """The ids after an agent turn up to and including the next generation prompt (context, not trained).

        Args:
            observations: the observations of the conversation so far (observation 0 …); the agent turn that
                just ended answers the last of them. Agent messages are stood in by a placeholder.
            next_observation: the environment's reply to that turn (its next user turn).
            turn_stopped: the turn ended with its EOS (already in the turn's ids): an end of turn that starts
                with the EOS text leaves it out. False (cut at ``max_new_tokens``): the whole end of turn.

        Raises ``ValueError`` for a template that is not prefix-stable on this conversation or that does not
        place the observation exactly once.
        """
        if not self._has_control(next_observation):
            return tuple(self._encode_after_special(self._strip_eos(
                self._glue_text(observations, next_observation), turn_stopped)))
        parts = self._strip_eos(self._glue_text(observations, _OBS), turn_stopped).split(_OBS)
        if len(parts) != 2:
            raise ValueError("the chat template does not place the observation exactly once")
        return tuple(self._encode_after_special(parts[0]) + self._literal(next_observation)
                     + self._encode_after_special(parts[1]))

    def _strip_eos(self, text: str, turn_stopped: bool) -> str:
        if turn_stopped and self._eos_text is not None and text.startswith(self._eos_text):
            return text[len(self._eos_text):]
        return text

    def agent_ids(self, text: str, stopped: bool) -> list[int]:
        """A peer's agent message in this model's tokens: the separator + the text without leading whitespace,
        encoded like a single-turn foreign response, + the EOS when the turn stopped. Raises ``ValueError`` for
        a stopped turn without an EOS id."""
        content = text.lstrip()
        ids = encode_response_text(self.tokenizer, self.separator + content if content else "")
        if stopped:
            if self.eos_id is None:
                raise ValueError("the learner tokenizer has no EOS token; pass eos_id")
            ids.append(self.eos_id)
        return ids


_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def episode_template(tokenizer, *, system_prompt: str = "", chat_template: str | None = None, separator: str = "",
                     eos_id: int | None = None) -> EpisodeTemplate:
    """:class:`EpisodeTemplate` of these arguments, built once per tokenizer and arguments (cached while the
    tokenizer lives)."""
    key = (system_prompt, chat_template, separator, eos_id)
    try:
        per_tokenizer = _TEMPLATES.setdefault(tokenizer, {})
    except TypeError:
        per_tokenizer = {}
    if key not in per_tokenizer:
        template = EpisodeTemplate(tokenizer, system_prompt=system_prompt, chat_template=chat_template,
                                   separator=separator, eos_id=eos_id)
        with contextlib.suppress(TypeError):
            per_tokenizer[key] = template
        return template
    return per_tokenizer[key]


# ---------------------------------------------------------------------- rows


def _assemble(turns: Sequence[Sequence[int]], glues: Sequence[Sequence[int]],
              stopped: Sequence[bool]) -> tuple[list[int], list[int], list[int]]:
    """(response ids, token mask, positions of the stopped turns' EOS) of turns joined by their glue."""
    ids: list[int] = []
    mask: list[int] = []
    eos: list[int] = []
    for k, turn in enumerate(turns):
        ids += [int(t) for t in turn]
        mask += [1] * len(turn)
        if stopped[k] and turn:
            eos.append(len(ids) - 1)
        if k < len(glues):
            ids += [int(t) for t in glues[k]]
            mask += [0] * len(glues[k])
    return ids, mask, eos


def own_episode_row(*, prompt_id: str, sample_index: int, agent: str, prompt_ids: Sequence[int],
                    turn_ids: Sequence[Sequence[int]], glue_ids: Sequence[Sequence[int]],
                    turn_logprobs: Sequence[Sequence[float] | float], finish_reasons: Sequence[str | int],
                    reward: float, max_episode_tokens: int) -> TrainingRow:
    """Row of an episode the learner played itself: exactly the ids it was conditioned on and generated.

    Args:
        prompt_ids: :meth:`EpisodeTemplate.prompt_ids` of observation 0 (what the first turn was generated from).
        turn_ids: every agent turn's generated ids, the EOS included iff the turn stopped (no padding).
        glue_ids: the :meth:`EpisodeTemplate.glue_ids` after each agent turn but the last (one fewer than turns).
        turn_logprobs: per turn, its per-token behaviour log-probs (one per id, same temperature) or their sum.
        finish_reasons: per turn, ``"stop"`` or ``"length"`` (or the wire's enum); the row's finish reason is
            the last turn's.
        max_episode_tokens: cap on the response (every turn and glue after the prompt). Own episodes are never
            cut: the generator ends an episode before it.

    Behaviour sum and L_j cover every agent token (each stopped turn's EOS included), the trained tokens of the
    row, so an own row's ratio compares the same tokens on both sides.

    Raises:
        ValueError: mismatched lengths, an empty turn, a bad finish reason, or a response longer than
            ``max_episode_tokens`` (or a cap < 1).
    """
    where = f"own episode {prompt_id}/{sample_index}"
    if max_episode_tokens < 1:
        raise ValueError(f"max_episode_tokens must be >= 1, got {max_episode_tokens}")
    if not turn_ids or len(glue_ids) != len(turn_ids) - 1 or len(turn_logprobs) != len(turn_ids) \
            or len(finish_reasons) != len(turn_ids):
        raise ValueError(f"{where}: needs >= 1 agent turn, one glue between consecutive turns and one log-prob "
                         f"entry and finish reason per turn; got {len(turn_ids)} turns, {len(glue_ids)} glues, "
                         f"{len(turn_logprobs)} log-prob entries, {len(finish_reasons)} finish reasons")
    reasons = [_finish_reason(r) for r in finish_reasons]
    total = 0.0
    for k, (turn, lp) in enumerate(zip(turn_ids, turn_logprobs, strict=True)):
        if not turn:
            raise ValueError(f"{where}: agent turn {k + 1} has no token")
        if isinstance(lp, int | float):
            total += float(lp)
            continue
        if len(lp) != len(turn):
            raise ValueError(f"{where}: agent turn {k + 1} has {len(turn)} ids but {len(lp)} behaviour log-probs")
        total += sum(float(x) for x in lp)
    ids, mask, eos = _assemble(turn_ids, glue_ids, [r == "stop" for r in reasons])
    if len(ids) > max_episode_tokens:
        raise ValueError(f"{where}: {len(ids)} tokens after the prompt exceed max_episode_tokens = "
                         f"{max_episode_tokens}; an episode is ended before its cap, never cut")
    trained = sum(mask)
    return TrainingRow(
        prompt_id=prompt_id, sample_index=int(sample_index), source_agent=agent, is_own=True,
        prompt_ids=tuple(int(t) for t in prompt_ids), response_ids=tuple(ids), reward=float(reward),
        behaviour_logprob_sum=total, behaviour_token_count=trained, learner_token_count=trained, truncated=False,
        finish_reason=reasons[-1], token_mask=tuple(mask), turn_eos=tuple(eos),
    )


def _role(value) -> str:
    role = value.lower() if isinstance(value, str) else _ROLES.get(int(value), "")
    if role not in ("env", "agent"):
        raise ValueError(f"turn role must be ENV or AGENT, got {value!r}")
    return role


def trajectory(turns: Sequence) -> tuple[list[str], list]:
    """``(observations, agent turns)`` of a trajectory's turns (``hacrl_fed.v1.Turn`` or objects with ``role``,
    ``text``): ENV, AGENT, ENV, AGENT, … — every agent turn but the last followed by the observation answering
    it, the last one optionally by the environment's final observation. Raises ``ValueError`` otherwise."""
    roles = [_role(t.role) for t in turns]
    if len(roles) < 2 or roles[0] != "env" or any(a == b for a, b in zip(roles, roles[1:])):
        raise ValueError(f"an episode's turns alternate ENV, AGENT, ENV, … starting with ENV and holding an AGENT "
                         f"turn, got {roles}")
    return [t.text for t in turns if _role(t.role) == "env"], [t for t in turns if _role(t.role) == "agent"]


def _turn_eos_logprob(turn) -> float | None:
    has = getattr(turn, "HasField", None)
    if has is not None:
        return float(turn.behaviour_eos_logprob) if has("behaviour_eos_logprob") else None
    value = getattr(turn, "behaviour_eos_logprob", None)
    return None if value is None else float(value)


def foreign_episode_row(template: EpisodeTemplate, rollout, source_agent: str, max_episode_tokens: int, *,
                        reward: float | None = None) -> TrainingRow:
    """Row for a peer's episode, re-rendered by the learner (``template``: its tokenizer, system prompt, chat
    template and separator).

    Args:
        template: the learner's :class:`EpisodeTemplate`.
        rollout: a ``hacrl_fed.v1.Rollout`` with ``turns`` (or any object with its fields: ``prompt_id``,
            ``sample_index``, ``reward``, ``behaviour_logprob_sum``, ``behaviour_token_count`` and turns of
            ``role``, ``text``, ``finish_reason``, ``behaviour_eos_logprob``), already validated.
        source_agent: the agent that played it.
        max_episode_tokens: the learner's cap on the response (turns and glue after the prompt); a longer
            re-rendering is cut there and marked ``truncated`` (the trainer leaves such rows out and counts them).
        reward: overrides ``rollout.reward`` (the coordinator's correction wins).

    The prompt is :meth:`EpisodeTemplate.prompt_ids` of observation 0; each agent turn is
    :meth:`EpisodeTemplate.agent_ids` (trained), each observation after one the glue (context); a final
    observation after the last agent turn is not part of the row. The source side of the cross ratio: the
    rollout's sum and count over every agent token; ``behaviour_eos_logprob`` the sum of the stopped turns' EOS
    log-probs when the source sent each of them (the ratio then leaves every turn's EOS out on both sides).

    Raises:
        ValueError: turns that are not a trajectory (:func:`trajectory`), a bad finish reason, a cap < 1, or a
            template that is not prefix-stable.
    """
    if max_episode_tokens < 1:
        raise ValueError(f"max_episode_tokens must be >= 1, got {max_episode_tokens}")
    observations, agent = trajectory(rollout.turns)
    reasons = [_finish_reason(t.finish_reason) for t in agent]
    stopped = [r == "stop" for r in reasons]
    turns = [template.agent_ids(t.text, s) for t, s in zip(agent, stopped, strict=True)]
    glues = [template.glue_ids(observations[:k + 1], observations[k + 1], turn_stopped=stopped[k])
             for k in range(len(agent) - 1)]
    ids, mask, eos = _assemble(turns, glues, stopped)
    truncated = len(ids) > max_episode_tokens
    if truncated:
        ids, mask, eos = ids[:max_episode_tokens], mask[:max_episode_tokens], [p for p in eos if p < max_episode_tokens]
    has_lp = _has_logprob(rollout)
    eos_lps = [_turn_eos_logprob(t) for t, s in zip(agent, stopped, strict=True) if s]
    eos_sum = float(sum(eos_lps)) if has_lp and eos_lps and all(x is not None for x in eos_lps) else None
    return TrainingRow(
        prompt_id=rollout.prompt_id, sample_index=int(rollout.sample_index), source_agent=source_agent,
        is_own=False, prompt_ids=template.prompt_ids(observations[0]), response_ids=tuple(ids),
        reward=float(rollout.reward if reward is None else reward),
        behaviour_logprob_sum=float(rollout.behaviour_logprob_sum) if has_lp else 0.0,
        behaviour_token_count=int(rollout.behaviour_token_count), learner_token_count=sum(mask),
        truncated=truncated, finish_reason=reasons[-1], behaviour_eos_logprob=eos_sum,
        content_bytes=sum(len(t.text.lstrip().encode("utf-8")) for t in agent), has_behaviour_logprob=has_lp,
        token_mask=tuple(mask), turn_eos=tuple(eos),
    )
