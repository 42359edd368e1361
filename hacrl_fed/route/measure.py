"""What each deployed model does on each query: correct or not, response tokens, generation seconds.

A model is a local directory, hub id or alias (generated in this process with the rollout engine ``--engine``
names, ``hf`` unless told otherwise, prompted as an export says it was trained:
:func:`hacrl_fed.play.evaluate.saved_prompt`) or an OpenAI-compatible endpoint URL (``http(s)://…/v1``: one chat
completion per query, sequentially, each timed). Both are scored by the training verifier
(:class:`hacrl_fed.reward.Verifier`), greedy unless told otherwise.

Seconds are wall time of generation on this machine: per query for an endpoint; for a local model, each batch's
time shared among its queries in proportion to their response tokens (a batch generates them together).
Parameters are counted for a local model; an endpoint's come from ``--params`` (or are unknown: ``None``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hacrl_fed.data.problem import Problem
from hacrl_fed.route.options import check_base_url, check_known, pairs, read_api_key

__all__ = ["ModelSpec", "Outcomes", "measure_endpoint", "measure_local", "parse_model_specs"]

log = logging.getLogger("hacrl_fed.route")


@dataclass(frozen=True)
class ModelSpec:
    """One routed model: ``name`` (how tables and headers call it), ``target`` (directory / alias or endpoint URL),
    ``api_model`` (the model name sent to an endpoint), ``params`` (parameter count, when given)."""

    name: str
    target: str
    api_model: str | None = None
    params: float | None = None

    @property
    def is_endpoint(self) -> bool:
        return self.target.startswith(("http://", "https://"))


@dataclass
class Outcomes:
    """One model on Q queries, in query order: ``correct`` (share of correct samples), ``tokens`` (mean response
    tokens), ``seconds`` (generation seconds), ``finish`` (``stop`` / ``length`` of the first sample), ``params``
    (parameter count or None)."""

    model: str
    query_ids: list[str]
    correct: list[float]
    tokens: list[float]
    seconds: list[float]
    finish: list[str]
    params: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, rec: dict[str, Any]) -> Outcomes:
        """Rebuild from :meth:`to_json`; raises ``ValueError`` for a record whose lists disagree in length."""
        out = cls(**{k: rec[k] for k in ("model", "query_ids", "correct", "tokens", "seconds", "finish", "params")})
        n = len(out.query_ids)
        if any(len(getattr(out, k)) != n for k in ("correct", "tokens", "seconds", "finish")):
            raise ValueError(f"outcomes of {out.model!r}: lists of different lengths")
        return out


def _parse_params(text: str) -> float:
    """``135M`` / ``1.5B`` / ``270000000`` → float; raises ``ValueError``."""
    t = text.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(t[-1:], 1.0)
    value = float(t[:-1] if t[-1:] in "KMBT" else t)
    if not value > 0:
        raise ValueError(f"parameter count must be positive, got {text!r}")
    return value * scale


def parse_model_specs(models: Sequence[str], api_models: Sequence[str] = (), params: Sequence[str] = (),
                      api_key_envs: Sequence[str] = ()) -> tuple[list[ModelSpec], dict[str, str]]:
    """``NAME=DIR_OR_URL`` items (+ ``NAME=MODEL`` endpoint model names, ``NAME=135M`` parameter counts,
    ``NAME=VAR`` API-key variables) → ``(specs, {NAME: API key})``, the keys read from the environment now.

    Raises ``ValueError`` (one line) for a malformed item, a bad endpoint URL, a duplicate or unknown name, an
    unset key variable, or fewer than two models (the parsing of ``route serve``: :mod:`hacrl_fed.route.options`)."""
    targets = pairs(models, "--model", "DIR_OR_URL")
    if len(targets) < 2:
        raise ValueError(f"routing needs at least two --model NAME=DIR_OR_URL, got {len(targets)}")
    targets = {n: check_base_url(t) if t.startswith(("http://", "https://")) else t for n, t in targets.items()}
    api, counts = pairs(api_models, "--api-model", "MODEL"), pairs(params, "--params", "COUNT")
    keys = pairs(api_key_envs, "--api-key-env", "VAR")
    for option, given in (("--api-model", api), ("--params", counts), ("--api-key-env", keys)):
        check_known(option, given, targets)
    try:
        sizes = {n: _parse_params(v) for n, v in counts.items()}
    except ValueError as err:
        raise ValueError(f"--params: {err}") from None
    return ([ModelSpec(n, t, api.get(n), sizes.get(n)) for n, t in targets.items()],
            {n: read_api_key(n, var) for n, var in keys.items()})


def _verify(problems: Sequence[Problem], texts: Sequence[str], verifier) -> list[bool]:
    verdicts = verifier.verify(list(texts), [p.answer for p in problems], [p.answer_style for p in problems],
                               [p.problem for p in problems])
    return [v.verdict == "correct" for v in verdicts]


def measure_local(spec: ModelSpec, problems: Sequence[Problem], *, verifier, max_new_tokens: int,
                  system_prompt: str | None = None, batch_size: int = 8, device: str = "cpu", engine: str = "hf",
                  on_progress: Callable[[int], None] | None = None) -> Outcomes:
    """Greedy responses of a local model to ``problems``, verified and timed (module docstring).

    Raises ``ModelNotFoundError`` / ``ModelLoadError`` when the model cannot be loaded, ``ValueError`` for an
    unreadable ``hacrl_fed_prompt.json``."""
    import tempfile

    from hacrl_fed.play.evaluate import EvalItem, eval_model_config, evaluate_items
    from hacrl_fed.rollout.engine import Sampling
    from hacrl_fed.worker.eval_model import eval_engine
    from hacrl_fed.worker.models import load_model

    cfg, _ = eval_model_config(spec.target, system_prompt=system_prompt, device=device,   # as `hacrl-fed eval`
                               engine=engine)
    lm = load_model(cfg)
    params = spec.params or float(sum(p.numel() for p in lm.model.parameters()))
    sampling = Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    out = Outcomes(spec.name, [], [], [], [], [], params)
    with tempfile.TemporaryDirectory(prefix="hacrl-fed-route-") as work_dir:
        engine = eval_engine(lm, cfg, max_new_tokens=max_new_tokens, max_batch_sequences=batch_size,
                             work_dir=work_dir, seed=0)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start:start + batch_size]
            items = [EvalItem(p.id, p.problem, p.answer, p.answer_style) for p in chunk]
            t0 = time.perf_counter()
            results = evaluate_items(engine, lm.tokenizer, verifier, items, samples=1, sampling=sampling, seed=start,
                                     system_prompt=cfg.system_prompt, template=cfg.chat_template,
                                     max_prompt_tokens=cfg.max_prompt_tokens, chunk_prompts=batch_size)
            elapsed = time.perf_counter() - t0
            tokens = [sum(r.response_tokens) / max(len(r.response_tokens), 1) for r in results]
            total = sum(tokens) or 1.0
            for r, t in zip(results, tokens):
                out.query_ids.append(r.prompt_id)
                out.correct.append(r.correct / r.total)
                out.tokens.append(t)
                out.seconds.append(elapsed * t / total)
                out.finish.append(r.finish_reasons[0] if r.finish_reasons else "stop")
            if on_progress is not None:
                on_progress(len(out.query_ids))
    return out


def measure_endpoint(spec: ModelSpec, problems: Sequence[Problem], *, verifier, max_new_tokens: int,
                     system_prompt: str, timeout_s: float = 120.0, api_key: str | None = None,
                     on_progress: Callable[[int], None] | None = None) -> Outcomes:
    """One greedy chat completion per problem from an OpenAI-compatible endpoint, verified and timed.

    A request that fails (after the client's retries) counts as a wrong answer with 0 tokens and its elapsed
    seconds, and is logged with the cause; the measurement goes on. Tokens: the reply's ``usage`` when given,
    else 0."""
    from openai import DefaultHttpxClient, OpenAI, OpenAIError

    from hacrl_fed.rollout.redact import Redactor

    redactor = Redactor([api_key] if api_key else [])       # an endpoint may echo its key in an error body
    client = OpenAI(base_url=spec.target, api_key=api_key or "none", timeout=timeout_s, max_retries=1,
                    http_client=DefaultHttpxClient(follow_redirects=False))   # answers only from the URL given
    model = spec.api_model or spec.name
    out = Outcomes(spec.name, [], [], [], [], [], spec.params)
    texts: list[str] = []
    for i, p in enumerate(problems):
        t0 = time.perf_counter()
        try:
            reply = client.chat.completions.create(
                model=model, temperature=0.0, max_tokens=max_new_tokens,
                messages=[{"role": "system", "content": system_prompt}, {"role": "user", "content": p.problem}])
            choice = reply.choices[0]
            text = choice.message.content or ""
            tokens = float(reply.usage.completion_tokens) if reply.usage else 0.0
            finish = "length" if choice.finish_reason == "length" else "stop"
        except (OpenAIError, IndexError, AttributeError) as err:
            cause = " ".join(redactor.text(str(err)).split())[:200]
            log.warning("route: %s failed on %s: %s", spec.name, p.id, cause)
            text, tokens, finish = "", 0.0, "error"
        out.seconds.append(time.perf_counter() - t0)
        out.query_ids.append(p.id)
        out.tokens.append(tokens)
        out.finish.append(finish)
        texts.append(text)
        if on_progress is not None:
            on_progress(i + 1)
    out.correct = [float(c) for c in _verify(problems, texts, verifier)]
    return out
