"""CPU time of the learner update with ``optim.shared_prompt_forward`` on vs off (same rows, same model).

One GSPO ``hacpo_update`` over B × G own rows of the vs-TRL benchmark's prompts (chat template + system
prompt) with random responses of 40–128 tokens, behaviour sums from the model itself; activation
checkpointing on, train mode, 1 thread, like ``bench_vs_trl.py``. Both settings run on a fresh copy of the
same weights, interleaved off/on per repetition; ratios per pair.

    python benchmarks/bench_packing.py --sizes 2x4 4x8 --reps 3        # smollm2-135m-instruct

Prints one JSON line per size: the CPU seconds of every run, the median [min, max] on/off ratio over
the pairs, and the smallest cosine between the two updates Δθ of a pair with the max |Δθ_on − Δθ_off|
(the forward is exact to float rounding; AdamW's first step, lr·g/|g|, turns the rounding of the tiniest
gradient entries into differences up to lr, so the cosine is the measure).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rows(model, tok, b: int, g: int, seed: int):
    from bench_vs_trl import PROBLEMS, SYSTEM_PROMPT

    from hacrl_fed.update.logprobs import token_logprobs
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.tokenization.views import own_row

    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(b):
        prompt = render_prompt(tok, PROBLEMS[i % len(PROBLEMS)][0], system_prompt=SYSTEM_PROMPT)
        for j in range(g):
            n = int(torch.randint(40, 129, (1,), generator=gen))
            resp = torch.randint(0, len(tok), (n,), generator=gen).tolist()
            ids = torch.tensor([prompt + resp])
            with torch.no_grad():
                behaviour = float(token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].sum())
            rows.append(own_row(prompt_id=f"p{i}", sample_index=j, agent="a", prompt_ids=prompt, response_ids=resp,
                                reward=float((i + j) % 2), behaviour_logprob_sum=behaviour, finish_reason="length",
                                max_response_tokens=256))
    return rows


def _update(model, rows, mode: str) -> tuple[float, torch.Tensor]:
    from hacrl_fed.algo.advantages import row_advantages
    from hacrl_fed.algo.config import AlgoConfig
    from hacrl_fed.update.loop import hacpo_update, make_optimizer
    from hacrl_fed.config import OptimConfig

    algo = AlgoConfig.preset("gspo")
    optim = OptimConfig(lr=1e-5, mini_batch_rows=len(rows), shared_prompt_forward=mode)
    adv = row_advantages(rows, {}, algo, learner="a")
    m = copy.deepcopy(model)
    m.train()
    opt = make_optimizer(m, optim)
    c0 = time.process_time()
    hacpo_update(m, opt, rows, adv, {}, algo, optim, learner="a", temperature=1.0)
    cpu = time.process_time() - c0
    return cpu, torch.cat([p.detach().flatten() for p in m.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sizes", nargs="+", default=["2x4", "4x8"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from model_cache import hf_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(hf_dir(args.model))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.gradient_checkpointing_enable()
    for size in args.sizes:
        b, g = (int(x) for x in size.split("x"))
        rows = _rows(model.eval(), tok, b, g, args.seed)
        runs: dict[str, list[float]] = {"off": [], "on": []}
        delta, cosine = 0.0, 1.0
        theta = torch.cat([p.detach().flatten() for p in model.parameters()])
        for _ in range(args.reps):
            step = {}
            for mode in ("off", "on"):
                cpu, params = _update(model, rows, mode)
                step[mode] = (params - theta).double()
                runs[mode].append(cpu)
            delta = max(delta, float((step["on"] - step["off"]).abs().max()))
            cosine = min(cosine, float(torch.nn.functional.cosine_similarity(step["on"], step["off"], dim=0)))
        ratios = [on / off for on, off in zip(runs["on"], runs["off"])]
        print(json.dumps({"size": size, "model": args.model, "tokens": sum(len(r.prompt_ids) + len(r.response_ids)
                                                                        for r in rows),
                          "prompt_tokens": sum(len(r.prompt_ids) for r in rows), "cpu_s": runs,
                          "ratio_on_off": [statistics.median(ratios), min(ratios), max(ratios)],
                          "dtheta_cosine": cosine, "max_abs_dtheta_diff": delta}), flush=True)


if __name__ == "__main__":
    main()
