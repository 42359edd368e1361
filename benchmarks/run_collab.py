"""Collaboration benchmark: which recipe makes two heterogeneous agents better, paired over seeds and problems.

Recipes (all agents of a cell use the same one; equal rollout budget per prompt and agent, G =
``run.samples_per_prompt``; no KL term in any recipe):

* ``gspo``               — isolated: each agent trains on its own G;
* ``gspo_x2``            — isolated with 2G own rollouts (as many training rows as the sharing recipes);
* ``naive``              — the pooled rollouts, foreign rows used as if they were own;
* ``hacpo``              — the paper's HACPO (capability-aware advantages, ω, exponential IS, stepwise clip);
* ``hacpo_cross_family`` — HACPO with the cross ratio per byte of text, verified peer successes below the
  window kept at the edge weight and rows above it at weight 1 (docs/benchmarks.md "Cross-family collaboration");
* ``hacpo_cross_family_task`` — the same with ``algo.capability_scope = "task"`` (capability ratios per task).

Pairs (``--pair``): ``cross-family`` = ``examples/default.toml`` (SmolLM2-135M-Instruct + Gemma-3-270M);
``same-family`` = ``examples/same_family.toml`` (SmolLM2-135M-Instruct + a SmolLM2 checkpoint trained a few
steps further, the paper's heterogeneous-state setting; make the checkpoint first, see that file);
``tasks`` = ``examples/tasks.toml`` (the cross-family pair on the reasoning-gym task suite);
``episodes`` = ``examples/episodes.toml`` (multi-turn games); ``tiny``, ``tiny-tasks``, ``tiny-episodes`` = the
same on tiny local models (plumbing checks, not results). Ablations of ``tasks`` (``benchmarks/configs/``, not
examples): ``tasks-near-family`` holds ``basic_arithmetic`` out as a near family, ``tasks-families-trained`` trains
the two held-out families alone (docs/tasks.md, "What would move a held-out family").

On a task suite the evaluation sets are the held-out items of the trained tasks (``held_out``) and the held-out
task families (``families``); every problem's outcome is kept (``correct``, ``truncated``, ``no_answer``,
``wrong_answer``), so a gain is classified as format (before: truncated or no answer) or content (before: a
stated wrong answer), and results are given per task. The noise section states, per comparison with GSPO
(and GSPO×2, the paper's HACPO), the seed, problem and residual variance components of the paired differences and
the minimum detectable effect of the design (:mod:`hacrl_fed.report.stats`; intervals are t on the seeds' degrees
of freedom).

Each (recipe, seed) cell runs in one process through :mod:`inproc` (the production worker and coordinator
code without the Flower transport; models loaded once, reset to their initial weights per cell). Evaluation:
greedy avg@1 on the held-out split of the training distribution (``--eval-size`` problems, the same for every
seed) and on the same problems in other words (:func:`hacrl_fed.data.arithmetic.reword`), reported apart.
The "before" evaluation is shared by every cell (greedy decoding of the same weights).

Resumable: every finished cell is written to ``<out>/cells/<recipe>-s<seed>.json`` (commit them as they come)
and skipped on the next run; cells run seed-major, so an interrupted benchmark leaves every recipe with the
same seeds. ``--summary-only`` rebuilds ``results.md`` / ``results.json`` / ``collab.png`` from the cells.

This file is the command; its parts live in ``benchmarks/collab/`` (cells, evaluation, statistics, summary,
Markdown and plot, the results directory), and its names stay importable from here.

With a rollout-only contributor (``--contributor DIR_OR_URL``, docs/cross-vendor.md): every cell of the run has a
third site whose rollouts come from an OpenAI-compatible endpoint — a local model directory (an export with its
``hacrl_fed_prompt.json``) served by a ``transformers serve`` this script starts and stops (:mod:`contributor`),
or a URL with ``--contributor-api-model``. It generates each step, is validated, re-verified and counted in the
capability window by the coordinator's functions, its batch is pooled, and it never trains. Such cells are
recipe ``<recipe>+contrib`` (file ``<recipe>+contrib-s<seed>.json``, "… + contributor" in the tables) and record
the contributor (source, URL, model, prompt), its per-step acceptance and accuracy, and per learner and step the
contributor's rows that reached the learner's gradient (:func:`contributor_rows`). Run them into the directory
of the cells without a contributor: the summary pairs ``recipe+contrib`` with ``recipe`` by seed and problem.
``meta.json`` keeps the contributor; a directory never mixes two contributors (another source is refused).

    python benchmarks/run_collab.py --out benchmarks/results/collab-10step        # cross-family, 3 seeds × 10 steps
    python benchmarks/run_collab.py --pair same-family --out benchmarks/results/same-family-10step
    python benchmarks/run_collab.py --tiny --seeds 1 --steps 2 --out /tmp/collab-tiny   # plumbing check
    python benchmarks/run_collab.py --pair tasks --recipes hacpo_cross_family --contributor runs/<run>/smollm2/export \
        --out benchmarks/results/collab-tasks                                     # + a rollout-only site
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# The parts (benchmarks/collab/), re-exported: scripts and tests import them from here.
from collab.cells import (  # noqa: E402,F401
    _step_summary, contributor_rows, contributor_step, run_benchmark, run_cell)
from collab.evaluation import eval_sets_for, evaluate_before, evaluate_sets  # noqa: E402,F401
from collab.plot import plot  # noqa: E402,F401
from collab.recipes import (  # noqa: E402,F401
    ALGO, COLLABORATIVE, CONTRIB, CONTRIB_COUNTS, EVAL_SETS, LABELS, PAIRS, PAIRWISE_BASES, RECIPES, SET_TITLES,
    TWINS, base_recipe, eval_sets_of, label)
from collab.render import render_markdown  # noqa: E402,F401
from collab.results import (  # noqa: E402,F401
    check_contributor, check_engines, choose_engines, contributor_source, merge_meta, strong_accuracy, summarize)
from collab.scoring import (  # noqa: E402,F401
    OUTCOMES, accuracy, gain_kinds, has_rewards, is_correct, mean_reward, outcome_mix, reward_of)
from collab.stats import paired, paired_interval, paired_mde  # noqa: E402,F401
from collab.summary import (  # noqa: E402,F401
    contributor_site, contributor_summary, mechanism, own_gradient, summary_of)


def _cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="cross-family",
                        help="base config: " + "; ".join(f"{k} = {v}" for k, v in PAIRS.items())
                        + " (default: cross-family)")
    parser.add_argument("--tiny", action="store_true", help="same as --pair tiny: a plumbing check, not a result")
    parser.add_argument("--config", type=Path, help="base simulate config (overrides --pair)")
    parser.add_argument("--recipes", default="",
                        help="comma-separated (default: all; without the per-task recipe on single-task pairs)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=None,
                        help="held-out problems (per task on a task suite); default 64, or the config's on a task suite")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="B (default: the config's)")
    parser.add_argument("--samples-per-prompt", type=int, default=None, help="G (default: the config's)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--contributor", metavar="DIR_OR_URL",
                        help="add a rollout-only site to every cell: a local model directory (served here by "
                             "`transformers serve`; prompt from its hacrl_fed_prompt.json), an OpenAI-compatible "
                             "/v1 URL, or strong:P (benchmarks/strong_contributor.py: worked solutions right at "
                             "accuracy P, served here); its cells are <recipe>+contrib")
    parser.add_argument("--contributor-name", default="contributor", help="its agent name (default: contributor)")
    parser.add_argument("--contributor-api-model", metavar="NAME", help="the endpoint's model name (with a URL)")
    parser.add_argument("--contributor-api-key-env", metavar="VAR",
                        help="environment variable holding the endpoint's API key (with a URL)")
    parser.add_argument("--contributor-device", default="cpu", help="device of the served model (default: cpu)")
    parser.add_argument("--engine", metavar="NAME", help="every learner's rollout engine (model.engine: auto, hf, "
                        "loop, ct2, vllm or a registered one; docs/engines.md). Default: the engines recorded in "
                        "--out's meta.json when it holds results, else the config's model.engine (hf unless it "
                        "names another)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _cli()
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.summary_only:
        summarize(out)
        print((out / "results.md").read_text())
        return 0

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.protocol.keys import validate_agent_name

    pair = "tiny" if args.tiny else args.pair
    cfg = load_config(args.config or ROOT / PAIRS[pair], SimulateConfig)
    suite = cfg.run.data.source == "reasoning_gym"
    if args.eval_size is not None or not suite:
        cfg.run.data.eval_size = 64 if args.eval_size is None else args.eval_size
    if args.prompts_per_step:
        cfg.run.prompts_per_step = args.prompts_per_step
    if args.samples_per_prompt:
        cfg.run.samples_per_prompt = args.samples_per_prompt
    config_engines = {a.name: a.model.engine for a in cfg.agents}
    try:
        chosen = choose_engines(out / "meta.json", cfg, args.engine)
    except (ImportError, ValueError) as err:
        parser.error(f"--engine: {err}")
    for agent in cfg.agents:
        agent.model.engine = chosen.get(agent.name, agent.model.engine)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()] or [
        r for r in RECIPES if suite or r not in ALGO]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    if args.contributor:
        try:
            validate_agent_name(args.contributor_name)
        except ValueError as err:
            parser.error(f"--contributor-name: {err}")
        if args.contributor_name in {a.name for a in cfg.agents}:
            parser.error(f"--contributor-name {args.contributor_name!r} is a learner of the config; choose another")
        source = contributor_source(args.contributor)
        url = args.contributor.startswith(("http://", "https://"))
        try:
            strong = strong_accuracy(args.contributor) is not None
        except ValueError as err:
            parser.error(str(err))
        if strong and not suite:
            parser.error("--contributor strong:P answers reasoning_gym task suites only (--pair tasks, ...)")
        if url and not args.contributor_api_model:
            parser.error("--contributor URL needs --contributor-api-model NAME (the endpoint's model name)")
        if not url and not strong and not Path(source).is_dir():
            parser.error(f"--contributor {args.contributor}: neither an http(s) URL nor a model directory")
        try:
            check_contributor(out / "meta.json", args.contributor_name, source)
        except ValueError as err:
            parser.error(str(err))
    engines = {a.name: a.model.engine for a in cfg.agents}
    try:
        check_engines(out / "meta.json", engines, config_engines)
    except ValueError as err:
        parser.error(str(err))
    (out / "cells").mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/run_collab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command, "pair": pair, "steps": args.steps, "seeds": args.seeds,
            "prompts_per_step": cfg.run.prompts_per_step, "samples_per_prompt": cfg.run.samples_per_prompt,
            "eval_size": cfg.run.data.eval_size, "models": {a.name: a.model.name_or_path for a in cfg.agents},
            "config": str(args.config or PAIRS[pair]), "engines": engines}
    with contextlib.ExitStack() as stack:
        site = None
        if args.contributor:
            site = _add_contributor(stack, cfg, args, out)
            site["command"] = command
        meta = merge_meta(out / "meta.json", meta, site)
        run_benchmark(cfg, out, meta, recipes, args.seeds, args.steps, suite, site)
    summarize(out)
    print((out / "results.md").read_text())
    return 0


def _add_contributor(stack: contextlib.ExitStack, cfg, args, out: Path) -> dict:
    """Open the contributor of ``--contributor`` for the rest of the run (a local directory: its server is
    stopped when ``stack`` closes, SIGTERM included), append its rollout-only agent to ``cfg.agents``, and return
    its record (:meth:`contributor.Contributor.record`)."""
    from contributor import Contributor, contributor_agent, open_contributor, sigterm_as_interrupt

    stack.enter_context(sigterm_as_interrupt())
    print(f"[contributor] {args.contributor}: starting", flush=True)
    if (p := strong_accuracy(args.contributor)) is not None:
        from strong_contributor import serve_strong_contributor

        url = stack.enter_context(serve_strong_contributor(cfg.run.data, accuracy=p))
        c = Contributor(name=args.contributor_name, source=args.contributor, url=url, api_model="strong-contributor",
                        system_prompt=cfg.agents[0].model.system_prompt or "", stop=(), prompt_from="config",
                        served=False)
        cfg.agents.append(contributor_agent(c, verifier=cfg.agents[0].verifier))
        print(f"[contributor] {c.name}: the strong contributor at {url} (p = {p})", flush=True)
        return c.record()
    c = stack.enter_context(open_contributor(
        args.contributor, name=args.contributor_name, api_model=args.contributor_api_model,
        default_system_prompt=cfg.agents[0].model.system_prompt, top_k=cfg.run.sampling.top_k, log_dir=out,
        device=args.contributor_device))
    cfg.agents.append(contributor_agent(c, verifier=cfg.agents[0].verifier, api_key_env=args.contributor_api_key_env))
    print(f"[contributor] {c.name} at {c.url} (model {c.api_model}; prompt from {c.prompt_from})", flush=True)
    return c.record()


if __name__ == "__main__":
    raise SystemExit(main())
