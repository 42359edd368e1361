"""The ``ct2`` engine's weight refresh and log-probs: seconds per refresh (conversion of the training model + load)
and how far ctranslate2's own token log-probs lie from the training model's teacher-forced ones.

For each model × compute type: builds :class:`hacrl_fed.rollout.ct2_engine.CT2RolloutEngine` on the float32 model
(``benchmarks/model_cache.py``), refreshes it ``--refreshes`` times (``weights_updated()`` then ``refresh()``; the
weights do not change, the work does not depend on them), then generates ``--prompts`` greedy responses and as many
at T = 1 (full distribution) and compares, token by token, ctranslate2's log-prob of each generated token
(``GenerationStepResult.log_prob``, ``return_scores=True``) with the engine's behaviour log-prob (the training
model, teacher-forced, as every ``ct2`` rollout gets it): per token |Δ| (mean, max), per response |Σ Δ| and GSPO's
|log s| = |Σ Δ| / tokens (median, max) — what an own row's sequence ratio would be before any update were ctranslate2's
log-probs taken as the behaviour's. Greedy rows are also compared with float32 ctranslate2's (the same tokens as the
``hf`` engine). Prints one JSON line per model × compute type.

    python benchmarks/bench_ct2.py --model smollm2-135m-instruct gemma3-270m --compute-type int8 float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def _own_logprobs(engine, prompts, sampling, seed: int) -> tuple[list[list[int]], list[list[float]]]:
    """ctranslate2's tokens and its own log-prob of each, per prompt (one ``generate_batch`` of the loaded model)."""
    import ctranslate2

    from hacrl_fed.rollout.ct2_engine import seed_of

    ctranslate2.set_random_seed(seed_of(seed))
    generator = engine._generator if sampling.greedy else engine._seeded_generator(seed)
    own: list[list[float]] = [[] for _ in prompts]
    results = generator.generate_batch(
        [[engine._vocab[t] for t in p] for p in prompts], max_length=sampling.max_new_tokens,
        include_prompt_in_result=False, end_token=list(engine.eos_ids), return_end_token=True, return_scores=True,
        sampling_topk=1 if sampling.greedy else 0, sampling_temperature=1.0,
        callback=lambda step: own[step.batch_id].append(step.log_prob) and False)
    return [r.sequences_ids[0] for r in results], own


def _compare(engine, prompts, sampling, seed: int) -> dict:
    from hacrl_fed.tokenization.retokenize import split_generated

    tokens, own = _own_logprobs(engine, prompts, sampling, seed)
    responses = [split_generated(t, engine.eos_ids, sampling.max_new_tokens)[0] for t in tokens]
    forced = engine.score(prompts, responses, 1.0)
    deltas, sums, log_s = [], [], []
    for resp, mine, (_, _, theirs) in zip(responses, own, forced):
        d = [a - b for a, b in zip(mine[:len(resp)], theirs)]
        deltas.extend(abs(x) for x in d)
        sums.append(abs(sum(d)))
        log_s.append(abs(sum(d)) / len(d))          # GSPO's length-normalised sequence log-ratio of an own row
    return {"tokens": len(deltas), "abs_delta_mean": statistics.mean(deltas), "abs_delta_max": max(deltas),
            "abs_sum_delta_max": max(sums), "abs_sum_delta_median": statistics.median(sums),
            "abs_log_s_max": max(log_s), "abs_log_s_median": statistics.median(log_s), "responses": responses}


def _common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2-135m-instruct"])
    parser.add_argument("--compute-type", nargs="+", default=["int8", "float32"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--refreshes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import os

    import torch
    from model_cache import hf_dir

    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.rollout.ct2_engine import CT2RolloutEngine, CT2Settings
    from hacrl_fed.rollout.engine import Sampling
    from hacrl_fed.worker.models import load_model

    torch.set_num_threads(args.threads)
    for name in args.model:
        lm = load_model(ModelConfig(name_or_path=str(hf_dir(name))))
        prompts = [render_prompt(lm.tokenizer, f"What is {3 + i % 7} * {2 + (5 * i) % 9}? Explain briefly.",
                                 system_prompt="Solve the problem. Put the final answer in \\boxed{}.")
                   for i in range(args.prompts)]
        reference = None
        for compute_type in sorted(args.compute_type, key=lambda c: c != "float32"):   # float32 first
            with tempfile.TemporaryDirectory(prefix="bench-ct2-") as work:
                engine = CT2RolloutEngine(lm.model, lm.tokenizer, work_dir=work,
                                          settings=CT2Settings(compute_type, args.threads))
                for _ in range(args.refreshes):
                    engine.weights_updated()
                    engine.refresh()
                t0 = time.perf_counter()
                engine._seeded_generator(0)
                reload_s = time.perf_counter() - t0
                greedy = _compare(engine, prompts, Sampling(temperature=0, max_new_tokens=args.max_new_tokens), 0)
                sampled = _compare(engine, prompts, Sampling(temperature=1.0, max_new_tokens=args.max_new_tokens),
                                   args.seed)
            rows = greedy.pop("responses")
            sampled.pop("responses")
            if compute_type == "float32":
                reference = rows
            row = {"model": name, "compute_type": compute_type, "threads": args.threads,
                   "load_average_1m": round(os.getloadavg()[0], 2),
                   "refresh_s": [round(s, 2) for s in engine.refresh_seconds],
                   "seeded_generator_load_s": round(reload_s, 3),
                   "greedy": {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in greedy.items()},
                   "sampled_t1": {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in sampled.items()}}
            if reference is not None and compute_type != "float32":
                row["greedy_rows_equal_to_float32"] = sum(a == b for a, b in zip(rows, reference))
                row["greedy_common_prefix_tokens_with_float32"] = sum(map(_common_prefix, rows, reference))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
