"""The ``latest`` pointer of a checkpoint directory names only a checkpoint inside it: an absolute path, a ``..``
path, a link out of the directory, a device or an endless file is not followed; the newest checkpoint inside is
used instead, with one warning naming the pointer (issue 25, D5). No model is loaded here."""

from __future__ import annotations

import json
import logging
import os

import pytest

from hacrl_fed.launch.client_cmd import _checkpoint_run
from hacrl_fed.checkpoints.store import CheckpointManager


def _fake(root, step, run_id):
    d = root / f"step-{step:08d}"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"format": 2, "step": step, "run_id": run_id, "lora": False}))
    return d


@pytest.fixture
def dirs(tmp_path):
    root = tmp_path / "site" / "checkpoints"
    own = _fake(root, 1, "mine")
    evil = _fake(tmp_path / "elsewhere", 9, "theirs")
    return root, own, evil


POINTERS = {
    "absolute": lambda root, evil: (root / "latest").write_text(f"{evil}\n"),
    "dotdot": lambda root, evil: (root / "latest").write_text(f"../../elsewhere/{evil.name}\n"),
    "link_to_a_dir_outside": lambda root, evil: ((root / evil.name).symlink_to(evil),
                                                 (root / "latest").write_text(f"{evil.name}\n")),
    "pointer_is_a_device": lambda root, evil: (root / "latest").symlink_to("/dev/zero"),
    "pointer_is_huge": lambda root, evil: (root / "latest").write_bytes(b"step-00000001" + b" " * (1 << 20)),
    "not_a_checkpoint_name": lambda root, evil: (root / "latest").write_text("state.json\n"),
}


@pytest.mark.parametrize("case", sorted(POINTERS))
def test_a_pointer_out_of_the_checkpoint_directory_is_not_followed(dirs, case, caplog):
    root, own, evil = dirs
    POINTERS[case](root, evil)
    mgr = CheckpointManager(root)
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"):
        assert mgr.latest() == own
    assert mgr.candidates() == [own] and mgr.checkpoints() == [own]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and str(root / "latest") in warnings[0] and "\n" not in warnings[0]
    assert _checkpoint_run(root) == ("mine", 1, own)


def test_a_plain_pointer_inside_is_followed_without_a_warning(dirs, caplog):
    root, own, _ = dirs
    newer = _fake(root, 2, "mine")
    (root / "latest").write_text("step-00000001\n")  # e.g. the newer one was written but not yet pointed at
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"):
        assert CheckpointManager(root).latest() == own
        assert CheckpointManager(root).candidates() == [own, newer]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (root / "latest").unlink()
    assert CheckpointManager(root).latest() == newer


def test_a_checkpoint_file_that_is_a_link_is_refused(load_tiny, tmp_path):
    from hacrl_fed.checkpoints.store import CheckpointError, TrainingState

    lm = load_tiny("tiny-llama-bpe")
    mgr = CheckpointManager(tmp_path / "ck")
    saved = mgr.save(lm.model, None, TrainingState(step=1, run_id="r"))
    copy = tmp_path / "elsewhere.safetensors"
    os.rename(saved / "model.safetensors", copy)
    (saved / "model.safetensors").symlink_to(copy)  # same bytes, same digest: still refused
    with pytest.raises(CheckpointError, match="model.safetensors.*link"):
        CheckpointManager.load(saved, lm.model)
