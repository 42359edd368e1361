"""Issue 25 D3: a Checkpoint request's path stays inside the site's directories and replaces nothing else."""

from __future__ import annotations

import os

import pytest

from hacrl_fed.checkpoints.store import confined_path


@pytest.fixture
def site(tmp_path):
    """``<tmp>/out/alice`` (the site) with its checkpoints, an exported model, a checkpoint and other files."""
    root = tmp_path / "out" / "alice"
    ckpt = root / "checkpoints"
    (ckpt / "step-00000001").mkdir(parents=True)
    (ckpt / "step-00000001" / "state.json").write_text("{}")
    (ckpt / "vllm").mkdir()
    (ckpt / "vllm" / "work").write_text("x")
    (root / "export").mkdir()
    (root / "export" / "config.json").write_text("{}")
    (root / "logs").mkdir()
    (root / "logs" / "worker.log").write_text("log")
    (root / "worker.token").write_text("secret")
    (root / "empty").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return root, ckpt


def _ok(requested, site, *, export):
    root, ckpt = site
    return confined_path(requested, [root, ckpt], export=export, checkpoints=ckpt)


def _refused(requested, site, *, export, match):
    with pytest.raises(ValueError, match=match):
        _ok(requested, site, export=export)


def test_paths_inside_the_site_are_accepted(site):
    root, ckpt = site
    assert _ok("new-export", site, export=True) == root.resolve() / "new-export"          # relative: from the site
    assert _ok(str(root / "export"), site, export=True) == root.resolve() / "export"      # a previous export
    assert _ok("empty", site, export=False) == root.resolve() / "empty"
    assert _ok("saves/step-5", site, export=False) == root.resolve() / "saves" / "step-5"
    assert _ok(str(ckpt / "exports" / "a"), site, export=True) == ckpt.resolve() / "exports" / "a"


@pytest.mark.parametrize("requested, match", [
    ("/etc/cron.d/x", "outside this site's directories"),
    ("../bob/checkpoints", "'..'"),
    ("logs/../../bob", "'..'"),
    ("", "would replace this site's directory"),
    (".", "would replace this site's directory"),
    ("checkpoints", "would replace this site's directory"),
    ("logs", "exists and is not a checkpoint"),
    ("worker.token", "exists and is not a checkpoint"),
    ("checkpoints/mine", "inside the checkpoint directory"),
    ("checkpoints/step-00000001", "inside the checkpoint directory"),
    ("bad\nname", "unprintable"),
    ("x" * 5000, "more than"),
])
def test_a_save_elsewhere_is_refused(site, requested, match):
    _refused(requested, site, export=False, match=match)


def test_an_export_over_other_files_or_outside_is_refused(site, tmp_path):
    root, _ = site
    _refused("logs", site, export=True, match="not an exported model")
    _refused("checkpoints/vllm", site, export=True, match="not an exported model")
    _refused("checkpoints/step-00000001", site, export=True, match="not an exported model")
    _refused(str(tmp_path / "elsewhere" / "model"), site, export=True, match="outside")
    _refused(str(tmp_path / "out"), site, export=True, match="outside")


def test_links_out_of_the_site_are_refused(site, tmp_path):
    root, _ = site
    os.symlink(tmp_path / "elsewhere", root / "link")
    _refused("link", site, export=True, match="is a link")
    _refused("link/model", site, export=True, match=r"outside this site's directories")
    os.symlink(root / "empty", root / "inner")
    _refused("inner", site, export=False, match="is a link")          # a link is never replaced
