"""Steps of a site's training with checkpoints, single-process or sharded over 2 processes (``ShardedSite``: this
process is rank 0 and starts rank 1 itself). Run by test_checkpoints.py:

``python site_steps.py MODE MODEL_DIR PEER_DIR CKPT_DIR OUT [STEPS]``

MODE ``plain``: the plain update (one process); ``sharded``: 2 processes; ``kill-save``: 2 processes, one update,
save, then a second update whose save loses rank 1 (SIGKILL while rank 0 writes its shard), then restart and resume.
Each mode resumes the newest checkpoint in CKPT_DIR, trains STEPS steps (saving after each) and writes
``{"params", "step", ...}`` to OUT.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_ranks import rows_and_settings  # noqa: E402

from hacrl_fed.checkpoints.store import CheckpointManager, TrainingState  # noqa: E402


def main() -> None:
    mode, model_dir, peer_dir, ckpt, out = sys.argv[1:6]
    steps = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    from hacrl_fed.update.loop import hacpo_update, make_optimizer

    model, tok, rows, adv, ratios, algo, optim = rows_and_settings(model_dir, peer_dir)
    result: dict = {}
    if mode == "plain":
        optimizer = make_optimizer(model, optim)
        manager, update, train_model, site = CheckpointManager(ckpt), hacpo_update, model, None
    else:
        from hacrl_fed.distributed.checkpoint import ShardedCheckpoints
        from hacrl_fed.distributed.site import ShardedSite

        site = ShardedSite(model, world_size=2, optim=optim, timeout_s=float(os.environ.get("COLLECTIVE_S", "120")))
        manager, update = ShardedCheckpoints(ckpt, site), site.update
    found = manager.load_latest(model, site.optimizer if site else optimizer)
    step = found[1].step if found else 0
    result["resumed_from"] = step

    def train_one() -> None:
        nonlocal step
        step += 1
        m, o = (site.model, site.optimizer) if site else (model, optimizer)
        update(m, o, rows, adv, ratios, algo, optim, learner="a", pad_id=tok.pad_token_id)
        manager.save(model, o, TrainingState(step=step, run_id="r"))

    for _ in range(steps):
        train_one()
    if mode == "kill-save":
        import torch.distributed.checkpoint as dcp

        from hacrl_fed.distributed.group import RankFailure

        result["saved_weights"] = {k: v.clone() for k, v in model.state_dict().items()}
        writer_write = dcp.FileSystemWriter.write_data

        def write_then_lose_rank_1(self, plan, planner):
            os.kill(site.procs[0].pid, signal.SIGKILL)
            return writer_write(self, plan, planner)

        dcp.FileSystemWriter.write_data = write_then_lose_rank_1
        try:
            train_one()
        except RankFailure as err:
            result["failure"] = str(err)
        dcp.FileSystemWriter.write_data = writer_write
        result["rank_codes"] = [p.poll() for p in site.procs]
        result["listing"] = sorted(p.name for p in Path(ckpt).iterdir())
        site.restart()
        found = manager.load_latest(model, site.optimizer)
        result["resumed_after_failure"] = found[1].step
        step = found[1].step
        result["restored"] = {k: v.clone() for k, v in model.state_dict().items()}
        train_one()
    result["step"] = step
    result["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if site is not None:
        from hacrl_fed.checkpoints.store import export_hf

        export_hf(model, tok, Path(out).with_suffix(".export"))
        site.close()
        result["rank_codes_after_close"] = [p.poll() for p in site.procs]
    torch.save(result, out)


if __name__ == "__main__":
    main()
