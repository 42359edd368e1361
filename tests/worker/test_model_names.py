"""Unknown ``--model`` names fail at once with one line; hub ids never wait for download retries."""

from __future__ import annotations

import time

import pytest
from huggingface_hub import constants

from hacrl_fed.worker import models
from hacrl_fed.worker.models import ModelNotFoundError, check_model_name, known_aliases, resolve_model_source


@pytest.mark.parametrize("name", ["./models/nope", "../nope", "/no/such/model", "~/no-such-model-dir", "a/b/c",
                                  "missing.gguf", "not a model"])
def test_path_like_names_that_do_not_exist_fail_in_one_line(name, monkeypatch):
    monkeypatch.setattr(models, "_hub_unreachable", lambda *a: pytest.fail("no hub probe for a local path"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_source(name)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"no such model directory or file: {name} ")
    assert all(alias in message for alias in known_aliases())
    with pytest.raises(ModelNotFoundError):
        check_model_name(name)


def test_hub_id_with_the_hub_unreachable_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    t0 = time.monotonic()
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_source("some-org/some-model")
    assert time.monotonic() - t0 < models.HUB_PROBE_TIMEOUT_S + 2
    message = str(err.value)
    assert "\n" not in message and "'some-org/some-model'" in message and "unreachable" in message
    assert "tiny-llama-bpe" in message and "local model directory" in message


def test_hub_id_offline_uses_the_cached_snapshot_without_probing(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(models, "_hub_unreachable", lambda *a: pytest.fail("offline mode must not probe the hub"))
    with pytest.raises(ModelNotFoundError, match="offline"):
        check_model_name("some-org/some-model")
    repo = tmp_path / "hf" / "models--some-org--some-model"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    src = resolve_model_source("some-org/some-model", gguf_file="m.gguf")
    assert (src.path, src.gguf_file) == (str(snapshot.resolve()), "m.gguf")


def test_hub_id_with_a_reachable_hub_is_left_to_transformers(monkeypatch):
    probes = []
    monkeypatch.setattr(models, "_hub_unreachable", lambda *a: probes.append(1))
    src = resolve_model_source("Qwen/Qwen3-1.7B")
    assert src.path == "Qwen/Qwen3-1.7B" and probes == [1]


def test_aliases_and_existing_paths_pass_the_check(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_hub_unreachable", lambda *a: pytest.fail("no hub probe"))
    check_model_name("tiny-llama-bpe")
    check_model_name(str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    check_model_name(str(tmp_path / "m.gguf"))


def test_one_process_probes_the_hub_once_for_a_check_and_the_load(monkeypatch, tmp_path):
    """``eval`` checks the name, then loads: with the hub unreachable and the model not cached, both fail from one
    probe; after HUB_PROBE_MEMO_S the hub is asked again."""
    from huggingface_hub import utils as hub_utils

    heads = []

    class Refusing:
        def head(self, url, timeout):
            heads.append(url)
            raise ConnectionError("refused")

    monkeypatch.setattr(hub_utils, "get_session", lambda: Refusing())
    monkeypatch.setattr(constants, "ENDPOINT", "http://hub.invalid")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(models, "_hub_probes", {})
    with pytest.raises(ModelNotFoundError, match="unreachable"):
        check_model_name("some-org/some-model")
    with pytest.raises(ModelNotFoundError, match="unreachable"):
        resolve_model_source("some-org/some-model")
    assert heads == ["http://hub.invalid"]
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + models.HUB_PROBE_MEMO_S + 1)
    with pytest.raises(ModelNotFoundError):
        resolve_model_source("some-org/some-model")
    assert len(heads) == 2
