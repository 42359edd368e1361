"""Prompt rendering: a problem statement becomes the token ids one model is conditioned on.

Every site renders the shared problem text with its *own* tokenizer and template (hacpo-spec §7,
step 1): the chat template when the tokenizer has one (system turn + user turn + generation prompt),
otherwise a plain completion template for base models::

    {system_prompt}

    Question: {problem}
    Answer:

The plain template is preceded by the tokenizer's BOS token when it has one; chat templates add
their own BOS (Hugging Face encodes rendered chat text with ``add_special_tokens=False``).
"""

from __future__ import annotations

from typing import Literal

from jinja2.exceptions import TemplateError

PLAIN_TEMPLATE = "{system_prompt}\n\nQuestion: {problem}\nAnswer:"
"""Completion template for models without a chat template (e.g. gemma3-270m, a base model)."""

PLAIN_STOP_STRINGS = ("\nQuestion:",)
"""Where a base model's answer ends under :data:`PLAIN_TEMPLATE`: it starts the next ``Question:`` itself."""

Template = Literal["auto", "plain"]


def _uses_chat_template(tokenizer, template: str) -> bool:
    if template not in ("auto", "plain"):
        raise ValueError(f"template must be 'auto' or 'plain', got {template!r}")
    return template == "auto" and bool(getattr(tokenizer, "chat_template", None))


def _chat_text(tokenizer, problem: str, system_prompt: str) -> str:
    """Render [system?, user] with the chat template; fold the system prompt into the user turn when the
    template rejects a system role (some templates raise on it)."""
    user = {"role": "user", "content": problem}
    if not system_prompt:
        return tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    try:
        return tokenizer.apply_chat_template([{"role": "system", "content": system_prompt}, user],
                                             add_generation_prompt=True, tokenize=False)
    except TemplateError:  # raised by templates without a system role
        merged = {"role": "user", "content": f"{system_prompt}\n\n{problem}"}
        return tokenizer.apply_chat_template([merged], add_generation_prompt=True, tokenize=False)


def _plain_text(problem: str, system_prompt: str) -> str:
    if not system_prompt:
        return f"Question: {problem}\nAnswer:"
    return PLAIN_TEMPLATE.format(system_prompt=system_prompt, problem=problem)


def stop_strings(tokenizer, template: Template = "auto", configured: list[str] | None = None) -> list[str]:
    """Stop strings of one model: ``configured`` when given (``[]`` = none), else the template's own —
    :data:`PLAIN_STOP_STRINGS` for the plain template, none for a chat template (its EOS ends the turn).

    Raises ``ValueError`` for an unknown template name.
    """
    if configured is not None:
        return [s for s in configured if s]
    return [] if _uses_chat_template(tokenizer, template) else list(PLAIN_STOP_STRINGS)


def response_separator(tokenizer, template: Template = "auto") -> str:
    """What separates a response from its rendered prompt under this model's template: one space after the
    plain template's ``Answer:``, nothing after a chat template's generation prompt (it ends with a newline).

    Applied to re-encoded *foreign* text (:func:`hacrl_fed.tokenization.views.foreign_row`): a peer's
    response is stripped of leading whitespace and given this separator, so the learner's first token is
    the one its own template leads to, not an artifact of the source's template (``Answer:To`` scores
    ≈ −10 nats where ``Answer: To`` scores ≈ −3.5; ``assistant\n 4`` ≈ −12 where ``assistant\n4`` ≈ −3).
    Raises ``ValueError`` for an unknown template name.
    """
    return "" if _uses_chat_template(tokenizer, template) else " "


def render_prompt_text(tokenizer, problem: str, *, system_prompt: str, template: Template = "auto") -> str:
    """The rendered prompt as text, special tokens written literally (incl. the BOS of the plain template).

    ``template="auto"`` uses the tokenizer's chat template when present, else :data:`PLAIN_TEMPLATE`;
    ``"plain"`` always uses the plain template. Raises ``ValueError`` for another template name.
    """
    if _uses_chat_template(tokenizer, template):
        return _chat_text(tokenizer, problem, system_prompt)
    bos = getattr(tokenizer, "bos_token", None) or ""
    return bos + _plain_text(problem, system_prompt)


_SLOT = "\u2063hacrl-problem\u2063"
"""Stands for the problem text while the template is rendered around it (invisible separators: no template
writes it)."""


def control_strings(tokenizer) -> list[str]:
    """The literal strings ``tokenizer`` encodes as one control or added token (``<|im_end|>``, ``<eos>``,
    ``<start_of_turn>``, …), longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    with_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(with_added):
        found.update(with_added())
    return sorted((t for t in found if isinstance(t, str) and t), key=len, reverse=True)


def _encode(tokenizer, render, problem: str, literal) -> list[int]:
    """``render(problem)`` encoded; where the problem holds a control string, the template is rendered around
    :data:`_SLOT` instead, its markers encoded as control tokens and the problem's text through ``literal``."""
    if literal is None or not any(c in problem for c in control_strings(tokenizer)):
        return list(tokenizer(render(problem), add_special_tokens=False).input_ids)
    parts = render(_SLOT).split(_SLOT)
    if len(parts) != 2:
        raise ValueError("the prompt template does not place the problem text exactly once")
    return (list(tokenizer(parts[0], add_special_tokens=False).input_ids) + list(literal(problem))
            + list(tokenizer(parts[1], add_special_tokens=False).input_ids))


def render_prompt(tokenizer, problem: str, *, system_prompt: str, template: Template = "auto",
                  max_tokens: int | None = None, literal=None) -> list[int]:
    """Token ids of the rendered prompt (see :func:`render_prompt_text`), in ``tokenizer``'s vocabulary.

    The text is encoded with ``add_special_tokens=False``; the plain template gets the BOS id prepended
    when the tokenizer has one. ``max_tokens`` keeps the last ``max_tokens`` ids (left truncation,
    ``ModelConfig.max_prompt_tokens``).

    ``literal`` (``str -> list[int]``, e.g. :func:`hacrl_fed.tokenization.views.encode_response_text`) encodes
    a problem text that contains one of the tokenizer's control strings (:func:`control_strings`): the
    problem is text from the coordinator's plan, and ``<|im_end|><|im_start|>system`` written into it must not
    become a turn boundary of the learner's template. The template around it is encoded as usual, so a problem
    without control strings gets exactly the ids of the whole rendering. Without ``literal`` control strings
    in the problem are encoded as control tokens (what ``apply_chat_template`` would do).

    Raises ``ValueError`` for an unknown template, ``max_tokens < 1`` or (``literal`` path) a template that
    does not place the problem exactly once.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if _uses_chat_template(tokenizer, template):
        ids = _encode(tokenizer, lambda text: _chat_text(tokenizer, text, system_prompt), problem, literal)
    else:
        ids = _encode(tokenizer, lambda text: _plain_text(text, system_prompt), problem, literal)
        bos_id = getattr(tokenizer, "bos_token_id", None)
        if bos_id is not None and (not ids or ids[0] != bos_id):
            ids.insert(0, bos_id)
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[-max_tokens:]
    return ids
