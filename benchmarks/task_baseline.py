"""Base accuracy of the real models on candidate reasoning-gym tasks: the table the training mix is chosen from.

For every model of the pair and every candidate (task, level) of :data:`CANDIDATES`, the held-out items
(generator seeds ``0 … n−1``, exactly the held-out problems a ``reasoning_gym`` run evaluates) are answered
greedily (avg@1) and with 4 samples at temperature 1 (avg@4, the rollouts' sampling), with the model's prompt
and system prompt of ``--config``, verified as in training (math-verify for numbers, the task's scorer
otherwise; :mod:`hacrl_fed.data.tasks`). Besides accuracy each cell records why responses failed: cut at the
token limit, no box, a boxed wrong answer.

Resumable: each finished (model, task, level) cell goes to ``<out>/cells/<agent>--<label>.json`` and is
skipped next time; ``--summary-only`` rebuilds ``results.md`` / ``results.json``.

    python benchmarks/task_baseline.py --out benchmarks/results/task-baseline               # both models
    python benchmarks/task_baseline.py --out /tmp/tb --agents smollm2 --tasks chain_sum-l1 --problems 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from inproc import outcome  # noqa: E402

SYSTEM_PROMPT = ("Solve the problem step by step. End with the final answer in the form \\boxed{answer}. "
                 "Example: What is 7 minus 4? 7 - 4 = 3, so the answer is \\boxed{3}.")
"""The system prompt of every model here (the task suite's configs use the same). A worked example that is none
of the tasks: without one the base model (Gemma-3-270M) rarely boxes an answer, and with only ``\\boxed{42}``
as the example it answers 42 (chain_sum greedy 4.2 %; with this prompt 3 of 8)."""

SHORT_PROMPT = ("Answer with the final result only, in the form \\boxed{answer}. "
                "Example: What is 7 minus 4? \\boxed{3}")
"""A prompt that asks for the answer alone: far fewer tokens per rollout (a cheaper step) and no reasoning text to
go astray at temperature 1; the example is worked (7 − 4), not a bare number, for the reason above."""

PROMPTS = {"cot": SYSTEM_PROMPT, "short": SHORT_PROMPT}

CANDIDATES: dict[str, tuple[str, dict]] = {
    # label: (generator, config) — two or three difficulty levels per generator
    "chain_sum-l1": ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}),
    "chain_sum-l2": ("chain_sum", {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2}),
    "basic_arithmetic-l1": ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1,
                                                 "operators": ["+", "-", "*"], "allow_parentheses": False,
                                                 "allow_negation": False}),
    "basic_arithmetic-l2": ("basic_arithmetic", {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2,
                                                 "operators": ["+", "-", "*"], "allow_parentheses": True,
                                                 "allow_negation": False}),
    "products-l1": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    "products-l2": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}),
    "leg_counting-l1": ("leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}),
    "leg_counting-l2": ("leg_counting", {"min_animals": 2, "max_animals": 4, "min_instances": 1, "max_instances": 6}),
    "gcd-l1": ("gcd", {"min_value": 2, "max_value": 30}),
    "gcd-l2": ("gcd", {"min_value": 10, "max_value": 200}),
    "lcm-l1": ("lcm", {"min_value": 2, "max_value": 12}),
    "lcm-l2": ("lcm", {"min_value": 2, "max_value": 40}),
    "letter_counting-l1": ("letter_counting", {"min_words": 2, "max_words": 4}),
    "letter_counting-l2": ("letter_counting", {"min_words": 5, "max_words": 10}),
    "count_bits-l1": ("count_bits", {"min_n": 1, "max_n": 63}),
    "count_bits-l2": ("count_bits", {"min_n": 64, "max_n": 4095}),
    "simple_equations-l1": ("simple_equations", {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 20,
                                                 "operators": ["+", "-"], "operators_weights": [0.5, 0.5]}),
    "simple_equations-l2": ("simple_equations", {"min_terms": 2, "max_terms": 3, "min_value": 1, "max_value": 50}),
    "decimal_chain_sum-l1": ("decimal_chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                                   "min_decimal_places": 1, "max_decimal_places": 1}),
    "decimal_chain_sum-l2": ("decimal_chain_sum", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2,
                                                   "min_decimal_places": 1, "max_decimal_places": 2}),
    "base_conversion-l1": ("base_conversion", {"min_base": 2, "max_base": 10, "min_value": 2, "max_value": 31}),
    "base_conversion-l2": ("base_conversion", {"min_base": 2, "max_base": 16, "min_value": 32, "max_value": 500}),
    "spell_backward-l1": ("spell_backward", {"min_word_len": 3, "max_word_len": 4}),
    "spell_backward-l2": ("spell_backward", {"min_word_len": 5, "max_word_len": 8}),
    "number_sequence-l1": ("number_sequence", {}),
    "aiw-l1": ("aiw", {}),
    "gsm_symbolic-l1": ("gsm_symbolic", {}),
    "decimal_arithmetic-l1": ("decimal_arithmetic", {"min_terms": 2, "max_terms": 2, "min_num_decimal_places": 1,
                                                     "max_num_decimal_places": 1, "precision": 4}),
    "decimal_arithmetic-l2": ("decimal_arithmetic", {"min_terms": 2, "max_terms": 3, "min_num_decimal_places": 1,
                                                     "max_num_decimal_places": 2, "precision": 6}),
}


def run_cell(engine, lm, verifier, model_cfg, label: str, n: int, max_new_tokens: int,
             temperature: float = 1.0) -> dict:
    from hacrl_fed.config import TaskSpec
    from hacrl_fed.config import DEFAULT_INSTRUCTION
    from hacrl_fed.data.tasks import generate_task
    from hacrl_fed.rollout.engine import Sampling
    from hacrl_fed.play.evaluate import EvalItem, evaluate_items

    generator, config = CANDIDATES[label]
    spec = TaskSpec(name=generator, config=config, label=label)
    problems = generate_task(spec, seed=0, size=n, held_out=True, instruction=DEFAULT_INSTRUCTION)
    items = [EvalItem(p.id, p.problem, p.answer, p.answer_style) for p in problems]
    out: dict = {"label": label, "generator": generator, "config": config, "problems": n}
    for name, samples, temp in (("greedy", 1, 0.0), ("sampled", 4, temperature)):
        t = time.perf_counter()
        res = evaluate_items(engine, lm.tokenizer, verifier, items, samples=samples,
                             sampling=Sampling(temperature=temp, max_new_tokens=max_new_tokens), seed=0,
                             system_prompt=model_cfg.system_prompt, template=model_cfg.chat_template,
                             max_prompt_tokens=model_cfg.max_prompt_tokens, chunk_prompts=max(1, 32 // samples))
        kinds = [outcome(v, r, f) for x in res for v, r, f in zip(x.verdicts, x.reasons, x.finish_reasons)]
        out[name] = {"correct": {x.prompt_id: x.correct for x in res}, "samples": samples,
                     "accuracy": sum(x.correct for x in res) / (samples * len(res)),
                     "outcomes": {k: kinds.count(k) / len(kinds) for k in sorted(set(kinds))},
                     "tokens_mean": statistics.fmean(t for x in res for t in x.response_tokens),
                     "example": res[0].responses[0][:300], "seconds": time.perf_counter() - t}
    return out


def signal_share(*correct: dict[str, int], samples: int = 4) -> float:
    """Share of problems whose group carries a gradient: some of its samples right and some wrong.

    ``correct``: one map per agent, problem id → right samples of ``samples`` (the ``sampled`` record of a cell).
    With one map it is that agent's group of ``samples``; with several, the joint group of all of them (the
    HACPO group, the paper's Eq. 6–7). Problems missing from a map count as all wrong. A group whose rewards are
    all equal has advantage 0 exactly, in GRPO, GSPO and HACPO alike
    (:func:`hacrl_fed.algo.advantages.group_advantages`), so this share bounds how much of a task a step can teach.

    >>> signal_share({"a": 0, "b": 2, "c": 4})
    0.3333333333333333
    >>> signal_share({"a": 0, "b": 4}, {"a": 1, "b": 4})
    0.5
    """
    ids = sorted(set().union(*correct))
    if not ids:
        return 0.0
    full = samples * len(correct)
    return sum(0 < sum(c.get(i, 0) for c in correct) < full for i in ids) / len(ids)


def _signal_table(by: dict, agents: list[str], labels: list[str]) -> list[str]:
    """Rows of the gradient-signal table (:func:`signal_share`): per agent alone and, with two or more agents,
    the joint group; only tasks every agent has a cell of."""
    rows = [lb for lb in labels if all((a, lb) in by for a in agents)]
    if not rows:
        return []
    joint = len(agents) > 1
    lines = ["", "## Groups that carry a gradient", "",
             "Share of the problems, %, whose sampled group has some right and some wrong responses (otherwise "
             "every advantage of the group is 0 and the task teaches nothing): each model's own group of its "
             "samples" + (", and the joint group of both models' samples, as HACPO forms it (the paper's Eq. 6–7)"
                          if joint else "") + ". Training on a task none of whose groups carries a gradient changes "
             "nothing, under any recipe.", "",
             "| task | " + " | ".join(f"{a} alone" for a in agents) + (" | joint |" if joint else " |"),
             "|---|" + "---|" * (len(agents) + joint)]
    for lb in rows:
        maps = [by[(a, lb)]["sampled"]["correct"] for a in agents]
        k = by[(agents[0], lb)]["sampled"].get("samples", 4)
        cells = [f"{100 * signal_share(m, samples=k):.0f}" for m in maps]
        if joint:
            cells.append(f"{100 * signal_share(*maps, samples=k):.0f}")
        lines.append(f"| {lb} | " + " | ".join(cells) + " |")
    return lines


def summarize(out: Path) -> dict:
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    agents = sorted({c["agent"] for c in cells})
    labels = [lb for lb in CANDIDATES if any(c["label"] == lb for c in cells)]
    by = {(c["agent"], c["label"]): c for c in cells}
    meta = json.loads((out / "meta.json").read_text())
    lines = ["# Base accuracy on candidate reasoning-gym tasks", "",
             "Commands: " + ", ".join(f"`{c}`" for c in meta["commands"]), "",
             f"System prompt: `{meta['system_prompt']}`; at most {meta['max_new_tokens']} new tokens.", "",
             "Held-out items (generator seeds 0 … n−1), greedy avg@1 and avg@4 at temperature "
             f"{meta.get('temperature', 1.0):g}, %; "
             "`trunc` = share of sampled responses cut at the token limit, `no box` = sampled responses with no "
             "stated answer. A cell in the 5–60 % band for both models (avg@4) has headroom for both.", "",
             "| task | generator config | n | " + " | ".join(f"{a} greedy | {a} avg@4 | {a} trunc / no box"
                                                           for a in agents) + " |",
             "|---|---|---|" + "---|---|---|" * len(agents)]
    for lb in labels:
        gen, cfg = CANDIDATES[lb]
        row = [lb, "`" + json.dumps(cfg, separators=(",", ":")) + "`"]
        n = next(by[(a, lb)]["problems"] for a in agents if (a, lb) in by)
        row.append(str(n))
        for a in agents:
            c = by.get((a, lb))
            if c is None:
                row += ["–", "–", "–"]
                continue
            o = c["sampled"]["outcomes"]
            row += [f"{100 * c['greedy']['accuracy']:.1f}", f"{100 * c['sampled']['accuracy']:.1f}",
                    f"{100 * o.get('truncated', 0):.0f} / {100 * o.get('no_answer', 0):.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines += _signal_table(by, agents, labels)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    summary = {"agents": agents, "cells": {f"{a}--{lb}": {k: by[(a, lb)][k]["accuracy"] for k in ("greedy", "sampled")}
                                           for (a, lb) in by}}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "default.toml",
                        help="the pair: its agents' models, templates and devices (the system prompt is replaced)")
    parser.add_argument("--agents", default="", help="comma-separated agent names (default: all of --config)")
    parser.add_argument("--tasks", default="", help="comma-separated labels of CANDIDATES (default: all)")
    parser.add_argument("--problems", type=int, default=24, help="held-out items per task")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt", choices=sorted(PROMPTS), default="cot",
                        help="system prompt: cot (step by step, the default) or short (the answer alone)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of avg@4")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.summary_only:
        summarize(out)
        print((out / "results.md").read_text())
        return 0
    import torch

    from hacrl_fed.config import SimulateConfig, VerifierConfig, load_config
    from hacrl_fed.data.prompts import stop_strings
    from hacrl_fed.reward import Verifier
    from hacrl_fed.worker.engines import build_engine
    from hacrl_fed.worker.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, SimulateConfig)
    labels = [t.strip() for t in args.tasks.split(",") if t.strip()] or list(CANDIDATES)
    unknown = [t for t in labels if t not in CANDIDATES]
    if unknown:
        parser.error(f"unknown task label(s) {unknown}; choose from {', '.join(CANDIDATES)}")
    wanted = [a.strip() for a in args.agents.split(",") if a.strip()]
    (out / "cells").mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/task_baseline.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta_path = out / "meta.json"
    old = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    settings = {"system_prompt": PROMPTS[args.prompt], "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature}
    clash = [k for k, v in settings.items() if k in old and old[k] != v and not (k == "temperature" and v == 1.0)]
    if clash:
        parser.error(f"{out} holds cells made with other settings ({', '.join(clash)}); use another --out")
    commands = old.get("commands", [])
    meta_path.write_text(json.dumps({"commands": [*commands, command] if command not in commands else commands,
                                     **settings, "models": {a.name: a.model.name_or_path for a in cfg.agents}},
                                    indent=1))
    with Verifier.from_config(VerifierConfig(workers=1)) as verifier:
        for agent in cfg.agents:
            if wanted and agent.name not in wanted:
                continue
            todo = [lb for lb in labels if not (out / "cells" / f"{agent.name}--{lb}.json").exists()]
            if not todo:
                continue
            model_cfg = agent.model.model_copy(update={"system_prompt": PROMPTS[args.prompt]})
            lm = load_model(model_cfg)
            engine = build_engine(lm, model_cfg, stop_strings=stop_strings(lm.tokenizer, model_cfg.chat_template,
                                                                           model_cfg.stop),
                                  max_batch_sequences=32, work_dir=out, seed=0)
            for lb in todo:
                t = time.perf_counter()
                cell = run_cell(engine, lm, verifier, model_cfg, lb, args.problems, args.max_new_tokens,
                                args.temperature)
                cell["agent"] = agent.name
                (out / "cells" / f"{agent.name}--{lb}.json").write_text(json.dumps(cell, indent=1))
                print(f"[{agent.name} {lb}] greedy {100 * cell['greedy']['accuracy']:.1f} %, avg@4 "
                      f"{100 * cell['sampled']['accuracy']:.1f} %, {time.perf_counter() - t:.0f} s", flush=True)
                summarize(out)
            del engine, lm
    summarize(out)
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
