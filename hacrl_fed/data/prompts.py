"""Prompt rendering: a problem statement becomes the token ids one model is conditioned on.

Every site renders the shared problem text with its *own* tokenizer and template (hacpo-spec §7,
step 1): the chat template when the tokenizer has one (system turn + user turn + generation prompt),
otherwise a plain completion template for base models::

    {system_prompt}

    Question: {problem}
    Answer:

The plain template is preceded by the tokenizer's BOS token when it has one; chat templates add
their own BOS (Hugging Face encodes rendered chat text with ``add_special_tokens=False``).

An exported model carries how it was prompted (:func:`prompt_record`, written by
:func:`hacrl_fed.checkpoints.store.export_hf` as :data:`PROMPT_FILE`): the template kind, the system prompt,
the stop strings and an example. A model trained under the plain template is exported with
:data:`PLAIN_CHAT_TEMPLATE` as its tokenizer's chat template, so ``apply_chat_template([system, user],
add_generation_prompt=True)`` renders exactly the plain prompt; hacrl-fed recognises that template by its
marker and keeps treating the model as a plain-template one (its stop string, its response separator).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from jinja2.exceptions import TemplateError

from hacrl_fed.tokenization.views import control_strings

PLAIN_TEMPLATE = "{system_prompt}\n\nQuestion: {problem}\nAnswer:"
"""Completion template for models without a chat template (e.g. gemma3-270m, a base model)."""

PLAIN_STOP_STRINGS = ("\nQuestion:",)
"""Where a base model's answer ends under :data:`PLAIN_TEMPLATE`: it starts the next ``Question:`` itself."""

Template = Literal["auto", "plain"]

PLAIN_TEMPLATE_MARKER = "hacrl-fed plain template"
"""Marks :data:`PLAIN_CHAT_TEMPLATE`: a tokenizer whose chat template holds it is a plain-template model."""

PLAIN_CHAT_TEMPLATE = (
    "{#- " + PLAIN_TEMPLATE_MARKER + " (hacrl_fed.data.prompts): BOS, then '{system}\\n\\nQuestion: {problem}"
    "\\nAnswer:' -#}\n"
    "{%- if bos_token %}{{ bos_token }}{% endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' -%}\n"
    "{%- if message['content'] %}{{ message['content'] + '\\n\\n' }}{% endif -%}\n"
    "{%- elif message['role'] == 'user' -%}\n"
    "{{ 'Question: ' + message['content'] + '\\n' }}\n"
    "{%- elif message['role'] == 'assistant' -%}\n"
    "{{ 'Answer: ' + message['content'] + '\\n' }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}{{ 'Answer:' }}{% endif -%}\n"
)
"""A chat template that renders :data:`PLAIN_TEMPLATE` (system message, then ``Question: …`` per user turn,
``Answer: …`` per assistant turn, ``Answer:`` as the generation prompt), given to the export of a model
trained under the plain template so that ``apply_chat_template`` reproduces its training prompt."""

PROMPT_FILE = "hacrl_fed_prompt.json"
"""The file in an exported model directory that says how the model was prompted in training
(:func:`prompt_record`; docs/simulate.md, "Using an exported model")."""

PROMPT_FORMAT = "hacrl-fed-prompt/1"
"""The ``format`` of :data:`PROMPT_FILE`."""

EXAMPLE_PROBLEM = "Calculate 2 + 3."
"""The problem of the rendered example in :data:`PROMPT_FILE`."""


def is_plain_chat_template(tokenizer) -> bool:
    """The tokenizer's chat template is :data:`PLAIN_CHAT_TEMPLATE` (an export of a plain-template model)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and PLAIN_TEMPLATE_MARKER in template


def _uses_chat_template(tokenizer, template: str) -> bool:
    if template not in ("auto", "plain"):
        raise ValueError(f"template must be 'auto' or 'plain', got {template!r}")
    return (template == "auto" and bool(getattr(tokenizer, "chat_template", None))
            and not is_plain_chat_template(tokenizer))


def _chat_render(tokenizer, problem: str, system_prompt: str) -> tuple[list[dict[str, str]], str]:
    """``(messages, text)``: [system, user] rendered with the chat template and its generation prompt, or — for a
    template that rejects a system role (some raise on it) — one user turn with the system prompt folded in
    before the problem."""
    user = {"role": "user", "content": problem}
    messages = [{"role": "system", "content": system_prompt}, user] if system_prompt else [user]
    try:
        return messages, tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except TemplateError:  # raised by templates without a system role
        if not system_prompt:
            raise
        merged = [{"role": "user", "content": f"{system_prompt}\n\n{problem}"}]
        return merged, tokenizer.apply_chat_template(merged, add_generation_prompt=True, tokenize=False)


def _chat_text(tokenizer, problem: str, system_prompt: str) -> str:
    return _chat_render(tokenizer, problem, system_prompt)[1]


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


def conversation_template(tokenizer, template: Template = "auto") -> str:
    """The chat template a multi-turn episode is rendered with (docs/multi-turn.md): the tokenizer's own under a
    chat template, :data:`PLAIN_CHAT_TEMPLATE` (``Question:`` / ``Answer:`` turns) for a plain-template model —
    what :class:`hacrl_fed.tokenization.episodes.EpisodeTemplate` takes as ``chat_template``, with
    :func:`response_separator` as its ``separator``. Its first prompt is :func:`render_prompt`'s.
    Raises ``ValueError`` for an unknown template name."""
    return tokenizer.chat_template if _uses_chat_template(tokenizer, template) else PLAIN_CHAT_TEMPLATE


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
    a problem text that contains one of the tokenizer's control strings (:func:`hacrl_fed.tokenization.views.control_strings`): the
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


def prompt_record(tokenizer, *, system_prompt: str, template: Template = "auto", stop: list[str] | None = None,
                  eos_token_ids=(), example: str | None = None) -> dict[str, Any]:
    """How a model is prompted in training, as :data:`PROMPT_FILE` holds it (JSON-ready).

    Keys: ``format`` (:data:`PROMPT_FORMAT`); ``template`` (``"chat"``: the tokenizer's chat template;
    ``"plain"``: :data:`PLAIN_TEMPLATE` after the BOS, which the export's chat template renders too);
    ``system_prompt``; ``stop_strings`` (a response ends before the first of them; :func:`stop_strings`);
    ``eos_token_ids`` (every id that ends a response); ``response_separator`` (what a response's text follows
    the prompt with); ``plain_template`` (the format string, or null for ``chat``); ``messages`` (what
    ``apply_chat_template(messages, add_generation_prompt=True)`` takes to render the prompt of
    ``example`` (:data:`EXAMPLE_PROBLEM` when ``None``; a worker passes a prompt it played, for an episode its
    first observation): [system, user], or one user turn with the system prompt folded in when the template
    has no system role) and ``prompt`` (that rendered text, special tokens written out).
    Raises ``ValueError`` for an unknown template name.
    """
    problem = EXAMPLE_PROBLEM if example is None else example
    chat = _uses_chat_template(tokenizer, template)
    if chat:
        messages, text = _chat_render(tokenizer, problem, system_prompt)
    else:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
                   [{"role": "user", "content": problem}]
        text = render_prompt_text(tokenizer, problem, system_prompt=system_prompt, template="plain")
    return {
        "format": PROMPT_FORMAT,
        "template": "chat" if chat else "plain",
        "system_prompt": system_prompt,
        "stop_strings": stop_strings(tokenizer, template, stop),
        "eos_token_ids": [int(t) for t in eos_token_ids],
        "response_separator": response_separator(tokenizer, template),
        "plain_template": None if chat else PLAIN_TEMPLATE,
        "example": {"problem": problem, "messages": messages, "prompt": text},
    }


def read_prompt_file(model_dir: str | Path) -> dict[str, Any] | None:
    """The :data:`PROMPT_FILE` of an exported model directory, or ``None`` when ``model_dir`` is not a
    directory or has none. Raises ``ValueError`` (one line naming the file) for a file that is not a
    :data:`PROMPT_FORMAT` record with the keys ``hacrl-fed eval`` reads."""
    path = Path(model_dir).expanduser() / PROMPT_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file: {err}") from None
    if not isinstance(rec, dict) or rec.get("format") != PROMPT_FORMAT:
        raise ValueError(f"{path}: not a {PROMPT_FORMAT} record (format: "
                         f"{rec.get('format') if isinstance(rec, dict) else None!r})")
    stops = rec.get("stop_strings")
    if rec.get("template") not in ("chat", "plain") or not isinstance(rec.get("system_prompt"), str) or \
            not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise ValueError(f"{path}: needs template 'chat' or 'plain', a system_prompt string and a stop_strings list")
    return rec
