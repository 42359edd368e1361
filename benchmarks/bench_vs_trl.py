"""One GSPO step of hacrl-fed next to TRL 1.16's GRPOTrainer: same model, prompts, samples, reward and update.

Both sides start from the same float32 weights (one Hugging Face directory, :mod:`model_cache`), the same
B prompts token for token (hacrl-fed's chat-template rendering; TRL's ``_tokenize_prompts`` returns those
ids), the same sampling seed right before the same left-padded ``model.generate`` call of all B × G rows
(temperature 1, no top-k / top-p), the same reward (``hacrl_fed.reward.compare.check_answer``, in process on
both sides) and one optimizer step:

* **hacrl-fed**: the production :class:`hacrl_fed.worker.agent.AgentWorker` — ``generate`` (rollouts,
  behaviour log-probs, verification, signing) then ``train`` (envelope checks, rows, advantages, the
  ``gspo`` preset's update: sequence ratio, ε 3e-4 / 4e-4, no KL, AdamW, grad clip 1, one mini-batch of all
  rows), with the project's defaults otherwise.
* **TRL**: ``GRPOTrainer`` with ``importance_sampling_level="sequence"``, ``beta=0``, ``loss_type="grpo"``,
  ``epsilon=3e-4``, ``epsilon_high=4e-4``, ``scale_rewards="group"``, lr 1e-5 constant, ``max_grad_norm=1``,
  ``per_device_train_batch_size = B·G``, ``num_generations = G``, ``max_steps=1``, float32 (``bf16=False``).

Activation (gradient) checkpointing is set alike on both sides: on by default, as TRL's ``GRPOConfig``
defaults to it (``gradient_checkpointing=True``); ``--gradient-checkpointing off`` turns it off on both
(hacrl-fed's default ``model.gradient_checkpointing = false``). ``--device cuda:0 --precision bf16`` runs both
sides on a GPU with bf16 mixed precision (hacrl-fed ``model.autocast = "bfloat16"``, TRL ``bf16=True``; float32
weights on both) and adds the peak GPU memory (``torch.cuda.max_memory_allocated``).

Each run is its own subprocess on one thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``), so
its peak RSS (``VmHWM``, the whole process: imports, model, optimizer, step) is its own; runs alternate
A B A B … and each ratio is taken within a pair, so machine load hits both sides alike. Measured: CPU and
wall seconds of the step (TRL: ``on_step_begin`` → ``on_step_end``; hacrl-fed: ``generate`` + ``train``),
of the ``model.generate`` call inside it, and peak RSS. Checked: the SHA-256 of every completion's token ids
(same samples), the rewards, the pre-clip gradient norm, and the cosine of the two updates Δθ (first pair).

    pip install -e ".[bench]"        # trl==1.16.0: only this benchmark needs it
    python benchmarks/bench_vs_trl.py --sizes 2x4 4x8 --reps 3 --out benchmarks/results/vs-trl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBLEMS = [("What is 7 + 5?", "12"), ("What is 9 - 4?", "5"), ("Compute 6 * 3.", "18"), ("What is 8 + 7?", "15"),
            ("What is 12 - 5?", "7"), ("Compute 4 * 5.", "20"), ("What is 13 + 9?", "22"), ("What is 20 - 6?", "14")]
SYSTEM_PROMPT = "Solve the problem. Put the final answer in \\boxed{}."
LR = 1e-5
AGENT = "bench"


# ---------------------------------------------------------------------------------------------- both sides

def _prompt_ids(tokenizer, b: int) -> list[list[int]]:
    from hacrl_fed.data.prompts import render_prompt

    return [list(render_prompt(tokenizer, q, system_prompt=SYSTEM_PROMPT)) for q, _ in PROBLEMS[:b]]


def _completion_hash(completions: list[list[int]]) -> str:
    h = hashlib.sha256()
    for ids in completions:
        h.update((",".join(map(str, ids)) + ";").encode())
    return h.hexdigest()


def reward(text: str, reference: str, problem: str) -> float:
    """The one reward of both sides: the project's verifier check, in process."""
    from hacrl_fed.reward.compare import check_answer

    return float(check_answer(text, reference, "boxed", problem).reward)


class _Clock:
    """CPU (process) and wall seconds spent inside a wrapped callable, summed over its calls."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            c, w = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu += time.process_time() - c
                self.wall += time.perf_counter() - w
        return timed


def _peak_rss() -> float:
    """Peak RSS of this process in bytes: ``VmHWM`` (Linux; counted from this process's exec). ``ru_maxrss``
    would start at the driver's peak (the forked address space's high-water mark is folded in at exec), which
    hides a side's own peak when the driver has grown larger (e.g. after its update-cosine check)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024.0   # kB
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0   # Linux KiB; macOS bytes


def _peak_gpu() -> float:
    import torch

    return float(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0.0


def _save_params(model, path: str) -> None:
    from safetensors.torch import save_file

    save_file({n: p.detach().cpu().contiguous() for n, p in model.named_parameters()}, path)


def _load(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    return model, tok


# ---------------------------------------------------------------------------------------------- hacrl-fed

class InProcessVerifier:
    """The worker's verifier interface over :func:`reward` in this process (no pool: its CPU time is counted)."""

    def verify(self, responses, references, styles, problems=None):
        from hacrl_fed.reward.compare import check_answer
        from hacrl_fed.reward.verifier import VerdictList

        problems = problems or [None] * len(responses)
        return VerdictList([check_answer(r, ref, s, p) for r, ref, s, p in zip(responses, references, styles, problems)])

    def close(self) -> None:
        pass


def run_hacrl(args) -> dict:
    from hacrl_fed.algo.config import AlgoConfig
    from hacrl_fed.update.optim_config import OptimConfig
    from hacrl_fed.config import AgentConfig, ModelConfig, SamplingConfig, VerifierConfig
    from hacrl_fed.protocol.keys import generate_identity, update_roster
    from hacrl_fed.v1 import rollout_pb2 as pb
    from hacrl_fed.v1 import worker_pb2 as wpb
    from hacrl_fed.worker.agent import AgentWorker

    work = Path(tempfile.mkdtemp(prefix="bench-hacrl-"))
    ident = generate_identity(AGENT, work / "keys")
    update_roster(work / "roster.toml", AGENT, ident.ed25519)
    cfg = AgentConfig(name=AGENT, private_key=str(ident.signing_key), roster=str(work / "roster.toml"),
                      checkpoint_dir=str(work / "ck"),
                      model=ModelConfig(name_or_path=args.model_dir, max_response_tokens=2 * args.max_new_tokens,
                                        system_prompt=SYSTEM_PROMPT, device=args.device,
                                        autocast="bfloat16" if args.precision == "bf16" else "none",
                                        gradient_checkpointing=args.gradient_checkpointing == "on"),
                      algo=AlgoConfig.preset("gspo"),
                      optim=OptimConfig(lr=LR, mini_batch_rows=args.b * args.g),
                      verifier=VerifierConfig(truncated_reward="verify"))
    worker = AgentWorker(cfg, resume=False, verifier=InProcessVerifier(),
                         sampling=SamplingConfig(max_new_tokens=args.max_new_tokens))
    gen_clock = _Clock()
    worker.model.generate = gen_clock.wrap(worker.model.generate)
    prompts = [pb.PromptItem(prompt_id=f"p{i}", text=q, reference_answer=a, answer_style="boxed")
               for i, (q, a) in enumerate(PROBLEMS[:args.b])]
    plan = pb.RoundPlan(run_id="bench", step=1, samples_per_prompt=args.g, prompts=prompts,
                        sampling=pb.SamplingParams(temperature=1.0, top_p=1.0, top_k=0,
                                                   max_new_tokens=args.max_new_tokens, seed=args.seed))
    rss_before = _peak_rss()
    c0, w0 = time.process_time(), time.perf_counter()
    env = worker.generate(plan).envelope
    batch = pb.RolloutBatch.FromString(env.payload)
    table = pb.CapabilityTable(run_id="bench", step=1)
    mean = sum(r.reward for r in batch.rollouts) / len(batch.rollouts)
    table.agents.add(agent_id=AGENT, capability=max(mean, 1e-8), window=[mean], step_accuracy=mean)
    pending = worker.trainer.pending
    samples = [pending.samples[(f"p{i}", j)] for i in range(args.b) for j in range(args.g)]
    report = worker.train(wpb.TrainRequest(run_id="bench", step=1, plan=plan, envelopes=[env], capabilities=table))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    out = {"side": "hacrl", "step_cpu_s": cpu, "step_wall_s": wall, "generate_cpu_s": gen_clock.cpu,
           "generate_wall_s": gen_clock.wall, "peak_rss_bytes": _peak_rss(), "rss_before_step_bytes": rss_before,
           "peak_gpu_bytes": _peak_gpu(),
           "completion_hash": _completion_hash([list(s.response_ids) for s in samples]),
           "rewards": [float(r.reward) for r in batch.rollouts], "grad_norm": float(report.metrics["grad_norm"]),
           "updates_applied": float(report.metrics["updates"] - report.metrics["zero_grad_updates"]
                                    - report.metrics["skipped_updates"]),
           "tokens": sum(len(s.response_ids) for s in samples),
           "expected_prompt_ids_hash": _completion_hash(_prompt_ids(worker.tokenizer, args.b))}
    if args.save_params:
        _save_params(worker.model, args.save_params)
    worker.close()
    return out


# ---------------------------------------------------------------------------------------------- TRL

def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hacrl_fed.worker.agent import generation_seed

    model, tok = _load(args.model_dir)
    ids = _prompt_ids(tok, args.b)
    by_text = {q: i for i, (q, _) in enumerate(PROBLEMS[:args.b])}
    seed = generation_seed(args.seed, 1, AGENT)          # the seed the hacrl-fed worker samples with
    seen: dict[str, list] = {"completions": []}

    class SamePrompts(GRPOTrainer):
        def _tokenize_prompts(self, prompts):
            return [ids[by_text[p]] for p in prompts], None, {}

        def _generate_single_turn(self, prompt_ids, *a, **kw):
            torch.manual_seed(seed)
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **kw)
            seen["completions"] = [list(c) for c in completion_ids]
            return completion_ids, logprobs

    def accuracy(completions, solution, problem, **kwargs):
        return [reward(c, s, p) for c, s, p in zip(completions, solution, problem)]

    class StepClock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            seen["t0"] = (time.process_time(), time.perf_counter(), _peak_rss())

        def on_step_end(self, a, state, control, **kw):
            seen["t1"] = (time.process_time(), time.perf_counter())

    data = Dataset.from_list([{"prompt": q, "solution": s, "problem": q} for q, s in PROBLEMS[:args.b]])
    work = tempfile.mkdtemp(prefix="bench-trl-")
    cfg = GRPOConfig(output_dir=work, per_device_train_batch_size=args.b * args.g, num_generations=args.g,
                     gradient_accumulation_steps=1, max_steps=1, learning_rate=LR, lr_scheduler_type="constant",
                     max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
                     beta=0.0, loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4,
                     epsilon_high=4e-4, scale_rewards="group", max_grad_norm=1.0, weight_decay=0.0,
                     shuffle_dataset=False, bf16=args.precision == "bf16", use_cpu=args.device == "cpu",
                     report_to="none", save_strategy="no",
                     logging_steps=1, disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
                     log_completions=False, gradient_checkpointing=args.gradient_checkpointing == "on")
    trainer = SamePrompts(model=model, reward_funcs=[accuracy], args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[StepClock()])
    gen_clock = _Clock()
    model.generate = gen_clock.wrap(model.generate)
    trainer.train()
    (c0, w0, rss_before), (c1, w1) = seen["t0"], seen["t1"]
    logs = [h for h in trainer.state.log_history if "grad_norm" in h]
    completions = seen["completions"]
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    rewards = [reward(t, PROBLEMS[i // args.g][1], PROBLEMS[i // args.g][0]) for i, t in enumerate(texts)]
    out = {"side": "trl", "step_cpu_s": c1 - c0, "step_wall_s": w1 - w0, "generate_cpu_s": gen_clock.cpu,
           "generate_wall_s": gen_clock.wall, "peak_rss_bytes": _peak_rss(), "rss_before_step_bytes": rss_before,
           "peak_gpu_bytes": _peak_gpu(),
           "completion_hash": _completion_hash(completions), "rewards": rewards,
           "grad_norm": float(logs[-1]["grad_norm"]) if logs else float("nan"),
           "tokens": sum(len(c) for c in completions),
           "expected_prompt_ids_hash": _completion_hash(ids)}
    if args.save_params:
        _save_params(model, args.save_params)
    return out


# ---------------------------------------------------------------------------------------------- driver

def _child(side: str, model_dir: str, b: int, g: int, args, save_params: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE),
                                                               os.environ.get("PYTHONPATH", "")]))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--model-dir", model_dir, "--b", str(b),
           "--g", str(g), "--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed),
           "--device", args.device, "--precision", args.precision, "--gradient-checkpointing",
           args.gradient_checkpointing, "--result", result_path]
    if save_params:
        cmd += ["--save-params", save_params]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        why = "killed (SIGKILL: out of memory?)" if proc.returncode == -9 else f"exit {proc.returncode}"
        print(f"{side} {b}x{g} failed, {why}:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return {"side": side, "failed": why}
    return json.loads(Path(result_path).read_text())


def _update_cosine(init_dir: str, a_path: str, b_path: str) -> dict:
    """cos(Δθ_a, Δθ_b) and ‖Δθ_a − Δθ_b‖ / ‖Δθ_b‖ over every parameter, Δθ = saved − initial weights."""
    import torch
    from safetensors import safe_open

    init = {}
    for f in sorted(Path(init_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            init |= {k: h.get_tensor(k) for k in h.keys()}
    dot = na = nb = diff = 0.0
    with safe_open(a_path, "pt") as ha, safe_open(b_path, "pt") as hb:
        for name in ha.keys():
            base = init[name].double()
            da, db = ha.get_tensor(name).double() - base, hb.get_tensor(name).double() - base
            dot += float((da * db).sum())
            na += float((da * da).sum())
            nb += float((db * db).sum())
            diff += float(((da - db) ** 2).sum())
    return {"delta_cosine": dot / max((na * nb) ** 0.5, 1e-300), "delta_rel_diff": (diff / max(nb, 1e-300)) ** 0.5,
            "delta_norm_hacrl": na ** 0.5, "delta_norm_trl": nb ** 0.5}


def _summary(size: str, runs: list[dict], check: dict) -> dict:
    pairs = [(r["hacrl"], r["trl"]) for r in runs]

    def ratio(key):
        values = [a[key] / t[key] for a, t in pairs]
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}

    def med(side, key):
        return statistics.median(r[side][key] for r in runs)

    return {"size": size, "pairs": len(pairs),
            "ratio_hacrl_over_trl": {k: ratio(k) for k in ("step_cpu_s", "step_wall_s", "generate_cpu_s",
                                                             "peak_rss_bytes")},
            "median": {side: {k: med(side, k) for k in ("step_cpu_s", "step_wall_s", "generate_cpu_s",
                                                        "generate_wall_s", "peak_rss_bytes", "peak_gpu_bytes")}
                       for side in ("hacrl", "trl")},
            "same_completions": all(a["completion_hash"] == t["completion_hash"] for a, t in pairs),
            "same_prompts": all(a["expected_prompt_ids_hash"] == t["expected_prompt_ids_hash"] for a, t in pairs),
            "same_rewards": all(a["rewards"] == t["rewards"] for a, t in pairs),
            "grad_norm": {"hacrl": pairs[0][0]["grad_norm"], "trl": pairs[0][1]["grad_norm"]},
            "tokens": pairs[0][0]["tokens"], "rewards": pairs[0][0]["rewards"], **check}


def _markdown(results: dict) -> str:
    gib = 1024 ** 3
    lines = [f"# hacrl-fed vs TRL {results['trl_version']}: one GSPO step, {results['model']}", "",
             f"`{results['command']}`", "",
             f"{results['machine']}; device {results['device']}, {results['precision']}; activation checkpointing {results['gradient_checkpointing']} on both sides; each run "
             f"a subprocess on 1 thread; runs interleaved A B A B; ratios per pair "
             f"(median [min, max] over {results['reps']} pairs).", "",
             "| B × G | whole step CPU | whole step wall | `model.generate` CPU | peak RSS | hacrl-fed step CPU / TRL | "
             "peak RSS hacrl-fed / TRL | same completions | Δθ cosine | grad norm hacrl-fed / TRL |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in results["sizes"]:
        if "failed" in s:
            done = {side: r for pair in s["runs"] for side, r in pair.items() if "failed" not in r}
            note = "; ".join(f"{side} {why}" for side, why in s["failed"].items())
            note += "".join(f"; {side} ran: step {r['step_cpu_s']:.1f} CPU s, peak RSS "
                            f"{r['peak_rss_bytes'] / gib:.2f} GiB" for side, r in done.items())
            lines.append(f"| {s['size']} | {note} |" + " |" * 9)
            continue
        r, m = s["ratio_hacrl_over_trl"], s["median"]
        fmt = lambda k: f"{r[k]['median']:.2f}× [{r[k]['min']:.2f}, {r[k]['max']:.2f}]"   # noqa: E731
        lines.append(
            f"| {s['size']} | {fmt('step_cpu_s')} | {fmt('step_wall_s')} | {fmt('generate_cpu_s')} | "
            f"{fmt('peak_rss_bytes')} | {m['hacrl']['step_cpu_s']:.1f} s / {m['trl']['step_cpu_s']:.1f} s | "
            f"{m['hacrl']['peak_rss_bytes'] / gib:.2f} / {m['trl']['peak_rss_bytes'] / gib:.2f} GiB | "
            f"{'yes' if s['same_completions'] else 'NO'} ({s['tokens']} tokens) | {s.get('delta_cosine', float('nan')):.7f} | "
            f"{s['grad_norm']['hacrl']:.4f} / {s['grad_norm']['trl']:.4f} |")
    lines += ["", "Ratios are hacrl-fed / TRL (below 1: hacrl-fed is cheaper).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sizes", nargs="+", default=["2x4", "4x8"], help="B x G, e.g. 2x4 4x8")
    parser.add_argument("--reps", type=int, default=3, help="pairs of runs per size (A B A B …)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (both sides)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: mixed precision on both sides (float32 weights)")
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on",
                        help="activation checkpointing on both sides (TRL's GRPOConfig default: on)")
    parser.add_argument("--out", default="benchmarks/results/vs-trl")
    # one side, in its own process (the driver starts these)
    parser.add_argument("--side", choices=["hacrl", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--b", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--g", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--save-params", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        import torch

        torch.set_num_threads(1)
        if args.b > len(PROBLEMS):
            parser.error(f"B must be <= {len(PROBLEMS)}")
        out = (run_hacrl if args.side == "hacrl" else run_trl)(args)
        Path(args.result).write_text(json.dumps(out))
        return

    try:
        import trl
    except ImportError:
        sys.exit("bench_vs_trl.py needs TRL: pip install -e \".[bench]\" (or pip install trl==1.16.0)")
    from model_cache import hf_dir

    model_dir = str(hf_dir(args.model))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        for size in args.sizes:
            b, g = (int(x) for x in size.lower().split("x"))
            runs = []
            for rep in range(args.reps):
                pair = {}
                for side in ("hacrl", "trl"):
                    save = str(Path(tmp) / f"{side}-{size}.safetensors") if rep == 0 else None
                    pair[side] = r = _child(side, model_dir, b, g, args, save)
                    print(f"{size} rep {rep} {side}: " + (r["failed"] if "failed" in r else
                          f"step {r['step_cpu_s']:.1f} CPU s, {r['step_wall_s']:.1f} wall s, "
                          f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB"), flush=True)
                runs.append(pair)
                if any("failed" in r for r in pair.values()):
                    break                        # a side that cannot run this size is not retried
            if any("failed" in r for pair in runs for r in pair.values()):
                sizes.append({"size": size, "failed": {side: r["failed"] for pair in runs
                                                       for side, r in pair.items() if "failed" in r}, "runs": runs})
                continue
            check = _update_cosine(model_dir, str(Path(tmp) / f"hacrl-{size}.safetensors"),
                                   str(Path(tmp) / f"trl-{size}.safetensors"))
            sizes.append(_summary(size, runs, check) | {"runs": runs})
    import platform

    results = {"model": args.model, "trl_version": trl.__version__, "reps": args.reps,
               "gradient_checkpointing": args.gradient_checkpointing, "device": args.device,
               "precision": args.precision,
               "max_new_tokens": args.max_new_tokens, "seed": args.seed,
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
               "command": "python benchmarks/bench_vs_trl.py " + " ".join(sys.argv[1:]), "sizes": sizes}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(_markdown(results))
    print(_markdown(results))


if __name__ == "__main__":
    main()
