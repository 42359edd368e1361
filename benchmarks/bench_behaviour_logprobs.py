"""Behaviour log-probs from the generation pass vs a teacher-forced pass, in float32 and under bf16 autocast.

For each precision the rollout engine samples B × G responses with ``behaviour_logprobs = "generation"``;
the same responses are then scored teacher-forced (the engine's ``score``) and as the trainer's first
forward sees them (right-padded micro-batches of :func:`hacrl_fed.update.loop.plan_microbatches`, the
update's own token budget). Reported, in nats: the per-token max / mean |Δ| between each pair, and the
largest |log s| of an own row's sequence ratio before the first update (mean per-token Δ against the
trainer's forward; GSPO clips at 3e-4). Also the CPU seconds of ``generate`` with each mode (same samples:
the difference is the teacher-forced forward). Writes ``<out>/<model>.json`` and prints it.

    python benchmarks/bench_behaviour_logprobs.py --model smollm2-135m-instruct --out benchmarks/results/behaviour-logprobs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PROBLEMS = ["What is 7 + 5?", "Compute 6 * 4.", "What is 15 - 8?", "What is 9 + 13?", "Compute 3 * 12.",
            "What is 40 - 17?", "What is 8 * 7?", "What is 25 + 36?"]


def _stats(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """Per-token max / mean |a − b| and the largest |mean_t(a − b)| of a row (= |log s| of the sequence ratio)."""
    diffs = [[x - y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
    flat = [abs(d) for row in diffs for d in row]
    return {"token_max_abs": max(flat), "token_mean_abs": sum(flat) / len(flat),
            "seq_log_ratio_max_abs": max(abs(sum(row) / len(row)) for row in diffs)}


def _trainer_view(model, tokenizer, samples, temperature: float, autocast_dtype, micro_batch_tokens: int):
    """Per-token log-probs of each sample as :func:`hacrl_fed.update.loop.hacpo_update` computes them."""
    import torch

    from hacrl_fed.update.logprobs import token_logprobs
    from hacrl_fed.update.loop import plan_microbatches
    from hacrl_fed.tokenization.views import collate, own_row

    rows = [own_row(prompt_id=str(s.prompt_index), sample_index=s.sample_index, agent="a", prompt_ids=s.prompt_ids,
                    response_ids=s.response_ids, reward=0.0, behaviour_logprob_sum=s.logprob_sum,
                    finish_reason=s.finish_reason, max_response_tokens=10**6) for s in samples]
    out: list[list[float] | None] = [None] * len(rows)
    for micro in plan_microbatches([len(r.prompt_ids) + len(r.response_ids) for r in rows], micro_batch_tokens):
        batch = collate([rows[i] for i in micro], tokenizer.pad_token_id)
        with torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                                             enabled=autocast_dtype is not None):
            lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=temperature,
                                score_mask=batch["response_mask"])
        for b, i in enumerate(micro):
            out[i] = lp[b][batch["response_mask"][b].bool()].tolist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/behaviour-logprobs")
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(PROBLEMS):
        parser.error(f"--prompts must be in 1..{len(PROBLEMS)}")

    import torch

    from hacrl_fed.update.optim_config import OptimConfig
    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
    from hacrl_fed.worker.models import load_model
    from model_cache import hf_dir

    torch.set_num_threads(args.threads)
    lm = load_model(ModelConfig(name_or_path=str(hf_dir(args.model))))
    system = "Solve the problem. Put the final answer in \\boxed{}."
    prompts = [render_prompt(lm.tokenizer, q, system_prompt=system) for q in PROBLEMS[:args.prompts]]
    sp = Sampling(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    budget = OptimConfig().micro_batch_tokens
    result: dict = {"model": args.model, "prompts": args.prompts, "samples": args.samples,
                    "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "threads": args.threads}
    for name, dtype in (("float32", None), ("bf16_autocast", torch.bfloat16)):
        gen = HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="generation", autocast_dtype=dtype)
        forced = HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="teacher_forced", autocast_dtype=dtype)
        t = time.process_time()
        a = gen.generate(prompts, args.samples, sp, args.seed)
        t_gen = time.process_time() - t
        t = time.process_time()
        b = forced.generate(prompts, args.samples, sp, args.seed)
        t_forced = time.process_time() - t
        assert [s.response_ids for s in a] == [s.response_ids for s in b], "both modes must sample the same tokens"
        trainer = _trainer_view(lm.model, lm.tokenizer, a, sp.logprob_temperature, dtype, budget)
        fp32 = _trainer_view(lm.model, lm.tokenizer, a, sp.logprob_temperature, None, budget)
        g, f = [list(s.token_logprobs) for s in a], [list(s.token_logprobs) for s in b]
        result[name] = {
            "tokens": sum(s.token_count for s in a),
            "generation_vs_teacher_forced": _stats(g, f),
            "generation_vs_trainer": _stats(g, trainer),
            "teacher_forced_vs_trainer": _stats(f, trainer),
            "trainer_vs_float32_trainer": _stats(trainer, fp32),
            "generate_cpu_s": {"generation": t_gen, "teacher_forced": t_forced},
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.model.replace('/', '--')}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
