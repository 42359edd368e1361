"""Base accuracy of the real models on candidate reasoning-gym tasks: the table the training mix is chosen from.

For every model of the pair and every candidate (task, level) of :data:`CANDIDATES`, the held-out items
(generator seeds ``0 … n−1``, exactly the held-out problems a ``reasoning_gym`` run evaluates) are answered
greedily (avg@1) and with K samples (``--samples``, default 4) at temperature T (``--temperature``, default 1;
avg@K), with the model's prompt and system prompt of ``--config``, verified as in training (math-verify for
numbers, the task's scorer otherwise; :mod:`hacrl_fed.data.tasks`). Besides accuracy each cell records why
responses failed: cut at the token limit, no box, a boxed wrong answer.

From the K samples the summary gives pass@k for k in :data:`PASS_KS` up to K (:func:`pass_at_k`, the unbiased
estimator of Chen et al. 2021, arXiv 2107.03374, eq. 1) and calls a (task, learner) one with headroom
(:func:`headroom`) when pass@16 > 0 (some sample right: a group of its own samples can carry a gradient) and
greedy and avg@K are below 60 % (not already solved).

Resumable: each finished (model, task, level) cell goes to ``<out>/cells/<agent>--<label>.json`` and is
skipped next time; ``--summary-only`` rebuilds ``results.md`` / ``results.json``.

    python benchmarks/task_baseline.py --out benchmarks/results/task-baseline               # both models
    python benchmarks/task_baseline.py --out /tmp/tb --agents smollm2 --tasks chain_sum-l1 --problems 4
    python benchmarks/task_baseline.py --out /tmp/tb16 --prompt short --max-new-tokens 32 --temperature 0.7 \
        --samples 16 --tasks chain_sum-l1                                                   # pass@1, @4, @16
"""

from __future__ import annotations

import argparse
import json
import math
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

SAMPLES_MIN, SAMPLES_MAX = 1, 64
"""Bounds of ``--samples`` (sampled responses per item): at least one, at most 64 (a cell of 24 items × 64
samples is already 1536 generations per model and task)."""

PASS_KS = (1, 4, 16)
"""The k of the pass@k columns; a cell reports those k ≤ its samples."""

HEADROOM_K = 16
"""The k of the headroom rule: pass@16 > 0."""

HEADROOM_MAX = 0.6
"""The accuracy (greedy and avg@K, a fraction) at or above which a task counts as already solved."""

DEFAULTS = {"temperature": 1.0, "samples": 4}
"""Settings an output directory's ``meta.json`` has when it lacks the key (directories from before the option)."""

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
             temperature: float = 1.0, samples: int = 4) -> dict:
    """One (model, task) cell: ``n`` held-out items of ``label`` answered greedily once (record ``greedy``) and
    ``samples`` times at ``temperature`` (record ``sampled``); each record holds ``correct`` (item id → right
    responses of its ``samples``), ``samples``, ``accuracy`` (a fraction), outcome shares, mean response tokens,
    an example and its seconds."""
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
    for name, size, temp in (("greedy", 1, 0.0), ("sampled", samples, temperature)):
        t = time.perf_counter()
        res = evaluate_items(engine, lm.tokenizer, verifier, items, samples=size,
                             sampling=Sampling(temperature=temp, max_new_tokens=max_new_tokens), seed=0,
                             system_prompt=model_cfg.system_prompt, template=model_cfg.chat_template,
                             max_prompt_tokens=model_cfg.max_prompt_tokens, chunk_prompts=max(1, 32 // size))
        kinds = [outcome(v, r, f) for x in res for v, r, f in zip(x.verdicts, x.reasons, x.finish_reasons)]
        out[name] = {"correct": {x.prompt_id: x.correct for x in res}, "samples": size,
                     "accuracy": sum(x.correct for x in res) / (size * len(res)),
                     "outcomes": {k: kinds.count(k) / len(kinds) for k in sorted(set(kinds))},
                     "tokens_mean": statistics.fmean(t for x in res for t in x.response_tokens),
                     "example": res[0].responses[0][:300], "seconds": time.perf_counter() - t}
    return out


def signal_share(*correct: dict[str, int], samples: int | tuple[int, ...] = 4) -> float:
    """Share of problems whose group carries a gradient: some of its samples right and some wrong.

    ``correct``: one map per agent, problem id → right samples of ``samples`` (the ``sampled`` record of a cell).
    ``samples``: the group size of every map, or one per map (cells of different ``--samples``). With one map
    it is that agent's group of its samples; with several, the joint group of all of them (the HACPO group, the
    paper's Eq. 6–7). Problems missing from a map count as all wrong. A group whose rewards are all equal has
    advantage 0 exactly, in GRPO, GSPO and HACPO alike (:func:`hacrl_fed.algo.advantages.group_advantages`), so
    this share bounds how much of a task a step can teach. Raises ``ValueError`` when ``samples`` is a tuple of
    another length than ``correct``.

    >>> signal_share({"a": 0, "b": 2, "c": 4})
    0.3333333333333333
    >>> signal_share({"a": 0, "b": 4}, {"a": 1, "b": 4})
    0.5
    >>> signal_share({"a": 16}, {"a": 0}, samples=(16, 4))
    1.0
    """
    sizes = (samples,) * len(correct) if isinstance(samples, int) else tuple(samples)
    if len(sizes) != len(correct):
        raise ValueError(f"{len(sizes)} group sizes for {len(correct)} maps")
    ids = sorted(set().union(*correct))
    if not ids:
        return 0.0
    full = sum(sizes)
    return sum(0 < sum(c.get(i, 0) for c in correct) < full for i in ids) / len(ids)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item: the probability that at least one of k samples drawn without replacement
    from its ``n`` samples, ``c`` of them right, is right: ``1 − C(n − c, k) / C(n, k)`` (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", arXiv 2107.03374, eq. 1; 1 when ``n − c < k``).

    Exact in integers up to the one division. Raises ``ValueError`` unless ``0 ≤ c ≤ n`` and ``1 ≤ k ≤ n``.

    >>> pass_at_k(4, 1, 2)      # 1 − C(3, 2) / C(4, 2) = 1 − 3/6
    0.5
    >>> pass_at_k(4, 1, 1), pass_at_k(16, 0, 16), pass_at_k(16, 1, 16)
    (0.25, 0.0, 1.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"right samples c must be in 0..n = {n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n = {n}, got {k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_pass_at_k(correct: dict[str, int], n: int, k: int) -> float:
    """pass@k of a task: the mean of :func:`pass_at_k` over its items. ``correct``: item id → right samples of
    ``n`` (a cell's ``sampled`` record). pass@1 is the task's avg@n. An empty map gives 0.0; errors as
    :func:`pass_at_k`.

    >>> task_pass_at_k({"a": 1, "b": 0}, 4, 2)
    0.25
    """
    if not correct:
        return 0.0
    return statistics.fmean(pass_at_k(n, c, k) for c in correct.values())


def cell_pass_at(sampled: dict) -> dict[int, float]:
    """pass@k, a fraction, for each k of :data:`PASS_KS` at most the record's samples. ``sampled``: a cell's
    ``sampled`` record (``correct`` and ``samples``; records written before ``--samples`` carry 4)."""
    n = int(sampled.get("samples", 4))
    return {k: task_pass_at_k(sampled["correct"], n, k) for k in PASS_KS if k <= n}


def headroom(cell: dict) -> bool | None:
    """Whether a (task, learner) cell has headroom: pass@16 > 0 at the cell's temperature (some item answered
    right at least once, so a group of the learner's own samples can carry a gradient) and both greedy accuracy
    and avg@K below :data:`HEADROOM_MAX` (the task is not already solved).

    With fewer than 16 samples pass@16 cannot be estimated: a cell with some right sample has headroom all the
    same (pass@16 ≥ pass@K > 0 for the true rates) unless it is solved, and one with none is ``None``
    (undecided: pass@16 may still be above 0).
    """
    g, s = cell["greedy"]["accuracy"], cell["sampled"]["accuracy"]
    if g >= HEADROOM_MAX or s >= HEADROOM_MAX:
        return False
    some_right = any(c > 0 for c in cell["sampled"]["correct"].values())
    if some_right:
        return True
    return False if int(cell["sampled"].get("samples", 4)) >= HEADROOM_K else None


def _signal_table(by: dict, agents: list[str], labels: list[str]) -> list[str]:
    """Rows of the gradient-signal table (:func:`signal_share`): per agent alone and, with two or more agents,
    the joint group; only tasks every agent has a cell of."""
    rows = [lb for lb in labels if all((a, lb) in by for a in agents)]
    if not rows:
        return []
    joint = len(agents) > 1
    ks = sorted({int(by[(a, lb)]["sampled"].get("samples", 4)) for a in agents for lb in rows})
    lines = ["", "## Groups that carry a gradient", "",
             "Share of the problems, %, whose sampled group has some right and some wrong responses (otherwise "
             "every advantage of the group is 0 and the task teaches nothing): each model's own group of its K = "
             + "/".join(map(str, ks)) + " samples (some right and some wrong of K)"
             + (", and the joint group of both models' samples, as HACPO forms it (the paper's Eq. 6–7)"
                if joint else "") + ". Training on a task none of whose groups carries a gradient changes "
             "nothing, under any recipe.", "",
             "| task | " + " | ".join(f"{a} alone" for a in agents) + (" | joint |" if joint else " |"),
             "|---|" + "---|" * (len(agents) + joint)]
    for lb in rows:
        maps = [by[(a, lb)]["sampled"]["correct"] for a in agents]
        sizes = tuple(int(by[(a, lb)]["sampled"].get("samples", 4)) for a in agents)
        cells = [f"{100 * signal_share(m, samples=k):.0f}" for m, k in zip(maps, sizes)]
        if joint:
            cells.append(f"{100 * signal_share(*maps, samples=sizes):.0f}")
        lines.append(f"| {lb} | " + " | ".join(cells) + " |")
    return lines


def _headroom_mark(h: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[h]


def summarize(out: Path) -> dict:
    """Write ``<out>/results.md`` and ``<out>/results.json`` from ``<out>/cells/*.json`` and ``<out>/meta.json``.

    Per (task, learner): greedy accuracy, pass@k for each k of :data:`PASS_KS` the cell's samples allow (pass@1
    = avg@K), the shares of sampled responses truncated / with no stated answer, and :func:`headroom`; then the
    gradient table (:func:`_signal_table`). Percentages in the markdown, fractions in the JSON, whose ``cells``
    map ``<agent>--<label>`` to ``greedy``, ``sampled`` (avg@K), ``samples`` (K), ``pass_at`` (``{"1": …,
    "4": …, "16": …}``, the k available) and ``headroom`` (true, false or null = undecided). Cells written
    before ``--samples`` (4 samples) read as K = 4. Raises ``FileNotFoundError`` without ``meta.json``.
    """
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    agents = sorted({c["agent"] for c in cells})
    labels = [lb for lb in CANDIDATES if any(c["label"] == lb for c in cells)]
    by = {(c["agent"], c["label"]): c for c in cells}
    meta = json.loads((out / "meta.json").read_text())
    sizes = sorted({int(c["sampled"].get("samples", 4)) for c in cells}) or [int(meta.get("samples", 4))]
    ks = [k for k in PASS_KS if k <= max(sizes)]
    kname = "/".join(map(str, sizes))
    pass_cols = [f"pass@{k}" + (f" (= avg@{kname})" if k == 1 else "") for k in ks]
    lines = ["# Base accuracy on candidate reasoning-gym tasks", "",
             "Commands: " + ", ".join(f"`{c}`" for c in meta["commands"]), "",
             f"System prompt: `{meta['system_prompt']}`; at most {meta['max_new_tokens']} new tokens.", "",
             f"Held-out items (generator seeds 0 … n−1), greedy avg@1 and {kname} samples per item at temperature "
             f"{meta.get('temperature', 1.0):g}, %: pass@k for k = {', '.join(map(str, ks))} (the unbiased "
             "estimator of Chen et al. 2021, arXiv 2107.03374, eq. 1, over the samples of each item; pass@1 is "
             "avg@K, a k above a cell's samples is `–`); `trunc` = share of sampled responses cut at the token "
             "limit, `no box` = sampled responses with no stated answer.", "",
             f"**Headroom** (`room`): pass@{HEADROOM_K} > 0 (some sample right, so a group of the learner's own "
             f"samples can carry a gradient) and greedy and avg@K both below {100 * HEADROOM_MAX:.0f} % (not "
             f"already solved). With fewer than {HEADROOM_K} samples a cell with a right sample counts as yes "
             f"(pass@{HEADROOM_K} ≥ pass@K > 0) and one with none is `?` (undecided). Tasks are chosen by "
             "this, per learner, not by greedy accuracy: a family a learner solves sometimes can carry a "
             "gradient.", "",
             "| task | generator config | n | " + " | ".join(
                 " | ".join([f"{a} greedy", *(f"{a} {p}" for p in pass_cols), f"{a} trunc / no box", f"{a} room"])
                 for a in agents) + " |",
             "|---|---|---|" + "---|" * ((len(ks) + 3) * len(agents))]
    for lb in labels:
        gen, cfg = CANDIDATES[lb]
        row = [lb, "`" + json.dumps(cfg, separators=(",", ":")) + "`"]
        n = next(by[(a, lb)]["problems"] for a in agents if (a, lb) in by)
        row.append(str(n))
        for a in agents:
            c = by.get((a, lb))
            if c is None:
                row += ["–"] * (len(ks) + 3)
                continue
            o = c["sampled"]["outcomes"]
            pk = cell_pass_at(c["sampled"])
            row += [f"{100 * c['greedy']['accuracy']:.1f}",
                    *(f"{100 * pk[k]:.1f}" if k in pk else "–" for k in ks),
                    f"{100 * o.get('truncated', 0):.0f} / {100 * o.get('no_answer', 0):.0f}",
                    _headroom_mark(headroom(c))]
        lines.append("| " + " | ".join(row) + " |")
    lines += _signal_table(by, agents, labels)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    summary = {"agents": agents, "temperature": meta.get("temperature", DEFAULTS["temperature"]),
               "cells": {f"{a}--{lb}": {"greedy": c["greedy"]["accuracy"], "sampled": c["sampled"]["accuracy"],
                                        "samples": int(c["sampled"].get("samples", 4)),
                                        "pass_at": {str(k): v for k, v in cell_pass_at(c["sampled"]).items()},
                                        "headroom": headroom(c)}
                         for (a, lb), c in by.items()}}
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
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of avg@K")
    parser.add_argument("--samples", type=int, default=4,
                        help=f"sampled responses per item, K ({SAMPLES_MIN}..{SAMPLES_MAX}; default 4): avg@K, "
                             "pass@1/4/16 up to K, the groups of the gradient table")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    if not SAMPLES_MIN <= args.samples <= SAMPLES_MAX:
        parser.error(f"--samples must be in {SAMPLES_MIN}..{SAMPLES_MAX}, got {args.samples}")
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
                "temperature": args.temperature, "samples": args.samples}
    # a meta.json without temperature / samples was written at their defaults (T = 1, 4 samples)
    clash = [k for k, v in settings.items()
             if old and (k in old or k in DEFAULTS) and old.get(k, DEFAULTS.get(k)) != v]
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
                                args.temperature, args.samples)
                cell["agent"] = agent.name
                (out / "cells" / f"{agent.name}--{lb}.json").write_text(json.dumps(cell, indent=1))
                pk = cell_pass_at(cell["sampled"])
                print(f"[{agent.name} {lb}] greedy {100 * cell['greedy']['accuracy']:.1f} %, "
                      + ", ".join(f"pass@{k} {100 * v:.1f} %" for k, v in pk.items())
                      + f" ({args.samples} samples), {time.perf_counter() - t:.0f} s", flush=True)
                summarize(out)
            del engine, lm
    summarize(out)
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
