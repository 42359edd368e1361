"""Atomic checkpoints with exact resume, and export of the policy as a plain Hugging Face directory.

A checkpoint is a directory ``<root>/step-<NNNNNNNN>/`` holding

* ``model.safetensors`` (full fine-tuning) or ``adapter.safetensors`` (LoRA: adapter weights only),
* ``optimizer.pt`` (AdamW state), ``rng.pt`` (python, numpy, torch CPU and CUDA generator states),
* ``state.json``: step, run id, the capability view (last ``CapabilityTable``, base64 protobuf),
  model fingerprint, any extra JSON the worker adds, the size and SHA-256 of every other file, and a
  SHA-256 of its own content.

A site trained over N processes writes the weights and AdamW state as ``torch.distributed.checkpoint`` files instead
(``"sharded": N`` in ``state.json``; :mod:`hacrl_fed.checkpoints.sharded`, :mod:`hacrl_fed.distributed.checkpoint`);
:meth:`CheckpointManager.load` reads them into a single process too.

It is written into a temporary sibling directory, every file and the directory are fsynced, and
the directory is renamed into place; ``<root>/latest`` (written with tmp file + ``os.replace``)
names the newest one. A crash leaves either the old or the new checkpoint, never a mix
(ARCHITECTURE §8 "Resume"). Only the last ``keep_last`` checkpoints are kept.

Loading verifies before it touches the model: every file must have its recorded size and SHA-256
(a truncated or bit-flipped file is named in a one-line :class:`CheckpointError`), and after loading
the model's fingerprint must equal the recorded one. :meth:`CheckpointManager.load_latest` falls back
to the newest intact checkpoint with a one-line warning naming each unusable one.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hacrl_fed.atomic import atomic_write_text, fsync_dir, outside, read_bounded

__all__ = ["CheckpointError", "CheckpointManager", "TrainingState", "confined_path", "export_hf", "get_rng_state",
           "set_rng_state"]

log = logging.getLogger("hacrl_fed.worker")

FORMAT_VERSION = 2
"""2: per-file sizes and SHA-256 digests and a digest of ``state.json`` (1: none; still loaded, fingerprint-checked)."""
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
MAX_POINTER_BYTES = 4096
"""Largest ``latest`` pointer read (it holds one directory name)."""
MAX_META_BYTES = 64 << 20
"""Largest checkpoint ``state.json`` read."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, or does not match the model it is loaded into."""


@dataclass
class TrainingState:
    """What besides weights and optimizer a resume needs."""

    step: int
    run_id: str
    capability: bytes = b""
    """Serialized last ``CapabilityTable`` the worker trained with (empty: none yet)."""
    fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def get_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU + every CUDA device) generator states, as tensors and plain types."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": (version, torch.tensor(mt, dtype=torch.int64), gauss),
        "numpy": (np_name, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos), int(np_has_gauss), float(np_gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`get_rng_state` output."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in mt.tolist()), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in path.rglob("*")} | {path}):
        fsync_dir(d)


def _install_dir(tmp: Path, final: Path) -> None:
    """fsync ``tmp`` and rename it to ``final`` (an existing ``final`` is moved aside, then removed)."""
    _fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _is_lora(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


class CheckpointManager:
    """Saves and restores checkpoints under ``root``; keeps the newest ``keep_last``."""

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    def save(self, model, optimizer, state: TrainingState, path: str | Path | None = None) -> Path:
        """Write a checkpoint atomically and return its directory (``root/step-NNNNNNNN`` by default).

        Raises ``OSError`` when writing fails (the previous checkpoint stays intact).
        """
        final = Path(path) if path else self.root / f"step-{state.step:08d}"
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            self._write(tmp, model, optimizer, state)
            _install_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.parent == self.root:
            self._write_latest(final.name)
            self._prune()
        return final

    def _write(self, d: Path, model, optimizer, state: TrainingState) -> None:
        from safetensors.torch import save_file, save_model

        if _is_lora(model):
            from peft import get_peft_model_state_dict

            weights = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
            save_file(weights, str(d / "adapter.safetensors"))
        else:
            save_model(model, str(d / "model.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), d / "optimizer.pt")
        self._write_meta(d, state, lora=_is_lora(model))

    @staticmethod
    def _write_meta(d: Path, state: TrainingState, *, lora: bool, sharded: int = 0) -> None:
        """``rng.pt`` and ``state.json`` (sizes and SHA-256 of every file in ``d``); ``sharded``: the number of
        processes that wrote the weights and AdamW state as DCP files (:mod:`hacrl_fed.checkpoints.sharded`)."""
        torch.save(get_rng_state(), d / "rng.pt")
        meta = {
            "format": FORMAT_VERSION, "step": state.step, "run_id": state.run_id,
            "capability_b64": base64.b64encode(state.capability).decode("ascii"),
            "fingerprint": state.fingerprint, "lora": lora, "extra": state.extra,
            "files": {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(d.iterdir())},
        }
        if sharded:
            meta["sharded"] = sharded
        meta["digest"] = _meta_digest(meta)
        (d / "state.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")

    def _write_latest(self, name: str) -> None:
        atomic_write_text(self.root / "latest", name + "\n")
        fsync_dir(self.root)

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints under ``root``, oldest first: directories (not links) named ``step-NNNNNNNN``
        holding a ``state.json``."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_DIR.match(p.name) and not p.is_symlink() and p.is_dir()
                 and (p / "state.json").is_file()]
        return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]

    def latest(self) -> Path | None:
        """The newest checkpoint (``latest`` pointer, else the highest step), or None.

        The pointer is followed only when it holds the plain name of one of :meth:`checkpoints` (no path, no
        ``..``, no link out of ``root``); an unreadable or other pointer is ignored with a one-line warning naming it.
        """
        found = self.checkpoints()
        pointer = self.root / "latest"
        if not os.path.lexists(pointer):
            return found[-1] if found else None
        try:
            name = read_bounded(pointer, MAX_POINTER_BYTES).decode("utf-8").strip()
        except OSError as err:
            why = f"unreadable ({err.strerror})"
        except UnicodeDecodeError:
            why = "unreadable (not UTF-8 text)"
        else:
            if self.root / name in found and "/" not in name:
                return self.root / name
            why = f"names {name[:80]!r}, not a checkpoint directory inside {self.root}"
        log.warning("%s: checkpoint pointer %s; using the newest checkpoint there instead%s", pointer, why,
                    f" ({found[-1].name})" if found else " (none)")
        return found[-1] if found else None

    def candidates(self) -> list[Path]:
        """Checkpoints to resume from, best first: the ``latest`` pointer's, then the others newest first."""
        found = list(reversed(self.checkpoints()))
        best = self.latest()
        return ([best] if best is not None else []) + [p for p in found if p != best]

    def load_latest(self, model, optimizer=None, *, fingerprint=None,
                    restore: Callable[[TrainingState], None] | None = None) -> tuple[Path, TrainingState] | None:
        """Load the newest intact checkpoint (see :meth:`load`); None when there is none at all.

        ``restore(state)`` then restores what the caller keeps in ``state.extra`` (e.g. the screens' state); a
        ``ValueError``, ``TypeError``, ``KeyError`` or ``AttributeError`` it raises makes the checkpoint unusable like
        a damaged one (``restore`` must leave its objects unchanged when it raises). Each unusable one is skipped
        with a one-line warning naming it. Raises :class:`CheckpointError` (one line naming every file tried) when
        checkpoints exist but none is intact.
        """
        tried = []
        for path in self.candidates():
            try:
                state = self.load(path, model, optimizer, fingerprint=fingerprint, tensors=self.load_tensors)
                if restore is not None:
                    try:
                        restore(state)
                    except (ValueError, TypeError, KeyError, AttributeError) as err:
                        raise CheckpointError(f"{path / 'state.json'}: cannot restore its saved state: "
                                              f"{' '.join(str(err).split())[:300]}") from None
                return path, state
            except CheckpointError as err:
                tried.append(str(err))
                log.warning("checkpoint unusable, trying an older one: %s", err)
        if tried:
            raise CheckpointError(f"no intact checkpoint in {self.root}: {'; '.join(tried)} (move them away to start "
                                  f"from the initial weights)")
        return None

    def _prune(self) -> None:
        for old in self.checkpoints()[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def load_tensors(d: Path, meta: dict, model, optimizer) -> None:
        """Weights (or the LoRA adapter) and AdamW state of verified checkpoint ``d`` into the live objects (a
        ``sharded`` checkpoint is read with DCP into this single process)."""
        from safetensors.torch import load_file, load_model

        if meta.get("sharded"):
            from hacrl_fed.checkpoints.sharded import load_sharded

            load_sharded(d, model, optimizer)
        elif meta["lora"]:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(model, load_file(str(d / "adapter.safetensors")))
            if getattr(result, "unexpected_keys", None):
                raise CheckpointError(f"{d}: adapter has unexpected keys {result.unexpected_keys[:5]}")
        else:
            load_model(model, str(d / "model.safetensors"), strict=True)
            if optimizer is not None:
                optimizer.load_state_dict(torch.load(d / "optimizer.pt", weights_only=True))

    @staticmethod
    def load(path: str | Path, model, optimizer=None, *, restore_rng: bool = True, fingerprint=None,
             tensors=None) -> TrainingState:
        """Verify, then load weights (or the LoRA adapter), optimizer and RNG states from ``path`` into the live objects.

        ``fingerprint(model) -> str`` (e.g. :func:`hacrl_fed.worker.models.model_fingerprint`) is compared with
        the recorded fingerprint after loading. ``tensors(d, meta, model, optimizer)`` replaces
        :meth:`load_tensors` (a sharded site's loader). Raises :class:`CheckpointError` (one line naming the file) if
        ``state.json`` is unreadable or altered, a file is missing, truncated or does not match its recorded
        SHA-256 (nothing is loaded then), the checkpoint is LoRA but the model is not (or vice versa), the
        tensors do not match the model, or the loaded weights do not have the recorded fingerprint.
        """
        d = Path(path)
        meta = _verified_meta(d)
        for name in ("adapter.safetensors" if meta["lora"] else "model.safetensors", "optimizer.pt", "rng.pt"):
            if (d / name).is_symlink():
                raise CheckpointError(f"{d / name}: a link; checkpoint files must be plain files inside {d}")
        if bool(meta["lora"]) != _is_lora(model):
            raise CheckpointError(f"{d}: checkpoint lora={meta['lora']} but the model lora={_is_lora(model)}; "
                                  "set model.lora_rank as in the run that wrote it")
        try:
            (tensors or CheckpointManager.load_tensors)(d, meta, model, optimizer)
            if restore_rng:
                set_rng_state(torch.load(d / "rng.pt", weights_only=True))
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - safetensors, torch and peft raise their own types
            raise CheckpointError(f"{d}: cannot restore checkpoint: {type(err).__name__}: "
                                  f"{' '.join(str(err).split())[:300]}") from None
        recorded = str(meta.get("fingerprint", ""))
        if fingerprint is not None and recorded and fingerprint(model) != recorded:
            raise CheckpointError(f"{d}: the loaded weights do not have the recorded fingerprint {recorded[:23]}…")
        try:
            if not isinstance(meta.get("run_id"), str) or not isinstance(meta.get("extra", {}), dict):
                raise ValueError("run_id must be a string and extra a table")
            return TrainingState(step=int(meta["step"]), run_id=meta["run_id"],
                                 capability=base64.b64decode(meta.get("capability_b64", ""), validate=True),
                                 fingerprint=recorded, extra=dict(meta.get("extra", {})))
        except (ValueError, TypeError) as err:  # binascii.Error is a ValueError
            why = " ".join(str(err).split())[:200]
            raise CheckpointError(f"{d / 'state.json'}: unreadable checkpoint state ({why})") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _meta_digest(meta: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "digest"}, sort_keys=True).encode()).hexdigest()


def _verified_meta(d: Path) -> dict:
    """``state.json`` of checkpoint ``d`` after every integrity check of :meth:`CheckpointManager.load`."""
    state = d / "state.json"
    if state.is_symlink():
        raise CheckpointError(f"{state}: a link; checkpoint files must be plain files inside {d}")
    try:
        meta = json.loads(read_bounded(state, MAX_META_BYTES).decode("utf-8"))
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or "lora" not in meta:
            raise ValueError("not a checkpoint state")
    except OSError as err:
        raise CheckpointError(f"{state}: unreadable checkpoint state ({err.strerror})") from None
    except (ValueError, RecursionError) as err:
        raise CheckpointError(f"{state}: unreadable checkpoint state ({' '.join(str(err).split())[:200]})") from None
    if meta.get("format") not in (1, FORMAT_VERSION):
        raise CheckpointError(f"{state}: checkpoint format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    if meta["format"] == 1:
        return meta
    if meta.get("digest") != _meta_digest(meta):
        raise CheckpointError(f"{state}: does not match its recorded digest (altered or corrupted)")
    files = meta.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(w, dict) for w in files.values()):
        raise CheckpointError(f"{state}: unreadable checkpoint state (its 'files' is not a table of files)")
    for name, want in files.items():
        f = d / name
        if "/" in name or name in ("", ".", "..") or f.is_symlink():
            raise CheckpointError(f"{f}: a link or a path; checkpoint files must be plain files inside {d}")
        if not f.is_file():
            raise CheckpointError(f"{f}: checkpoint file is missing")
        if f.stat().st_size != want.get("bytes"):
            raise CheckpointError(f"{f}: checkpoint file is truncated or resized ({f.stat().st_size} bytes, "
                                  f"{want.get('bytes')} recorded)")
        if _sha256(f) != want.get("sha256"):
            raise CheckpointError(f"{f}: checkpoint file does not match its recorded SHA-256 (corrupted)")
    return meta


MAX_PATH_CHARS = 4096
"""Longest path a request may name."""


def confined_path(requested: str, roots: Sequence[str | Path], *, export: bool, checkpoints: str | Path) -> Path:
    """The directory a Checkpoint request may write to, for its ``path`` field: a relative path is taken from
    ``roots[0]``; the path (every link resolved) must lie strictly inside one of ``roots`` (a site's directory,
    its checkpoint directory) and contain none of them; it must not contain ``..`` or be a link. What is there
    already may be replaced only when it is an empty directory or one like it: a checkpoint (``state.json``) for
    a save, an exported model (``config.json``) for an export. A save names no directory directly inside
    ``checkpoints`` (the rotation there is the worker's: leave ``path`` empty). Raises ``ValueError`` saying why.
    """
    if len(requested) > MAX_PATH_CHARS or not requested.isprintable():
        raise ValueError(f"not a usable path (more than {MAX_PATH_CHARS} characters or unprintable characters)")
    shown = repr(requested[:200])
    if ".." in Path(requested).parts:
        raise ValueError(f"{shown} contains '..'")
    bases = [os.path.realpath(r) for r in roots]
    where = " or ".join(bases)
    p = Path(requested) if os.path.isabs(requested) else Path(roots[0]) / requested
    if p.is_symlink():
        raise ValueError(f"{shown} is a link; name a directory inside {where}")
    real = os.path.realpath(p)
    if all(outside(real, b) for b in bases):
        raise ValueError(f"{shown} leads to {real[:300]}, outside this site's directories; name a directory inside "
                         f"{where} (a relative path is taken from {bases[0]})")
    if any(outside(b, real) is None for b in bases):   # the path is, or holds, a site directory
        raise ValueError(f"{shown} would replace this site's directory {real[:300]}; name a new directory inside it")
    if not export and os.path.dirname(real) == os.path.realpath(checkpoints):
        raise ValueError(f"{shown} is inside the checkpoint directory, whose checkpoints the worker names itself; "
                         "leave path empty to save there, or name a directory elsewhere in the site's directory")
    if os.path.lexists(real):
        keep = "config.json" if export else "state.json"
        target = Path(real)
        if not target.is_dir() or (any(target.iterdir()) and not (target / keep).is_file()):
            raise ValueError(f"{shown} exists and is not {'an exported model' if export else 'a checkpoint'} "
                             f"directory ({keep}); it would be replaced: name a new directory")
    return Path(real)


def export_hf(model, tokenizer, out_dir: str | Path, *, prompt: dict[str, Any] | None = None) -> Path:
    """Write the policy as a plain Hugging Face directory (``config.json``, ``model.safetensors``,
    tokenizer files) that loads with ``AutoModelForCausalLM.from_pretrained`` alone.

    ``prompt`` (:func:`hacrl_fed.data.prompts.prompt_record`) is how the model was prompted in training; with it
    the directory also says so, for plain ``transformers`` and for ``hacrl-fed eval``:

    * ``hacrl_fed_prompt.json``: the record itself (template kind, system prompt, stop strings, EOS ids, an
      example prompt with its messages);
    * ``generation_config.json``: ``eos_token_id`` = every id that ended a response in training and
      ``stop_strings`` = its stop strings, so ``model.generate(..., tokenizer=tokenizer)`` stops where training
      stopped (generation stops *after* a stop string; the response is the text before it);
    * the tokenizer's chat template: a model trained under the plain template gets
      :data:`~hacrl_fed.data.prompts.PLAIN_CHAT_TEMPLATE` (replacing any other), so ``apply_chat_template``
      renders its training prompt; a chat-template model keeps its own.

    A LoRA model is merged into a copy of its base (the live model keeps its adapter). Written to a
    temporary sibling and renamed into place. Raises ``FileExistsError`` if ``out_dir`` exists, is not
    empty and is not a previous export (no ``config.json``); ``OSError`` when writing fails.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / "config.json").is_file():
        raise FileExistsError(f"{out} exists and is not an exported model directory; choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    plain = copy.deepcopy(model).merge_and_unload() if _is_lora(model) else model
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        _save_tokenizer(tokenizer, tmp, prompt)
        if prompt is not None:
            _save_prompt(plain, tmp, prompt)
        _install_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _save_tokenizer(tokenizer, d: Path, prompt: dict[str, Any] | None) -> None:
    """The tokenizer files; under a plain-template ``prompt`` with the plain chat template (the live tokenizer is
    left as it was)."""
    if prompt is None or prompt.get("template") != "plain":
        tokenizer.save_pretrained(d)
        return
    from hacrl_fed.data.prompts import PLAIN_CHAT_TEMPLATE

    before = tokenizer.chat_template
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    try:
        tokenizer.save_pretrained(d)
    finally:
        tokenizer.chat_template = before


def _save_prompt(model, d: Path, prompt: dict[str, Any]) -> None:
    """``hacrl_fed_prompt.json`` and a ``generation_config.json`` with training's EOS ids and stop strings."""
    from hacrl_fed.data.prompts import PROMPT_FILE

    gen = copy.deepcopy(model.generation_config)
    if prompt.get("eos_token_ids"):
        gen.eos_token_id = list(prompt["eos_token_ids"])
    gen.stop_strings = list(prompt["stop_strings"]) or None
    gen.save_pretrained(d)
    (d / PROMPT_FILE).write_text(json.dumps(prompt, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
