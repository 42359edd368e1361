"""The cheap wins of the ``hf`` engine on a CPU, measured: Hugging Face ``generate`` with its dynamic KV cache, with
a static KV cache (``cache_implementation="static"``), and with the static cache and ``torch.compile`` of the
model's forward (Hugging Face's recipe for compiled decoding), greedy, in one process on ``--threads`` threads.

Each variant runs twice after its warm-up (the compiled one's first call is its compilation, timed apart); the
dynamic cache runs again at the end, so the drift of a shared machine shows. Every variant's tokens are compared
with the dynamic cache's. Prints one JSON line (seconds per ``generate`` call, the best of two)::

    python benchmarks/bench_compile.py --model smollm2-135m-instruct --prompts 16 --max-new-tokens 32 --threads 1

``--no-compile`` leaves the compiled variant out (it compiles for minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time


def _problems(n: int) -> list[str]:
    return [f"What is {3 + i % 7} + {2 + (5 * i) % 9}? Explain briefly." for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a packaged alias, tiny kind or model directory")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.threads < 1:
        p.error("--prompts, --max-new-tokens and --threads must be >= 1")

    import torch

    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.worker.models import load_model

    torch.set_num_threads(args.threads)
    name = args.model
    if not name.startswith("tiny-"):
        from model_cache import hf_dir   # a packaged alias: its float32 export, dequantized once

        name = str(hf_dir(name))
    lm = load_model(ModelConfig(name_or_path=name))
    model, tok = lm.model.eval(), lm.tokenizer
    prompts = [render_prompt(tok, q, system_prompt="Solve the problem.") for q in _problems(args.prompts)]
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    n = args.max_new_tokens

    def run(**kw) -> tuple[float, torch.Tensor]:
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=tok.pad_token_id, **kw)
        return time.perf_counter() - t, out[:, batch["input_ids"].shape[1]:]

    def best(**kw) -> tuple[float, torch.Tensor]:
        (a, out), (b, _) = run(**kw), run(**kw)
        return min(a, b), out

    run()                                                    # warm-up
    res: dict = {"model": args.model, "rows": args.prompts, "new_tokens": n, "threads": args.threads}
    res["dynamic_s"], base = best()
    run(cache_implementation="static")
    res["static_s"], out = best(cache_implementation="static")
    res["static_same_tokens"] = bool(torch.equal(out, base))
    if not args.no_compile:
        eager = model.forward
        model.forward = torch.compile(model.forward)
        res["compile_first_call_s"], _ = run(cache_implementation="static")
        res["static_compiled_s"], out = best(cache_implementation="static")
        res["compiled_same_tokens"] = bool(torch.equal(out, base))
        model.forward = eager
    res["dynamic_again_s"], _ = best()
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
