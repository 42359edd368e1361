"""Rollout-engine throughput: batched generation vs a per-sample ``generate`` loop (ARCHITECTURE §7), or two
engines side by side over a grid of shapes with a breakdown of where the time goes.

Default: :class:`hacrl_fed.rollout.engine.HFRolloutEngine` on the same prompts with the same sampling settings;
the batched side generates all sequences in one left-padded ``generate`` call (KV cache), the per-sample side
calls ``generate`` once per sequence. Each side includes the behaviour log-probs the worker needs (the engine's
default pass). Prints one JSON line.

    python benchmarks/bench_generation.py --model smollm2-135m-instruct --prompts 16 --max-new-tokens 48

``--engines A B`` compares two rollout engines (``hf``, ``loop``, ``ct2`` or any registered name, each built by its
factory through the registry, ``--engine-options`` as ``model.engine_options``) instead, for every model × sequences ×
new tokens × temperature of the grid (temperature 0 = greedy): runs alternate A, B, A, B … ``--reps`` times
(``--reps-big`` for cells of ≥ 4096 sequence-tokens) in one process on ``--threads`` threads; each cell prints a
JSON line with each engine's tokens/s (median), the ratio B / A of tokens/s within each pair (median, min, max)
and where each engine's time went (mean seconds per run): ``prefill`` (the prompt forward), ``decode`` (the
one-token forwards), ``logprobs`` (the ``hf`` engine's behaviour log-prob capture) and ``rest`` (sampling, EOS
and stop checks, cache bookkeeping, Python: the run's wall time minus the three). An engine generating with its own
copy of the weights (``ct2``, ``vllm``) has no observed prefill / decode (``null``, "–" in the table): its
training-model forwards are the teacher-forced behaviour log-probs (``logprobs``) and ``rest`` is its generation;
its weight refreshes (conversions, done in the warm-up) are listed as ``<engine>_refresh_s``. ``--markdown`` adds
the table. ``--no-logprobs`` generates as ``hacrl-fed eval`` does, without behaviour log-probs (an engine with its
own weights then runs no training-model forward at all).

    python benchmarks/bench_generation.py --engines hf loop --model smollm2-135m-instruct gemma3-270m \\
        --prompts 16 64 --max-new-tokens 32 256 --temperature 0 0.7 --markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _problems(n: int) -> list[str]:
    ops = ["+", "-", "*"]
    return [f"What is {3 + i % 7} {ops[i % 3]} {2 + (5 * i) % 9}? Explain briefly." for i in range(n)]


def _run(engine, prompts, sampling, seed: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    samples = engine.generate(prompts, 1, sampling, seed)
    return time.perf_counter() - t0, sum(s.token_count for s in samples)


class _Timers:
    """Wall seconds spent in the model's forward (prompt vs one-token calls) and in the ``hf`` engine's behaviour
    log-prob capture, by wrapping them (perf_counter around each call)."""

    def __init__(self, model) -> None:
        from hacrl_fed.rollout import engine as engine_module

        self.acc = {"prefill": 0.0, "decode": 0.0, "logprobs": 0.0}
        inner, acc = model.forward, self.acc

        def forward(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            acc["prefill" if ids is not None and ids.shape[1] > 1 else "decode"] += time.perf_counter() - t0
            return out

        model.forward = forward
        capture = engine_module._SampledTokenLogprobs.__call__

        def timed_capture(self_, *args):
            t0 = time.perf_counter()
            out = capture(self_, *args)
            acc["logprobs"] += time.perf_counter() - t0
            return out

        engine_module._SampledTokenLogprobs.__call__ = timed_capture

    def take(self) -> dict[str, float]:
        out = dict(self.acc)
        for k in self.acc:
            self.acc[k] = 0.0
        return out


def _side_by_side(args, prompts_of, load, work_dir: str) -> list[dict]:
    import torch

    from hacrl_fed.rollout.engine import Sampling

    torch.set_num_threads(args.threads)
    rows = []
    for model_name in args.model:
        lm, model_cfg, load_s = load(model_name)
        timers = _Timers(lm.model)
        engines = {name: _engine(name, lm, model_cfg, max(args.prompts), work_dir, args.engine_options)
                   for name in args.engines}
        prompts_all = prompts_of(lm.tokenizer, max(args.prompts))
        for name, eng in engines.items():                       # warm-up (first-call allocations, lazy imports)
            eng.generate(prompts_all[:2], 1, Sampling(temperature=0.7, max_new_tokens=4), args.seed)
        timers.take()
        for n in args.prompts:
            for new in args.max_new_tokens:
                for temp in args.temperature:
                    sp = Sampling(temperature=temp, max_new_tokens=new, logprobs=not args.no_logprobs)
                    reps = args.reps if n * new < 4096 else args.reps_big
                    runs = {name: [] for name in args.engines}
                    for rep in range(reps):
                        for name in args.engines:
                            cpu = time.process_time()
                            s, tokens = _run(engines[name], prompts_all[:n], sp, args.seed + rep)
                            cpu = time.process_time() - cpu
                            runs[name].append((s, tokens, _parts(name, timers.take(), s), cpu))
                    rows.append(_cell(model_name, lm, load_s, n, new, temp, args, runs, engines))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


OWN_WEIGHTS = ("ct2", "vllm")
"""Engines that generate with their own copy of the weights: the training model's forwards during their runs are
the teacher-forced behaviour log-probs, and their prefill / decode split is not observed (shown as "–")."""


def _engine(name: str, lm, model_cfg, max_batch: int, work_dir: str, options: dict):
    """The engine ``name`` through the registry's factory (:func:`hacrl_fed.worker.engines.build_engine`)."""
    from hacrl_fed.worker.engines import build_engine

    cfg = model_cfg.model_copy(update={"engine": name, "engine_options": options})
    try:
        return build_engine(lm, cfg, max_batch_sequences=max_batch, work_dir=f"{work_dir}/{name}")
    except ImportError as err:
        raise SystemExit(f"--engines: {err}") from None


def _parts(name: str, parts: dict[str, float], wall: float) -> dict[str, float | None]:
    """One run's split: the timers' own, or for an :data:`OWN_WEIGHTS` engine every training-model forward counted
    as behaviour log-probs and no prefill / decode."""
    if name in OWN_WEIGHTS:
        parts = {"prefill": None, "decode": None,
                 "logprobs": parts["prefill"] + parts["decode"] + parts["logprobs"]}
    out: dict[str, float | None] = dict(parts)
    out["rest"] = wall - sum(v for v in parts.values() if v is not None)
    return out


def _mean(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else round(statistics.mean(values), 6)   # a tiny model's split is ms, µs kept


def _cell(model_name, lm, load_s, n, new, temp, args, runs, engines) -> dict:
    a, b = args.engines
    rate = {name: [t / s for s, t, *_ in r] for name, r in runs.items()}
    cpu_rate = {name: [t / c for _, t, _, c in r] for name, r in runs.items()}
    ratios = [rb / ra for ra, rb in zip(rate[a], rate[b])]
    cpu_ratios = [rb / ra for ra, rb in zip(cpu_rate[a], cpu_rate[b])]
    return {
        "model": model_name, "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
        "threads": args.threads, "sequences": n, "max_new_tokens": new, "temperature": temp, "pairs": len(ratios),
        "logprobs": not args.no_logprobs,
        **{f"{name}_tokens_per_s": round(statistics.median(rate[name]), 1) for name in runs},
        **{f"{name}_tokens_per_cpu_s": round(statistics.median(cpu_rate[name]), 1) for name in runs},
        **{f"{name}_tokens": [t for _, t, *_ in runs[name]] for name in runs},
        **{f"{name}_parts_s": {k: _mean(p[k] for _, _, p, _ in runs[name])
                               for k in ("prefill", "decode", "logprobs", "rest")} for name in runs},
        **{f"{name}_refresh_s": [round(x, 2) for x in engines[name].refresh_seconds]
           for name in runs if hasattr(engines[name], "refresh_seconds")},
        "ratio": round(statistics.median(ratios), 2), "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2), "cpu_ratio": round(statistics.median(cpu_ratios), 2),
        "cpu_ratio_min": round(min(cpu_ratios), 2), "cpu_ratio_max": round(max(cpu_ratios), 2),
    }


def _markdown(rows: list[dict], engines: list[str]) -> str:
    a, b = engines
    lines = [f"| model | seqs × new tokens | T | {a} tokens/s (per CPU s) | {b} tokens/s (per CPU s) "
             f"| {b} / {a} wall, median [min, max] (pairs) | {b} / {a} CPU | {a}: prefill / decode / log-probs / rest s "
             f"| {b}: prefill / decode / log-probs / rest s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pa, pb = r[f"{a}_parts_s"], r[f"{b}_parts_s"]
        lines.append(
            f"| {r['model']} | {r['sequences']} × {r['max_new_tokens']} | {r['temperature'] or 'greedy'} "
            f"| {r[f'{a}_tokens_per_s']} ({r[f'{a}_tokens_per_cpu_s']}) | {r[f'{b}_tokens_per_s']} "
            f"({r[f'{b}_tokens_per_cpu_s']}) | {r['ratio']}× [{r['ratio_min']}, {r['ratio_max']}] ({r['pairs']}) "
            f"| {r['cpu_ratio']}× [{r['cpu_ratio_min']}, {r['cpu_ratio_max']}] "
            f"| {_split(pa)} | {_split(pb)} |")
    return "\n".join(lines)


def _split(parts: dict) -> str:
    return " / ".join("–" if parts[k] is None else f"{parts[k]:.2f}" for k in ("prefill", "decode", "logprobs", "rest"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2-135m-instruct"])
    parser.add_argument("--prompts", type=int, nargs="+", default=[16], help="sequences per call (grid)")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[48])
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0], help="0 = greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", nargs=2, metavar=("A", "B"),
                        help="compare two engines (hf, loop, ct2 or any registered name) on the grid")
    parser.add_argument("--engine-options", type=json.loads, default={}, metavar="JSON",
                        help="model.engine_options of both engines (--engines), e.g. '{\"compute_type\": \"float32\"}'")
    parser.add_argument("--reps", type=int, default=3, help="A, B pairs per cell (--engines)")
    parser.add_argument("--reps-big", type=int, default=1, help="pairs per cell of >= 4096 sequence-tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (--engines)")
    parser.add_argument("--markdown", action="store_true", help="print the table too (--engines)")
    parser.add_argument("--no-logprobs", action="store_true",
                        help="generate as an evaluation does: no behaviour log-probs (Sampling.logprobs = False; "
                             "--engines)")
    args = parser.parse_args()
    if min(args.prompts) < 1 or min(args.max_new_tokens) < 1 or args.reps < 1 or args.reps_big < 1:
        parser.error("--prompts, --max-new-tokens, --reps and --reps-big must be >= 1")

    import torch

    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
    from hacrl_fed.worker.models import load_model

    system = "Solve the problem. Put the final answer in \\boxed{}."

    def prompts_of(tokenizer, n):
        return [render_prompt(tokenizer, q, system_prompt=system) for q in _problems(n)]

    def load(name):
        t0 = time.perf_counter()
        if args.engines:                      # a packaged alias: its float32 export, dequantized once (model_cache)
            from model_cache import hf_dir

            name = str(hf_dir(name))
        cfg = ModelConfig(name_or_path=name, device=args.device)
        return load_model(cfg), cfg, time.perf_counter() - t0

    if args.engines:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bench-generation-") as work_dir:   # engines' converted models
            rows = _side_by_side(args, prompts_of, load, work_dir)
        if args.markdown:
            print(_markdown(rows, args.engines))
        return
    name, n, new, temp = args.model[0], args.prompts[0], args.max_new_tokens[0], args.temperature[0]
    lm, _, t_load = load(name)
    prompts = prompts_of(lm.tokenizer, n)
    sampling = Sampling(temperature=temp, max_new_tokens=new)
    batched = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=n)
    single = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=1)
    _run(batched, prompts[:2], Sampling(temperature=temp, max_new_tokens=4), args.seed)  # warm-up
    b_time, b_tokens = _run(batched, prompts, sampling, args.seed)
    s_time, s_tokens = _run(single, prompts, sampling, args.seed)
    b_rate, s_rate = b_tokens / b_time, s_tokens / s_time
    print(json.dumps({
        "model": name, "device": args.device, "threads": torch.get_num_threads(), "load_s": round(t_load, 1),
        "prompts": n, "max_new_tokens": new, "temperature": temp,
        "batched_tokens": b_tokens, "batched_s": round(b_time, 2), "batched_tokens_per_s": round(b_rate, 1),
        "per_sample_tokens": s_tokens, "per_sample_s": round(s_time, 2), "per_sample_tokens_per_s": round(s_rate, 1),
        "speedup": round(b_rate / s_rate, 2),
    }))


if __name__ == "__main__":
    main()
