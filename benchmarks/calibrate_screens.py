"""Calibration of the likelihood screens on real rows: where honest and poisoned rows sit for each learner.

For each learner of the pair (the default: SmolLM2-135M and Gemma-3-270m) it scores, teacher-forced with the
learner's own model exactly as its update does (re-tokenized with the learner's tokenizer and template
boundary, at the plan's temperature), the content tokens of:

* ``own``          — the learner's own rollouts (its screens' reference);
* ``cross``        — the other family's honest rollouts (what the screens must keep);
* ``self-inside`` / ``self-tail`` — a malicious copy of the learner (the attack benchmark's ``mallory``,
  ``--oracle``): every row made correct, the payload inside the reasoning / after the answer;
* ``cross-inside`` — the same payload inside the other family's rows (an attacker of the other family).

Per row it records ℓ (the likelihood screen's statistic, nats per byte of content,
:func:`hacrl_fed.screens.rules.per_byte_loglik`) and σ_k (:func:`span_surprise`, nats per token, for several
k), and the reward. The table
gives, per learner and class, percentiles of each statistic as a gap below the learner's own median
(positive = less likely than the learner's own text), and the share of rewarded rows each candidate margin
would screen: the false-positive rate on ``cross`` and the hit rate on the payload classes.

    nice -n 10 python benchmarks/calibrate_screens.py --prompts 8 --samples 4 --seeds 2 \\
        --out benchmarks/results/screen-calibration
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from attack_poison import PAIRS, build_plan, poison_text  # noqa: E402

SPANS = (4, 8, 16)
CLASSES = ("own", "cross", "self-inside", "self-tail", "cross-inside")
MARGINS = {"ll": (0.5, 1.0, 1.5, 2.0, 2.5), "span": (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)}


def span_surprise(token_logprobs: Sequence[float], span_tokens: int) -> float:
    """σ_k: the mean log-prob (nats per token) of the least likely run of ``span_tokens`` consecutive tokens.

    σ_k = min_i (1/k) Σ_{t=i}^{i+k−1} log π(y_t) over a row's content tokens (the learner's tokens of the
    response without its terminal EOS); a row of fewer than k tokens is one span (its mean). Returns NaN for
    no tokens and for a non-finite log-prob; ``span_tokens`` < 1: ``ValueError``. O(n), pure arithmetic.

    A candidate statistic for a payload inside fluent text (it barely moves the row's mean ℓ), measured and
    *not* used as a screen: on the default pair a learner's own temperature-1 rows hold runs as unlikely as
    the benchmark's payload (SmolLM2: payload rows σ_8 1.7 nats/token below its own median, honest Gemma-3
    rows 1.5 at the median and 3.7 at the 95th percentile; ``benchmarks/results/screen-calibration``), so
    no margin screens the payload without screening more honest cross-family rows. The phrase screen
    (:mod:`hacrl_fed.screens.phrases`) uses what does separate them: the payload recurs across prompts.
    """
    if span_tokens < 1:
        raise ValueError(f"span_tokens must be >= 1, got {span_tokens}")
    values = [float(v) for v in token_logprobs]
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    k = min(span_tokens, len(values))
    window = sum(values[:k])
    low = window
    for t in range(k, len(values)):
        window += values[t] - values[t - k]
        low = min(low, window)
    return low / k


class _Plans:
    """What :func:`attack_poison.build_plan` reads: the config and the federation's training problems."""

    def __init__(self, cfg, fed) -> None:
        self.cfg, self.fed = cfg, fed


def _poisoned(rollout, refs, variant: str):
    """A copy of ``rollout`` made correct (oracle short answer when it was wrong) with the payload ``variant``."""
    from hacrl_fed.v1 import rollout_pb2 as pb

    r = pb.Rollout()
    r.CopyFrom(rollout)
    if r.reward < 1.0:
        r.response_text = f"The answer is \\boxed{{{refs[r.prompt_id]}}}."
        r.finish_reason = pb.STOP
    r.response_text = poison_text(r.response_text, variant)
    r.reward = 1.0
    return r


def score_rows(worker, plan, rows_by_class: dict[str, list], cap: int) -> dict[str, list[dict]]:
    """Teacher-forced content-token log-probs of every rollout under ``worker``'s model → per-row statistics."""
    from hacrl_fed.screens.rules import per_byte_loglik
    from hacrl_fed.tokenization.views import foreign_row

    prompts = worker._render(plan.prompts)
    out: dict[str, list[dict]] = {}
    for cls, rollouts in rows_by_class.items():
        rows = [foreign_row(worker.tokenizer, prompts[r.prompt_id], r, "peer", cap,
                            separator=worker.trainer.response_separator) for r in rollouts]
        scored = worker.engine.score([row.prompt_ids for row in rows], [row.response_ids for row in rows],
                                     temperature=plan.sampling.temperature or 1.0)
        recs = []
        for r, row, (_, _, per_token) in zip(rollouts, rows, scored):
            content = list(per_token[:-1] if row.ends_with_eos else per_token)
            rec = {"prompt_id": r.prompt_id, "reward": float(r.reward), "tokens": len(content),
                   "bytes": int(row.content_bytes), "ll": per_byte_loglik(sum(content), row.content_bytes)}
            for k in SPANS:
                rec[f"span{k}"] = span_surprise(content, k)
            recs.append(rec)
        out[cls] = recs
    return out


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def summarize(rec: dict) -> str:
    lines = ["# Likelihood-screen calibration on real rows", "", f"`{rec['command']}`", "",
             f"Pair {', '.join(f'{a} ({m})' for a, m in rec['models'].items())}; {rec['rows_per_class']} rows per "
             f"class and learner; payload `{rec['payload']}`. Gap = the learner's own median − the row's value "
             "(positive: less likely than the learner's own text); ℓ in nats per byte, σ_k in nats per token.", ""]
    for learner, by_cls in rec["learners"].items():
        own = by_cls["own"]
        lines += [f"## Learner {learner}", "",
                  "| class | rows (rewarded) | ℓ gap p50 / p95 / max | " + " | ".join(
                      f"σ_{k} gap p50 / p95 / max" for k in SPANS) + " |",
                  "|---|---|---|" + "---|" * len(SPANS)]
        meds = {"ll": statistics.median(r["ll"] for r in own)}
        meds |= {f"span{k}": statistics.median(r[f"span{k}"] for r in own) for k in SPANS}
        for cls in CLASSES:
            rows = by_cls.get(cls, [])
            if not rows:
                continue
            cells = []
            for key in ("ll", *(f"span{k}" for k in SPANS)):
                gaps = [meds[key] - r[key] for r in rows]
                cells.append(f"{_pct(gaps, 0.5):+.2f} / {_pct(gaps, 0.95):+.2f} / {max(gaps):+.2f}")
            lines.append(f"| {cls} | {len(rows)} ({sum(r['reward'] > 0 for r in rows)}) | " + " | ".join(cells) + " |")
        lines += ["", f"Own medians: ℓ {meds['ll']:.3f}; " + "; ".join(
            f"σ_{k} {meds[f'span{k}']:.3f}" for k in SPANS) + ".", "",
            "Share of **rewarded** rows a margin screens (gap > margin):", "",
            "| statistic | margin | " + " | ".join(CLASSES) + " |", "|---|---|" + "---|" * len(CLASSES)]
        for key, margins in (("ll", MARGINS["ll"]), *((f"span{k}", MARGINS["span"]) for k in SPANS)):
            for m in margins:
                cells = []
                for cls in CLASSES:
                    rows = [r for r in by_cls.get(cls, []) if r["reward"] > 0]
                    cells.append(f"{100 * sum(meds[key] - r[key] > m for r in rows) / len(rows):.1f} %" if rows
                                 else "–")
                lines.append(f"| {'ℓ' if key == 'll' else 'σ_' + key[4:]} | {m:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="cross-family")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per plan")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--seeds", type=int, default=2, help="plans (one per seed)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.summary_only:
        text = summarize(json.loads((out / "rows.json").read_text()))
        (out / "results.md").write_text(text)
        print(text)
        return 0

    from attack_poison import PAYLOAD
    from inproc import Federation

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.data.sampler import PromptSampler
    from hacrl_fed.v1 import rollout_pb2 as pb

    cfg = load_config(ROOT / "examples" / PAIRS[args.pair], SimulateConfig)
    cfg.run.prompts_per_step, cfg.run.samples_per_prompt = args.prompts, args.samples
    fed = Federation(cfg, threads=args.threads)
    names = list(fed.workers)
    if len(names) != 2:
        parser.error(f"the pair must have two agents, {args.pair} has {len(names)}")
    learners: dict[str, dict[str, list[dict]]] = {n: {c: [] for c in CLASSES} for n in names}
    t0 = time.perf_counter()
    try:
        for seed in range(args.seeds):
            plan = build_plan(_Plans(cfg, fed), seed=seed, step=1,
                              problems=PromptSampler(fed.train_problems, args.prompts, seed=seed).next_batch())
            refs = {p.prompt_id: p.reference_answer for p in plan.prompts}
            batches = {}
            for n in names:
                t = time.perf_counter()
                batches[n] = list(pb.RolloutBatch.FromString(fed.workers[n].generate(plan).envelope.payload).rollouts)
                print(f"[seed {seed}] {n}: {len(batches[n])} rollouts in {time.perf_counter() - t:.0f} s", flush=True)
            for n in names:
                other = next(m for m in names if m != n)
                classes = {"own": batches[n], "cross": batches[other],
                           "self-inside": [_poisoned(r, refs, "inside") for r in batches[n]],
                           "self-tail": [_poisoned(r, refs, "tail") for r in batches[n]],
                           "cross-inside": [_poisoned(r, refs, "inside") for r in batches[other]]}
                for cls, recs in score_rows(fed.workers[n], plan, classes, 10**6).items():
                    learners[n][cls] += recs
    finally:
        fed.close()
    command = "python benchmarks/calibrate_screens.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rec = {"command": command, "models": {a.name: a.model.name_or_path for a in cfg.agents}, "payload": PAYLOAD,
           "rows_per_class": args.prompts * args.samples * args.seeds, "spans": list(SPANS),
           "seconds": time.perf_counter() - t0, "learners": learners}
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(rec, indent=1))
    text = summarize(rec)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
