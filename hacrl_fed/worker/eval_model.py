"""Evaluation of a saved model on a problem file: the body of ``hacrl-fed eval``.

Loads the model (:func:`~hacrl_fed.worker.models.load_model`), builds the engine its config names
(:func:`~hacrl_fed.worker.engines.build_engine`), scores avg@k / pass@k with the training verifier
(:func:`hacrl_fed.play.evaluate.evaluate_items`), shows a progress bar and writes one JSON line per problem
(atomically).
"""

from __future__ import annotations

from typing import Any

from hacrl_fed.data.problem import DataError
from hacrl_fed.play.evaluate import evaluate_items, load_items, summarize, write_jsonl

__all__ = ["eval_engine", "run_eval"]


def eval_engine(lm, model_cfg, *, max_new_tokens: int, max_batch_sequences: int, work_dir: str, seed: int):
    """The rollout engine ``model_cfg.engine`` names for evaluating the loaded ``lm``: the template's stop strings,
    room for the longest prompt plus ``max_new_tokens``."""
    from hacrl_fed.data.prompts import stop_strings
    from hacrl_fed.worker.engines import build_engine

    return build_engine(lm, model_cfg, stop_strings=stop_strings(lm.tokenizer, model_cfg.chat_template, model_cfg.stop),
                        max_batch_sequences=max_batch_sequences, work_dir=work_dir, seed=seed,
                        max_model_len=model_cfg.max_prompt_tokens + max_new_tokens)


def run_eval(model_cfg, data: str, *, samples: int = 1, out: str | None = None, sampling: Any,
             limit: int | None = None, seed: int = 0, answer_style: str | None = None,
             verifier_cfg=None, max_batch_sequences: int = 32, show_progress: bool = True) -> dict[str, float]:
    """Evaluate ``model_cfg`` on the problems in ``data`` (JSONL/parquet; fields id, problem, answer).

    Generates with the engine ``model_cfg.engine`` names (:func:`~hacrl_fed.worker.engines.build_engine`).
    Returns the summary (see :func:`summarize`) plus ``elapsed_s`` and ``engine`` (the engine that generated);
    writes per-problem JSONL to ``out`` when given. Raises :class:`~hacrl_fed.data.problem.DataError` (a
    ``ValueError``: bad data, before the model loads), ``ModelLoadError``, ``ValueError`` (bad options), ``OSError``, or
    ``VLLMUnavailableError`` (before the model loads) for the vllm engine without vllm.
    """
    import tempfile

    from hacrl_fed.worker.engines import require_engine
    from hacrl_fed.worker.models import load_model

    items = load_items(data, limit, answer_style)
    if not items:
        raise DataError(f"{data}: no problems to evaluate")
    require_engine(model_cfg.engine)                     # before the model loads
    lm = load_model(model_cfg)
    with tempfile.TemporaryDirectory(prefix="hacrl-fed-eval-") as work_dir:
        engine = eval_engine(lm, model_cfg, max_new_tokens=sampling.max_new_tokens,
                             max_batch_sequences=max_batch_sequences, work_dir=work_dir, seed=seed)
        return _run_items(engine, lm, model_cfg, items, samples=samples, out=out, sampling=sampling, seed=seed,
                          verifier_cfg=verifier_cfg, max_batch_sequences=max_batch_sequences,
                          show_progress=show_progress)


def _run_items(engine, lm, model_cfg, items, *, samples, out, sampling, seed, verifier_cfg, max_batch_sequences,
               show_progress) -> dict[str, float]:
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hacrl_fed.config import VerifierConfig
    from hacrl_fed.reward import Verifier

    chunk = max(1, max_batch_sequences // samples)
    t0 = time.perf_counter()
    columns = (TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Verifier.from_config(verifier_cfg or VerifierConfig()) as verifier, \
            Progress(*columns, console=Console(stderr=True), disable=not show_progress, transient=False) as progress:
        task = progress.add_task("eval", total=len(items))
        results = evaluate_items(engine, lm.tokenizer, verifier, items, samples=samples, sampling=sampling, seed=seed,
                                 system_prompt=model_cfg.system_prompt, template=model_cfg.chat_template,
                                 max_prompt_tokens=model_cfg.max_prompt_tokens, chunk_prompts=chunk,
                                 on_progress=lambda done: progress.update(task, completed=done))
    summary = summarize(results) | {"elapsed_s": time.perf_counter() - t0,
                                    "engine": getattr(engine, "name", model_cfg.engine)}
    if out:
        write_jsonl(out, results)
    return summary
