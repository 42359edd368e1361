"""Peak memory and time of selected-token log-probs: chunked LM head vs full log-softmax (ARCHITECTURE §7).

Setting: a Gemma-3-270M-sized LM head (hidden 640, vocabulary 262 144) over random last hidden states
of a batch of 8 × 192 tokens; forward + backward of Σ w·log π(y_t). Each variant runs in a fresh
subprocess; peak memory is the process's peak RSS (``ru_maxrss``) minus its RSS just before the
measured section (weights, their gradient buffers and the hidden states are allocated before that).

    python benchmarks/bench_logprobs.py       # full vs chunked (fused backward, 1024 and 256) vs checkpoint (1024)
    python benchmarks/bench_logprobs.py --vocab 49152 --hidden 576   # SmolLM2-135M-sized head

Variants: ``full`` (logits → log-softmax → gather), ``chunked_<n>`` (``token_logprobs``, hand-written chunked
backward, the default for a plain linear head), ``checkpoint_<n>`` (``token_logprobs(fused=False)``: autograd
per chunk under ``torch.utils.checkpoint``, used for LoRA-wrapped heads).

Prints one JSON line: per-variant ``peak_rss_delta_mb``, ``peak_rss_mb``, ``time_s`` (best of ``--repeats``
after one warm-up), a checksum, and the ratios chunked / full.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import torch
from torch import nn


class _HiddenStates(nn.Module):
    """Stand-in decoder: returns fixed last hidden states [B, T, H] (a leaf that requires grad)."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = nn.Parameter(hidden)

    def forward(self, input_ids, **_):
        return SimpleNamespace(last_hidden_state=self.hidden * 1.0)


class _HeadOnlyLM(nn.Module):
    """Minimal causal-LM surface used by :func:`hacrl_fed.update.logprobs.token_logprobs`."""

    def __init__(self, hidden: torch.Tensor, vocab: int):
        super().__init__()
        self.model = _HiddenStates(hidden)
        self.lm_head = nn.Linear(hidden.shape[-1], vocab, bias=False)
        self.config = SimpleNamespace()

    def get_decoder(self):
        return self.model

    def get_output_embeddings(self):
        return self.lm_head


def _full_logprobs(model: _HeadOnlyLM, input_ids: torch.Tensor) -> torch.Tensor:
    """The naive way: full [B, T, V] logits and log-softmax, then gather."""
    logits = model.lm_head(model.model(input_ids).last_hidden_state).float()
    lp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def run_variant(args) -> dict:
    from hacrl_fed.update.logprobs import token_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(args.batch, args.seq, args.hidden)
    model = _HeadOnlyLM(hidden, args.vocab)
    nn.init.normal_(model.lm_head.weight, std=args.hidden ** -0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # gradient buffers exist before measuring (both variants need them)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    mask = torch.ones_like(input_ids)
    weights = torch.randn(args.batch, args.seq)

    def step():
        if args.variant == "full":
            lp = _full_logprobs(model, input_ids)
        else:
            lp = token_logprobs(model, input_ids, mask, chunk_tokens=args.chunk, fused=args.variant == "chunked")
        (lp * weights).sum().backward()
        return lp.detach()

    rss_before = psutil.Process().memory_info().rss
    times = []
    for i in range(args.repeats + 1):
        for p in model.parameters():
            p.grad.zero_()
        start = time.perf_counter()
        lp = step()
        if i > 0:
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "peak_rss_delta_mb": round((peak - rss_before) / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "time_s": round(min(times), 3),
        "logprob_sum": float(lp.sum()),
        "head_grad_norm": float(model.lm_head.weight.grad.norm()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 256], help="chunk sizes to measure")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkpoint-chunks", type=int, nargs="*", default=[1024],
                        help="chunk sizes to measure with the autograd + torch.utils.checkpoint path")
    parser.add_argument("--variant", choices=["full", "chunked", "checkpoint"], help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # child process: one measurement
        print(json.dumps(run_variant(args)))
        return

    common = [f"--batch={args.batch}", f"--seq={args.seq}", f"--hidden={args.hidden}", f"--vocab={args.vocab}",
              f"--repeats={args.repeats}"]
    variants = {"full": ["--variant=full"]}
    variants.update({f"chunked_{c}": ["--variant=chunked", f"--chunk={c}"] for c in args.chunks})
    variants.update({f"checkpoint_{c}": ["--variant=checkpoint", f"--chunk={c}"] for c in args.checkpoint_chunks})
    results = {}
    for name, extra in variants.items():
        out = subprocess.run([sys.executable, __file__, *common, *extra], capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    full = results["full"]
    report = {"setting": {k: getattr(args, k) for k in ("batch", "seq", "hidden", "vocab", "repeats")},
              "threads": torch.get_num_threads(), **results}
    for name in results:
        if name != "full":
            r = results[name]
            report[f"{name}/peak_ratio"] = round(r["peak_rss_delta_mb"] / full["peak_rss_delta_mb"], 3)
            report[f"{name}/time_ratio"] = round(r["time_s"] / full["time_s"], 3)
            report[f"{name}/logprob_sum_rel_diff"] = abs(r["logprob_sum"] - full["logprob_sum"]) / abs(full["logprob_sum"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
