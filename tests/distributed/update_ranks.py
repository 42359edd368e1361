"""One HACPO update on a tiny model, run by each rank of a process group (spawned by test_equal_update.py).

``python update_ranks.py MODEL_DIR PEER_DIR OUT`` with the ``HACRL_DIST_*`` environment of
:func:`hacrl_fed.distributed.group.rank_env`; world size 1 runs the plain single-process update instead.
Rank 0 writes ``{"metrics": ..., "params": full weights}`` to OUT (torch.save).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "algo"))


def rows_and_settings(model_dir: str, peer_dir: str):
    """Own rows of learner "a" and rows from "b" (another tokenizer family), advantages, ratios and settings."""
    from algo_testkit import as_foreign, make_agent_rows
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacrl_fed.algo.advantages import row_advantages
    from hacrl_fed.algo.config import AlgoConfig
    from hacrl_fed.config import OptimConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    peer = AutoModelForCausalLM.from_pretrained(peer_dir, dtype=torch.float32)
    peer_tok = AutoTokenizer.from_pretrained(peer_dir)
    own = [r for r, _ in make_agent_rows("a", model, tok, n_prompts=2, g=3)]
    foreign = as_foreign(make_agent_rows("b", peer, peer_tok, n_prompts=2, g=3, seed=1), tok, "b")
    rows, ratios = own + foreign, {"b": 1.5}
    algo = AlgoConfig(kl_coef=0.0)
    optim = OptimConfig(lr=1e-3, mini_batch_rows=int(os.environ.get("MB", "6")), micro_batch_tokens=128, grad_clip=float(os.environ.get("CLIP", "0.5")))
    return model, tok, rows, row_advantages(rows, ratios, algo, learner="a"), ratios, algo, optim


def main() -> None:
    model_dir, peer_dir, out = sys.argv[1:4]
    rank, world = int(os.environ.get("HACRL_DIST_RANK", "0")), int(os.environ.get("HACRL_DIST_WORLD", "1"))
    if world == 1:
        from hacrl_fed.update.loop import hacpo_update, make_optimizer

        model, tok, rows, adv, ratios, algo, optim = rows_and_settings(model_dir, peer_dir)
        metrics = hacpo_update(model, make_optimizer(model, optim), rows, adv, ratios, algo, optim, learner="a",
                               pad_id=tok.pad_token_id)
        torch.save({"metrics": metrics, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}},
                   out)
        return
    from hacrl_fed.distributed.group import broadcast, init_group
    from hacrl_fed.distributed.ranks import RankState, Setup, UpdateJob

    env = os.environ
    if rank == 0:   # the slow part before the group forms: no collective waits for it
        model, tok, rows, adv, ratios, algo, optim = rows_and_settings(model_dir, peer_dir)
    mesh = init_group(rank, world, env["HACRL_DIST_ADDR"], int(env["HACRL_DIST_PORT"]), "cpu",
                      float(env.get("HACRL_DIST_TIMEOUT_S", "60")))
    if rank == 0:
        setup = broadcast(Setup(model.config, torch.float32, "cpu", "none", optim))
        state = RankState(setup, mesh, model.state_dict())
        job = broadcast(UpdateJob(rows, adv, ratios, algo, optim, {"learner": "a", "pad_id": tok.pad_token_id},
                                  gated=False, train_mode=False, rng_state=torch.get_rng_state()))
    else:
        state = RankState(broadcast(), mesh, None)
        job = broadcast()
    metrics = state.update(job)
    full = state.gather()
    if rank == 0:
        torch.save({"metrics": metrics, "params": full}, out)
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
