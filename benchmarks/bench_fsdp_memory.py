"""Peak memory per rank of one HACPO update, single process against the sharded trainer (docs/distributed.md).

    python benchmarks/bench_fsdp_memory.py --model smollm2-135m-instruct --nprocs 1 2
    python benchmarks/bench_fsdp_memory.py --model gemma3-270m --nprocs 1 2
    python benchmarks/bench_fsdp_memory.py --model tiny-llama-bpe --nprocs 1 2 --rows 4   # smoke test
    python benchmarks/bench_fsdp_memory.py --model smollm2-135m-instruct --nprocs 1 2 --device cuda

For each N: N processes (N = 1: the plain ``hacpo_update``; N ≥ 2: ``RankState`` over a gloo or NCCL group, rank 0
holding the full weights it loaded, the other ranks built on the meta device), one update of ``--rows`` synthetic own
rows (prompt and response of ``--tokens`` tokens each, AdamW). Per rank it prints:

* ``peak_rss_gib``: the process's peak resident set size (``ru_maxrss``), everything included (rank 0's model load);
* ``state_gib``: the bytes this rank holds of parameters, gradients and AdamW state (its shards) after the update —
  what FSDP divides by N;
* on CUDA ``peak_cuda_gib`` (``torch.cuda.max_memory_allocated``).

The comparison is N = 1 (one process holds everything) against N = 2 on the same machine and model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = float(1 << 30)


def _rows(vocab: int, n: int, tokens: int):
    import torch

    from hacrl_fed.tokenization.views import own_row

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(10, vocab - 1, (2 * tokens,), generator=g).tolist()
        out.append(own_row(prompt_id=f"q{i // 2}", sample_index=i % 2, agent="a", prompt_ids=ids[:tokens],
                           response_ids=ids[tokens:], reward=float(i % 2), behaviour_logprob_sum=-2.0 * tokens,
                           finish_reason="length", max_response_tokens=tokens))
    return out


def _state_bytes(model, optimizer) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards of DTensors)."""
    import torch

    def local(t) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in model.parameters():
        total += local(p).numel() * local(p).element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * local(p.grad).element_size()
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                total += local(v).numel() * local(v).element_size()
    return total


def run_rank(model_dir: str, rows: int, tokens: int, device: str, out: str) -> None:
    """One rank's update (``HACRL_DIST_*`` environment for N ≥ 2); writes its figures to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from hacrl_fed.algo.config import AlgoConfig
    from hacrl_fed.config import OptimConfig
    from hacrl_fed.update.loop import hacpo_update, make_optimizer

    rank, world = int(os.environ.get("HACRL_DIST_RANK", "0")), int(os.environ.get("HACRL_DIST_WORLD", "1"))
    algo, optim = AlgoConfig(kl_coef=0.0), OptimConfig(lr=1e-5, mini_batch_rows=rows, micro_batch_tokens=4 * tokens)
    model = None
    if rank == 0:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    data = None
    if world == 1:
        batch = _rows(model.config.vocab_size, rows, tokens)
        opt = make_optimizer(model, optim)
        hacpo_update(model, opt, batch, [1.0 if r.reward else -1.0 for r in batch], {}, algo, optim, learner="a")
        data = {"state_gib": _state_bytes(model, opt) / GIB}
    else:
        from hacrl_fed.distributed.group import broadcast, init_group
        from hacrl_fed.distributed.ranks import RankState, Setup, UpdateJob

        env = os.environ
        mesh = init_group(rank, world, env["HACRL_DIST_ADDR"], int(env["HACRL_DIST_PORT"]), device.split(":")[0],
                          600)
        setup = broadcast(Setup(model.config, torch.float32, device.split(":")[0], "none", optim) if rank == 0 else None)
        state = RankState(setup, mesh, model.state_dict() if rank == 0 else None)
        if rank == 0:
            batch = _rows(model.config.vocab_size, rows, tokens)
            job = UpdateJob(batch, [1.0 if r.reward else -1.0 for r in batch], {}, algo, optim, {"learner": "a"},
                            gated=False, train_mode=False, rng_state=torch.get_rng_state())
        job = broadcast(job if rank == 0 else None)
        state.update(job)
        data = {"state_gib": _state_bytes(state.root, state.optimizer) / GIB}
        import torch.distributed as dist

        dist.destroy_process_group()
    data |= {"rank": rank, "world": world, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}
    if device.startswith("cuda"):
        data["peak_cuda_gib"] = torch.cuda.max_memory_allocated() / GIB
    Path(out).write_text(json.dumps(data))


def _model_dir(name: str, cache: Path) -> str:
    """The model as a plain Hugging Face directory (GGUF aliases dequantized once into ``cache``)."""
    target = cache / name
    if not (target / "config.json").is_file():
        from hacrl_fed.config import ModelConfig
        from hacrl_fed.worker.models import load_model

        loaded = load_model(ModelConfig(name_or_path=name))
        loaded.model.save_pretrained(target)
    return str(target)


def measure(model_dir: str, world: int, rows: int, tokens: int, device: str, timeout_s: float) -> list[dict]:
    from hacrl_fed.distributed.group import free_port, rank_env

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(world):
            env = os.environ | (rank_env(r, world, "127.0.0.1", port, 600, device.split(":")[0]) if world > 1 else {})
            if device.startswith("cuda") and world > 1:
                env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(world)))
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-of", model_dir, "--rows", str(rows),
                                           "--tokens", str(tokens), "--device", device,
                                           "--out", f"{tmp}/{r}.json"], env=env))
        codes = [p.wait(timeout=timeout_s) for p in procs]
        if any(codes):
            raise SystemExit(f"N = {world}: ranks exited with {codes}")
        return [json.loads(Path(f"{tmp}/{r}.json").read_text()) for r in range(world)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "hacrl-bench-fsdp"))
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--rank-of", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_of:
        run_rank(args.rank_of, args.rows, args.tokens, args.device, args.out)
        return 0
    if any(n < 1 for n in args.nprocs) or args.rows < 1 or args.tokens < 2:
        print("--nprocs, --rows must be >= 1 and --tokens >= 2", file=sys.stderr)
        return 2
    if args.model.startswith("tiny-"):
        from hacrl_fed.tiny_models import build_tiny_model

        model_dir = str(build_tiny_model(args.model, Path(args.cache) / args.model))
    else:
        model_dir = _model_dir(args.model, Path(args.cache))
    results = []
    print(f"{args.model} on {args.device}: one update of {args.rows} rows × {2 * args.tokens} tokens")
    print(f"{'N':>3} {'rank':>4} {'peak RSS GiB':>13} {'params+grads+AdamW GiB':>23}" +
          (f" {'peak CUDA GiB':>14}" if args.device.startswith("cuda") else ""))
    for n in args.nprocs:
        for row in measure(model_dir, n, args.rows, args.tokens, args.device, args.timeout_s):
            results.append(row | {"model": args.model, "device": args.device})
            cuda = f" {row['peak_cuda_gib']:14.3f}" if "peak_cuda_gib" in row else ""
            print(f"{n:3d} {row['rank']:4d} {row['peak_rss_gib']:13.3f} {row['state_gib']:23.4f}{cuda}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
