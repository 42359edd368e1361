"""A rank of a site's sharded trainer dies or hangs: the step fails with the cause within the collective timeout,
every rank is stopped, the site restarts its ranks from its newest checkpoint and trains on; none is left running."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest
import torch

from hacrl_fed.config import TrainerConfig
from hacrl_fed.distributed.group import RankFailure
from hacrl_fed.v1 import worker_pb2 as wpb

_spec = importlib.util.spec_from_file_location("worker_conftest", Path(__file__).parents[1] / "worker" / "conftest.py")
wc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wc)


@pytest.fixture
def site_worker(tmp_path):
    from hacrl_fed.reward import Verifier

    with Verifier(timeout_s=30, workers=1) as verifier:
        sites = wc.Sites(tmp_path, str(tmp_path / "cache"), verifier, {"a": "tiny-llama-bpe"},
                         trainer=TrainerConfig(world_size=2, timeout_s=60))
        worker = sites.start("a")
        yield worker
        procs = list(worker.checkpoints.site.procs)
        sites.close()
        assert all(p.poll() is not None for p in procs)       # closing the worker stopped its ranks


def _train(worker, step: int):
    plan = wc.make_plan(step, prompts=2, g=2, max_new_tokens=6)
    env = worker.generate(plan).envelope
    return wpb.TrainRequest(run_id=plan.run_id, step=step, plan=plan, envelopes=[env],
                            capabilities=wc.make_table(plan, {"a": 0.5}, warmup=True))


def _weights(worker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.model.state_dict().items()}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_failed_rank_fails_the_step_and_the_site_resumes_its_checkpoint(site_worker, how):
    worker = site_worker
    site = worker.checkpoints.site
    worker.train(_train(worker, 1))
    worker.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    saved = _weights(worker)
    request = _train(worker, 2)
    rank1 = site.procs[0]
    os.kill(rank1.pid, getattr(signal, how))
    with pytest.raises(RankFailure) as failure:
        worker.train(request)
    if how == "SIGKILL":
        assert f"rank 1 (pid {rank1.pid}) was killed by SIGKILL" in str(failure.value)
    else:   # a hung rank: the collective timeout (60 s) ends the step
        assert "in update" in str(failure.value) and "timed out" in str(failure.value).lower(), str(failure.value)
    assert rank1.poll() is not None                              # the failed rank is not left running
    assert worker.trainer.step == 1                              # resumed its newest checkpoint
    for name, value in saved.items():
        torch.testing.assert_close(worker.model.state_dict()[name], value, atol=0, rtol=0)
    assert site.procs[0] is not rank1 and site.procs[0].poll() is None   # a new rank 1
    report = worker.train(_train(worker, 2))                    # the site trains on from the checkpoint
    assert report.step == 2 and worker.trainer.step == 2
