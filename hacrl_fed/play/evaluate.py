"""Evaluation of a policy on verifiable problems: avg@k and the unbiased pass@k.

For every problem the policy generates k responses (greedy when k = 1 and temperature 0); the
same :class:`~hacrl_fed.reward.Verifier` as training scores them. With c correct out of n:

* ``avg@n`` = mean over problems of c / n (the paper's avg@1 with greedy decoding),
* ``pass@j`` = mean over problems of 1 − C(n − c, j) / C(n, j), the unbiased estimator of
  Chen et al. (2021), for j ≤ n.

Pure of model loading: :func:`hacrl_fed.worker.eval_model.run_eval` (the body of ``hacrl-fed eval``) loads the
model and builds the engine, then calls :func:`evaluate_items` and :func:`write_jsonl` from here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hacrl_fed.atomic import atomic_write_text
from hacrl_fed.data.problem import DataError

__all__ = ["DataError", "EvalItem", "check_data_head", "ProblemResult", "eval_model_config", "evaluate_items",
           "format_summary", "load_items", "pass_at_k", "saved_prompt", "summarize", "write_jsonl"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n − c, k) / C(n, k).

    Raises ``ValueError`` unless 0 ≤ c ≤ n and 1 ≤ k ≤ n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class EvalItem:
    """One problem to evaluate."""

    prompt_id: str
    problem: str
    reference: str
    answer_style: str = "boxed"


@dataclass
class ProblemResult:
    """Outcome of one problem: k responses and their verdicts."""

    prompt_id: str
    problem: str
    reference: str
    correct: int
    total: int
    responses: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)   # episodes: each sample's reward in [0, 1]; else empty


def evaluate_items(engine, tokenizer, verifier, items: Sequence[EvalItem], *, samples: int, sampling: Any,
                   seed: int, system_prompt: str, template: str = "auto", max_prompt_tokens: int | None = None,
                   chunk_prompts: int = 8, on_progress: Callable[[int], None] | None = None) -> list[ProblemResult]:
    """Generate ``samples`` responses per item with ``engine``, verify them, return one result per item.

    Items are processed ``chunk_prompts`` at a time (``on_progress(done)`` after each chunk); each
    chunk gets the seed ``seed + index of its first item`` so a result does not depend on
    ``chunk_prompts``' effect on RNG consumption across chunks. Raises ``ValueError`` for
    ``samples < 1`` or invalid sampling parameters.
    """
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.tokenization.views import encode_response_text

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    from hacrl_fed.rollout.engine import Sampling

    sampling = dataclasses.replace(Sampling.of(sampling), logprobs=False)   # scoring needs text only
    results: list[ProblemResult] = []
    for start in range(0, len(items), max(1, chunk_prompts)):
        chunk = items[start:start + max(1, chunk_prompts)]
        prompts = [render_prompt(tokenizer, it.problem, system_prompt=system_prompt, template=template,
                                 max_tokens=max_prompt_tokens, literal=lambda s: encode_response_text(tokenizer, s))
                   for it in chunk]
        generated = engine.generate(prompts, samples, sampling, seed + start)
        verdicts = verifier.verify([g.text for g in generated],
                                   [chunk[g.prompt_index].reference for g in generated],
                                   [chunk[g.prompt_index].answer_style for g in generated],
                                   [chunk[g.prompt_index].problem for g in generated])
        for i, it in enumerate(chunk):
            res = ProblemResult(it.prompt_id, it.problem, it.reference, 0, samples)
            for g, v in zip(generated, verdicts):
                if g.prompt_index != i:
                    continue
                res.correct += int(v.verdict == "correct")
                res.responses.append(g.text)
                res.verdicts.append(v.verdict)
                res.reasons.append(v.reason)
                res.finish_reasons.append(g.finish_reason)
                res.response_tokens.append(g.token_count)
            results.append(res)
        if on_progress is not None:
            on_progress(len(results))
    return results


def summarize(results: Sequence[ProblemResult]) -> dict[str, float]:
    """``avg@n``, ``pass@j`` (j = 1, 2, 4, … ≤ n, and n), ``problems`` (an int), ``verifier_error_frac``,
    ``length_frac`` (responses cut at max_new_tokens), ``response_tokens_mean``; for episodes also
    ``reward_mean``, the mean of every sample's reward (a partial reward counts how close a lost episode came,
    docs/multi-turn.md).

    All results must have the same ``total`` n; raises ``ValueError`` otherwise. Empty input ⇒ ``{}``.
    """
    if not results:
        return {}
    n = results[0].total
    if any(r.total != n for r in results):
        raise ValueError("all results must have the same number of samples")
    ks = sorted({j for j in (2 ** e for e in range(n.bit_length())) if j <= n} | {n})
    out = {f"avg@{n}": sum(r.correct / n for r in results) / len(results), "problems": len(results)}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, r.correct, k) for r in results) / len(results)
    verdicts = [v for r in results for v in r.verdicts]
    finishes = [f for r in results for f in r.finish_reasons]
    tokens = [t for r in results for t in r.response_tokens]
    if verdicts:
        out["verifier_error_frac"] = sum(v == "verifier_error" for v in verdicts) / len(verdicts)
    if finishes:
        out["length_frac"] = sum(f == "length" for f in finishes) / len(finishes)
    if tokens:
        out["response_tokens_mean"] = sum(tokens) / len(tokens)
    rewards = [x for r in results for x in r.rewards]
    if rewards:
        out["reward_mean"] = sum(rewards) / len(rewards)
    return out


def format_summary(summary: dict[str, float], *, model: str, data: str, temperature: float,
                   max_new_tokens: int, out: str | None = None) -> str:
    """The summary of :func:`summarize` (+ ``elapsed_s``) as the few lines ``hacrl-fed eval`` prints.

    >>> print(format_summary({"avg@2": 0.5, "pass@1": 0.5, "pass@2": 0.75, "problems": 4.0,
    ...                       "verifier_error_frac": 0.125, "length_frac": 0.25, "response_tokens_mean": 40.0,
    ...                       "elapsed_s": 12.3}, model="m", data="d.jsonl", temperature=1.0, max_new_tokens=64))
    m on d.jsonl: 4 problems × 2 samples (temperature 1), 12 s
      avg@2             50.0 %  mean share of correct responses
      pass@1            50.0 %  a problem solved by 1 response (unbiased estimate)
      pass@2            75.0 %  a problem solved by at least one of 2 responses (unbiased estimate)
      truncated         25.0 %  of the responses hit --max-new-tokens 64 (mean length 40 tokens)
      verifier errors   12.5 %  of the responses could not be verified (timeout, unparseable answer): counted wrong
    """
    n = max((int(k.split("@")[1]) for k in summary if k.startswith("avg@")), default=1)
    sampling = "greedy" if temperature == 0 else f"temperature {temperature:g}"
    lines = [f"{model} on {data}: {summary.get('problems', 0):.0f} problems × {n} sample{'s' if n != 1 else ''} "
             f"({sampling}), {summary.get('elapsed_s', 0.0):.0f} s"]

    def row(label: str, value: float, note: str) -> None:
        lines.append(f"  {label:<16} {100 * value:5.1f} %  {note}")

    row(f"avg@{n}", summary.get(f"avg@{n}", 0.0), "mean share of correct responses")
    for k in sorted(int(key[5:]) for key in summary if key.startswith("pass@")):
        by = "1 response" if k == 1 else f"at least one of {k} responses"
        row(f"pass@{k}", summary[f"pass@{k}"], f"a problem solved by {by} (unbiased estimate)")
    if "length_frac" in summary:
        row("truncated", summary["length_frac"], f"of the responses hit --max-new-tokens {max_new_tokens} (mean length "
            f"{summary.get('response_tokens_mean', 0.0):.0f} tokens)")
    if "verifier_error_frac" in summary:
        row("verifier errors", summary["verifier_error_frac"], "of the responses could not be verified (timeout, "
            "unparseable answer): counted wrong")
    if out:
        lines.append(f"per-problem results: {out}")
    return "\n".join(lines)


def write_jsonl(path: str | Path, results: Sequence[ProblemResult]) -> Path:
    """Write one JSON object per problem to ``path`` atomically (tmp file + fsync + ``os.replace``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, "".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in results))
    return p


def check_data_head(data: str | Path, *, answer_style: str | None = None) -> None:
    """Parse the first rows of an evaluation data file with the loader :func:`load_items` uses (bounded: at most a
    few MB read). Raises :class:`DataError` naming the file and row."""
    from hacrl_fed.data.datasets import load_file_head

    load_file_head(data, answer_style=answer_style or "boxed")


def load_items(data: str, limit: int | None, answer_style: str | None) -> list[EvalItem]:
    """The first ``limit`` problems of ``data`` (all when None) as :class:`EvalItem`. Raises :class:`DataError`."""
    from hacrl_fed.data.datasets import load_file

    problems = load_file(data, answer_style=answer_style or "boxed")
    if limit is not None:
        problems = problems[:limit]
    return [EvalItem(p.id, p.problem, p.answer, p.answer_style) for p in problems]


def saved_prompt(model: str) -> tuple[Path, dict[str, Any]] | None:
    """``(file, record)`` when ``model`` is an exported model directory that says how it was prompted in training
    (:data:`hacrl_fed.data.prompts.PROMPT_FILE`: template, system prompt, stop strings), else ``None``; the
    defaults of ``hacrl-fed eval`` for such a model. Raises ``ValueError`` (one line) for an unreadable file."""
    from hacrl_fed.data.prompts import PROMPT_FILE, read_prompt_file

    rec = read_prompt_file(model)
    return None if rec is None else (Path(model).expanduser() / PROMPT_FILE, rec)


def eval_model_config(model: str, *, template: str | None = None, system_prompt: str | None = None,
                      stop: Sequence[str] | None = None, **fields: Any) -> tuple[Any, tuple[Path, dict[str, Any]] | None]:
    """The ``ModelConfig`` to evaluate ``model`` with, and its :func:`saved_prompt` (or None).

    An export is prompted as it was trained: its saved template (``plain`` or ``auto`` for a chat export), system
    prompt and stop strings, each unless given here (``stop`` entries that are empty are dropped: ``[""]`` means
    none). ``fields``: other ``ModelConfig`` fields (device, dtype, engine …). Raises ``ValueError`` for an
    unreadable prompt file, pydantic's ``ValidationError`` (a ``ValueError``) for bad fields."""
    from hacrl_fed.config import ModelConfig

    saved = saved_prompt(model)
    if saved is not None:
        rec = saved[1]
        template = template or ("plain" if rec["template"] == "plain" else "auto")
        system_prompt = rec["system_prompt"] if system_prompt is None else system_prompt
        stop = rec["stop_strings"] if stop is None else stop
    extra = {"system_prompt": system_prompt} if system_prompt is not None else {}
    cfg = ModelConfig(name_or_path=model, chat_template=template or "auto",
                      stop=None if stop is None else [s for s in stop if s], **extra, **fields)
    return cfg, saved
