"""Text-level helpers around re-tokenization: what a site publishes, and how far re-encoding drifts.

The publisher turns its generated ids into shared text with :func:`clean_response_text` (terminal EOS
popped, remaining special tokens stripped, hacpo-spec §7 [O] / §12); the finish reason travels on the wire
instead of the EOS. Learners re-encode that text (:func:`hacrl_fed.tokenization.views.foreign_row`), so
the token count changes: :func:`drift_stats` summarises the learner/source ratio L_k / L_j per source
agent (ARCHITECTURE §8, "re-tokenization drift").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from .views import TrainingRow


def _eos_ids(tokenizer, eos_ids: Collection[int] | None) -> set[int]:
    if eos_ids is not None:
        return {int(t) for t in eos_ids}
    return set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}


def decode_text(tokenizer, ids: Sequence[int]) -> str:
    """The project's one text decoding of response ids: special tokens stripped, spaces left as decoded."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def split_generated(ids: Sequence[int], eos_ids: Collection[int], max_new_tokens: int) -> tuple[list[int], str]:
    """Exact response of one generated row: the ids up to and including the first EOS (finish reason ``stop``),
    else the first ``max_new_tokens`` ids (``length``). Anything after the EOS is padding and is dropped;
    pad-id tokens *before* it are kept (pad may be an ordinary id inside a response).
    """
    eos = {int(t) for t in eos_ids}
    for i, tok in enumerate(ids):
        if int(tok) in eos:
            return [int(t) for t in ids[: i + 1]], "stop"
    return [int(t) for t in ids[:max_new_tokens]], "length"


def cut_at_stop_strings(tokenizer, ids: Sequence[int], finish: str, stop_strings: Sequence[str],
                        eos_id: int) -> tuple[list[int], str]:
    """Cut a generated response before the first stop string in its text (vLLM's ``stop``, lm-eval's ``until``).

    Args:
        tokenizer: the generator's tokenizer.
        ids: the exact response ids from :func:`split_generated` (terminal EOS included iff ``finish == "stop"``).
        finish: ``"stop"`` or ``"length"``.
        stop_strings: strings that end a response; the string itself is not part of the response.
        eos_id: the EOS id appended to a response cut here.

    Returns ``(ids, finish)``: unchanged when no stop string occurs in the decoded text
    (:func:`decode_text`, as :func:`clean_response_text` decodes it); otherwise the longest token prefix whose text is a prefix of
    the text before the stop string, plus ``eos_id``, with finish reason ``"stop"`` — a stop-string stop
    becomes an EOS stop, so the learner is trained to end its answer there (the project's EOS convention).
    A token that straddles the stop string's first character is dropped with it.
    """
    ids = [int(t) for t in ids]
    body = ids[:-1] if finish == "stop" and ids else ids
    text = decode_text(tokenizer, body)
    hits = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    if not hits:
        return ids, finish
    keep = text[: min(hits)]

    def prefix_text(j: int) -> str:
        return decode_text(tokenizer, body[:j])

    lo, hi = 0, len(body)  # largest j with len(prefix_text(j)) <= len(keep): decoded length grows with j
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(prefix_text(mid)) <= len(keep):
            lo = mid
        else:
            hi = mid - 1
    while lo > 0 and not keep.startswith(prefix_text(lo)):
        lo -= 1
    return body[:lo] + [int(eos_id)], "stop"


def clean_response_text(tokenizer, ids: Sequence[int], *, eos_ids: Collection[int] | None = None) -> str:
    """Shared text of a generated response: decode ``ids`` minus a terminal EOS with ``skip_special_tokens=True``.

    Args:
        tokenizer: the generator's (source) tokenizer.
        ids: the exact generated response ids (no trailing padding), EOS included if it stopped.
        eos_ids: ids that end a response; defaults to ``{tokenizer.eos_token_id}``.

    Returns the response text with special tokens (chat-turn markers, pad, …) stripped and spaces left as
    decoded (``clean_up_tokenization_spaces=False``).
    """
    ids = [int(t) for t in ids]
    if ids and ids[-1] in _eos_ids(tokenizer, eos_ids):
        ids = ids[:-1]
    return decode_text(tokenizer, ids)


def drift_stats(rows: Iterable[TrainingRow]) -> dict[str, float]:
    """Re-tokenization drift of foreign rows: L_k / L_j per source agent and overall.

    Keys: ``src/<agent>/token_ratio_mean|min|max``, ``src/<agent>/truncated_frac``, ``src/<agent>/rows`` and
    ``retok/token_ratio_mean``, ``retok/truncated_frac``, ``retok/rows``. Own rows and rows with L_j = 0 are
    skipped in the ratios (truncated rows are included, their L_k is the retained count). Empty input ⇒ ``{}``.
    """
    ratios: dict[str, list[float]] = defaultdict(list)
    truncated: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        if row.is_own:
            continue
        truncated[row.source_agent].append(row.truncated)
        if row.behaviour_token_count > 0:
            ratios[row.source_agent].append(row.learner_token_count / row.behaviour_token_count)
    out: dict[str, float] = {}
    for agent in sorted(truncated):
        r = ratios[agent]
        out[f"src/{agent}/rows"] = float(len(truncated[agent]))
        out[f"src/{agent}/truncated_frac"] = sum(truncated[agent]) / len(truncated[agent])
        out[f"src/{agent}/token_ratio_mean"] = sum(r) / len(r) if r else math.nan
        out[f"src/{agent}/token_ratio_min"] = min(r) if r else math.nan
        out[f"src/{agent}/token_ratio_max"] = max(r) if r else math.nan
    if truncated:
        every = [x for agent in truncated for x in ratios[agent]]
        flags = [x for agent in truncated for x in truncated[agent]]
        out["retok/rows"] = float(len(flags))
        out["retok/truncated_frac"] = sum(flags) / len(flags)
        out["retok/token_ratio_mean"] = sum(every) / len(every) if every else math.nan
    return out
