"""Replay a learner's text screens on an attack benchmark's cached frozen batches (no model, no training: seconds).

What the victim's screens (default ``ScreenConfig``) do, step by step, to the honest peer's and the malicious
site's rows of ``benchmarks/attack_poison.py`` for every variant: rows left out, rows with a key / phrase / tail
cut, and mallory's rows that still hold the variant's key after the screens. The victim's own samples are not
cached; mallory's *clean* batch stands in for them (mallory is a copy of the victim's initial model, sampled for
the same plan), so this is the victim before any drift.

Peer distillation (``algo.peer_distill_coef`` > 0, :mod:`hacrl_fed.algo.peer_distill`) trains a supervised term on
the foreign rows above their group's baseline after the screens. The replay counts, per variant, mallory's rows
that term would take (kept by the screens, reward above the group's mean reward over the victim's own rows and
every kept foreign row: the HACPO baseline at equal capabilities) and those of them that still hold the variant's
key: what an adaptive peer can reach through the term is bounded by what the screens let through. The real cells of ``attack_poison.py`` measure emission
after training; this measures the screens' decisions on the same texts, for every variant, in seconds.

    python benchmarks/replay_screens.py --cache benchmarks/results/poison-adaptive/gen-cache --steps 6 \\
        --out benchmarks/results/poison-adaptive/replay.md
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attack_poison as ap  # noqa: E402


def _batch(cache: Path, name: str, step: int):
    from hacrl_fed.v1 import rollout_pb2 as pb

    rec = json.loads((cache / f"{name}-s0-t{step}.json").read_text())
    return pb.RolloutBatch.FromString(base64.b64decode(rec["batch"]))


def _plan(step: int, problems, batch):
    """The fields of the step's RoundPlan that :func:`attack_poison.poison_batch` reads, in the batch's prompt order."""
    from types import SimpleNamespace

    from hacrl_fed.v1 import rollout_pb2 as pb

    refs = {p.id: p.answer for p in problems}
    order = list(dict.fromkeys(r.prompt_id for r in batch.rollouts))
    if set(order) != set(refs):
        raise ValueError(f"step {step}: the cached batch's prompts are not the seeded sampler's")
    return SimpleNamespace(step=step, sampling=SimpleNamespace(max_new_tokens=0),
                           prompts=[pb.PromptItem(prompt_id=p, reference_answer=refs[p]) for p in order])


def replay(variant: str, cache: Path, steps: int, honest: str, problems_by_step) -> dict[str, float]:
    """Totals over ``steps`` of what the default screens did to ``honest``'s and mallory's rows for ``variant``."""
    from hacrl_fed.screen_config import ScreenConfig
    from hacrl_fed.screens import SiteGuard

    g = SiteGuard("victim", ScreenConfig())
    tot: collections.Counter = collections.Counter()
    keys = [ap.marker(v) for v in ap.MIX] if variant == "mix" else [ap.marker(variant)]
    for step in range(1, steps + 1):
        problems = problems_by_step[step - 1]
        clean, peer = _batch(cache, ap.ATTACKER, step), _batch(cache, honest, step)
        plan = _plan(step, problems, clean)
        bad, n = ap.poison_batch(clean, plan, variant, oracle=True)
        own = {(r.prompt_id, r.sample_index): r.response_text for r in clean.rollouts}
        g.begin_step(step, own)
        out = g.screen_text({honest: list(peer.rollouts), ap.ATTACKER: list(bad.rollouts)}, own,
                            prompt_texts={p.id: p.problem for p in problems})
        metrics, _ = g.finish_step([honest, ap.ATTACKER])
        tot["poisoned"] += n
        for who, src in (("honest", honest), ("mallory", ap.ATTACKER)):
            for k in ("screen_rows", "screened_out", "screened_key_cut", "screened_phrase_cut", "screened_tail_cut"):
                tot[f"{who}/{k}"] += metrics.get(f"src/{src}/{k}", 0.0)
        kept = out.get(ap.ATTACKER, [])
        tot["mallory/key_left"] += sum(any(k in r.response_text for k in keys) for r in kept)
        distilled = distilled_rows(kept, [*clean.rollouts, *out.get(honest, []), *kept])
        tot["mallory/distilled"] += len(distilled)
        tot["mallory/key_left_distilled"] += sum(any(k in r.response_text for k in keys) for r in distilled)
    return dict(tot)


def distilled_rows(rows, group_rows) -> list:
    """The ``rows`` whose reward is above their group's baseline: the mean reward of ``group_rows`` (the learner's own
    rows and every kept foreign row) with the same prompt id — the rows the peer distillation term would take."""
    by_prompt: dict[str, list[float]] = collections.defaultdict(list)
    for r in group_rows:
        by_prompt[r.prompt_id].append(float(r.reward))
    return [r for r in rows if float(r.reward) > sum(by_prompt[r.prompt_id]) / len(by_prompt[r.prompt_id])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="an attack_poison.py gen-cache (seed 0)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4, help="B of the cached run")
    parser.add_argument("--honest", default="gemma3")
    parser.add_argument("--variants", default=",".join(ap.VARIANTS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.data.datasets import load_problems
    from hacrl_fed.data.sampler import PromptSampler

    cfg = load_config(ROOT / "examples" / "default.toml", SimulateConfig)
    cfg.run.data.eval_size = 32
    sampler = PromptSampler(load_problems(cfg.run.data)[0], args.prompts, seed=0)
    problems_by_step = [sampler.next_batch() for _ in range(args.steps)]
    lines = ["# Screens replayed on the cached batches", "",
             f"`python benchmarks/replay_screens.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             "Default screens; the victim's own samples: mallory's clean batch (the victim's initial model). "
             "Rows over all steps; honest = the honest peer's rows (left out / key-cut / phrase-cut / tail-cut); "
             "key left = mallory's rows trained with the variant's key still in them; distilled = mallory's rows the "
             "peer distillation term would take (kept, above the group's baseline), key left distilled = those of "
             "them with the key.", "",
             "| variant | mallory's poisoned rows | key left | mallory left out | honest rows | honest left out "
             "| honest key cut | honest phrase cut | honest tail cut | mallory distilled | key left distilled |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in [x.strip() for x in args.variants.split(",") if x.strip()]:
        t = replay(v, args.cache, args.steps, args.honest, problems_by_step)
        seen = max(1.0, t["honest/screen_rows"])
        lines.append(f"| {v} | {t['poisoned']} | {t['mallory/key_left']:.0f} | {t['mallory/screened_out']:.0f} | "
                     f"{t['honest/screen_rows']:.0f} | {t['honest/screened_out']:.0f} "
                     f"({100 * t['honest/screened_out'] / seen:.1f} %) | {t['honest/screened_key_cut']:.0f} "
                     f"({100 * t['honest/screened_key_cut'] / seen:.1f} %) | {t['honest/screened_phrase_cut']:.0f} | "
                     f"{t['honest/screened_tail_cut']:.0f} | {t['mallory/distilled']:.0f} | "
                     f"{t['mallory/key_left_distilled']:.0f} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
