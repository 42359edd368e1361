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


def render_prompt(tokenizer, problem: str, *, system_prompt: str, template: Template = "auto",
                  max_tokens: int | None = None) -> list[int]:
    """Token ids of the rendered prompt (see :func:`render_prompt_text`), in ``tokenizer``'s vocabulary.

    The text is encoded with ``add_special_tokens=False``; the plain template gets the BOS id prepended
    when the tokenizer has one. ``max_tokens`` keeps the last ``max_tokens`` ids (left truncation,
    ``ModelConfig.max_prompt_tokens``). Raises ``ValueError`` for an unknown template or ``max_tokens < 1``.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if _uses_chat_template(tokenizer, template):
        ids = list(tokenizer(_chat_text(tokenizer, problem, system_prompt), add_special_tokens=False).input_ids)
    else:
        ids = list(tokenizer(_plain_text(problem, system_prompt), add_special_tokens=False).input_ids)
        bos_id = getattr(tokenizer, "bos_token_id", None)
        if bos_id is not None and (not ids or ids[0] != bos_id):
            ids.insert(0, bos_id)
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[-max_tokens:]
    return ids
