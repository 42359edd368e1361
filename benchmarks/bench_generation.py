"""Rollout-engine throughput: batched generation vs a per-sample ``generate`` loop (ARCHITECTURE §7).

Both sides run :class:`hacrl_fed.rollout.engine.HFRolloutEngine` on the same prompts with the same
sampling settings; the batched side generates all sequences in one left-padded ``generate`` call
(KV cache), the per-sample side calls ``generate`` once per sequence. Each side includes the
behaviour log-probs the worker needs (the engine's default pass). Prints one JSON line.

    python benchmarks/bench_generation.py --model smollm2-135m-instruct --prompts 16 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import time


def _problems(n: int) -> list[str]:
    ops = ["+", "-", "*"]
    return [f"What is {3 + i % 7} {ops[i % 3]} {2 + (5 * i) % 9}? Explain briefly." for i in range(n)]


def _run(engine, prompts, sampling, seed: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    samples = engine.generate(prompts, 1, sampling, seed)
    return time.perf_counter() - t0, sum(s.token_count for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
    from hacrl_fed.worker.models import load_model

    t_load = time.perf_counter()
    lm = load_model(ModelConfig(name_or_path=args.model, device=args.device))
    t_load = time.perf_counter() - t_load
    system = "Solve the problem. Put the final answer in \\boxed{}."
    prompts = [render_prompt(lm.tokenizer, q, system_prompt=system) for q in _problems(args.prompts)]
    sampling = Sampling(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    batched = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=args.prompts)
    single = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=1)
    _run(batched, prompts[:2], Sampling(temperature=args.temperature, max_new_tokens=4), args.seed)  # warm-up
    b_time, b_tokens = _run(batched, prompts, sampling, args.seed)
    s_time, s_tokens = _run(single, prompts, sampling, args.seed)
    b_rate, s_rate = b_tokens / b_time, s_tokens / s_time
    print(json.dumps({
        "model": args.model, "device": args.device, "threads": torch.get_num_threads(), "load_s": round(t_load, 1),
        "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "batched_tokens": b_tokens, "batched_s": round(b_time, 2), "batched_tokens_per_s": round(b_rate, 1),
        "per_sample_tokens": s_tokens, "per_sample_s": round(s_time, 2), "per_sample_tokens_per_s": round(s_rate, 1),
        "speedup": round(b_rate / s_rate, 2),
    }))


if __name__ == "__main__":
    main()
