"""Problem loading: JSONL / JSON / parquet files, Hugging Face ``datasets``, or the built-in generator.

Column conventions understood per row (first match wins):

=============  ===========================================  ===============================  ===============
convention     problem text                                 reference answer                 id
=============  ===========================================  ===============================  ===============
ours           ``problem``                                  ``answer``                       ``id``
GSM8K (HF)     ``question``                                 ``answer`` (text after ``####``)  —
TRL            ``prompt`` (string, or chat list: last user  ``solution`` (last ``\\boxed{}``)  —
               turn)                                        or ``answer``
verl           ``prompt`` (chat list)                       ``reward_model.ground_truth``    ``extra_info.index``
=============  ===========================================  ===============================  ===============

Rows without an id get ``<file stem>-<line>``. Optional ``answer_style`` (``boxed``/``gsm8k``/a registered style) and
``source``/``data_source`` columns are kept. A bad row raises :class:`DataError` naming the file
and line (JSONL) or row (parquet, datasets).
"""

from __future__ import annotations

import codecs
import json
import logging
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hacrl_fed.data.arithmetic import iter_problems
from hacrl_fed.data.problem import DataError, Problem
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.registries import ANSWER_STYLES, DATA_SOURCES
from hacrl_fed.reward.extract import is_answer_style, reference_answer

if TYPE_CHECKING:
    from hacrl_fed.config import DataConfig

__all__ = [
    "DataError",
    "Problem",
    "PromptSampler",
    "load_file",
    "load_file_head",
    "load_hf",
    "load_problems",
    "problems_from_rows",
    "split_held_out",
]

log = logging.getLogger(__name__)

HELD_OUT_LABEL = "held-out"
"""Seed label of the held-out selection: the same held-out problems for every run seed."""

HEAD_ROWS = 100
"""Rows :func:`load_file_head` converts (what a pre-flight checks of a data file)."""
HEAD_BYTES = 4 << 20
"""Bytes of a JSON / JSON-lines file :func:`load_file_head` reads at most."""


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style parts [{"type": "text", "text": ...}]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(parts) if parts else None
    return None


def _problem_text(row: dict[str, Any]) -> str:
    for key in ("problem", "question"):
        if isinstance(row.get(key), str):
            return row[key]
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        text = _text_of(users[-1].get("content")) if users else None
        if text is None:
            raise ValueError("'prompt' chat list has no user message with text content")
        return text
    raise ValueError("no problem text: expected a 'problem', 'question' or 'prompt' column")


def _answer_text(row: dict[str, Any]) -> str:
    value: Any = None
    for key in ("answer", "solution"):
        if row.get(key) is not None:
            value = row[key]
            break
    else:
        rm = row.get("reward_model")
        if isinstance(rm, str):
            try:
                rm = json.loads(rm)
            except json.JSONDecodeError:
                rm = None
        if isinstance(rm, dict):
            value = rm.get("ground_truth")
        if value is None:
            raise ValueError("no answer: expected an 'answer', 'solution' or 'reward_model.ground_truth' column")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"answer must be a string or number, got {type(value).__name__}")
    if isinstance(value, float):
        value = str(int(value)) if value.is_integer() else repr(value)
    answer = reference_answer(str(value))
    if not answer:
        raise ValueError("empty answer")
    return answer


def _row_id(row: dict[str, Any], stem: str, number: int) -> str:
    rid = row.get("id")
    if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid).strip():
        return str(rid).strip()
    extra = row.get("extra_info")
    if isinstance(extra, dict) and isinstance(extra.get("index"), (str, int)):
        return f"{row.get('data_source') or stem}-{extra['index']}"
    return f"{stem}-{number}"


def problems_from_rows(rows: Iterable[tuple[str, Any]], *, stem: str, answer_style: str = "boxed") -> list[Problem]:
    """Convert ``(where, row)`` pairs to problems. ``where`` (e.g. ``data.jsonl:12``) prefixes every
    error; ``stem`` names rows without an id. Raises :class:`DataError` for a bad row or duplicate id."""
    if not is_answer_style(answer_style):
        raise DataError(f"unknown answer style {str(answer_style)[:80]!r}; registered: "
                        f"{', '.join(ANSWER_STYLES.names())}")
    out: list[Problem] = []
    first_seen: dict[str, str] = {}
    for i, (where, row) in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object with named columns, got {type(row).__name__}")
        try:
            text = _problem_text(row).strip()
            if not text:
                raise ValueError("empty problem text")
            answer = _answer_text(row)
            style = row.get("answer_style") or answer_style
            if not is_answer_style(style):
                raise ValueError(f"answer_style must be one of {', '.join(ANSWER_STYLES.names())} or task:<name>, got "
                                 f"{str(style)[:80]!r}")
        except ValueError as err:
            raise DataError(f"{where}: {err}") from None
        pid = _row_id(row, stem, i + 1)
        if pid in first_seen:
            raise DataError(f"{where}: duplicate id {pid!r} (first at {first_seen[pid]})")
        first_seen[pid] = where
        source = row.get("source") or row.get("data_source") or ""
        out.append(Problem(pid, text, answer, style, str(source)))
    return out


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON: {err.msg} (column {err.colno})") from None


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if not text.lstrip().startswith("["):
        yield from _jsonl_rows(path)
        return
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON: {err.msg} (column {err.colno})") from None
    for i, item in enumerate(items):
        yield f"{path}: item {i + 1}", item


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for corrupt files
        raise DataError(f"{path}: not a readable parquet file: {err}") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path}: row {i + 1}", row


def _dataset_rows(ds: Any, label: str) -> Iterator[tuple[str, Any]]:
    for i, row in enumerate(ds):
        yield f"{label}: row {i + 1}", row


def load_hf(name_or_path: str, split: str = "train", *, answer_style: str = "boxed") -> list[Problem]:
    """Load a Hugging Face dataset: a ``save_to_disk`` directory (``Dataset`` or ``DatasetDict``) or
    a ``load_dataset`` name/path. Raises :class:`DataError` (missing split, load failure, bad row)."""
    import datasets

    path = Path(name_or_path)
    label = f"{name_or_path} [{split}]"
    try:
        if path.is_dir() and any((path / f).exists() for f in ("dataset_dict.json", "dataset_info.json", "state.json")):
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(name_or_path, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types (hub, file, format)
        raise DataError(f"{name_or_path}: could not load dataset (split {split!r}): {err}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{name_or_path}: no split {split!r}; available: {', '.join(ds)}")
        ds = ds[split]
    return problems_from_rows(_dataset_rows(ds, label), stem=path.name or name_or_path, answer_style=answer_style)


def load_file(path: str | Path, *, answer_style: str = "boxed", split: str = "train") -> list[Problem]:
    """Load problems from ``.jsonl``, ``.json`` (JSON lines or an array), ``.parquet``, or a
    ``datasets.save_to_disk`` directory (``split`` picks from a ``DatasetDict``).

    Raises :class:`DataError` naming the file and line/row for a missing file, bad JSON, a missing
    column, an empty answer or a duplicate id.
    """
    p = Path(path)
    if p.is_dir():
        return load_hf(str(p), split, answer_style=answer_style)
    if not p.is_file():
        raise DataError(f"{p}: no such data file")
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        rows = _parquet_rows(p)
    elif suffix == ".json":
        rows = _json_rows(p)
    elif suffix in (".jsonl", ".ndjson"):
        rows = _jsonl_rows(p)
    else:
        raise DataError(f"{p}: unsupported data file type {suffix!r} (use .jsonl, .json, .parquet or a dataset dir)")
    try:
        problems = problems_from_rows(rows, stem=p.stem, answer_style=answer_style)
    except UnicodeDecodeError as err:
        raise DataError(f"{p}: not UTF-8 text ({err.reason} at byte {err.start} of a line)") from None
    if not problems:
        raise DataError(f"{p}: no problems in file")
    return problems


def load_file_head(path: str | Path, *, answer_style: str = "boxed", split: str = "train", max_rows: int = HEAD_ROWS,
                   max_bytes: int = HEAD_BYTES) -> list[Problem]:
    """The first ``max_rows`` problems of a data file in any format :func:`load_file` reads, converted by the same
    code (:func:`problems_from_rows`), reading a bounded part of it: at most ``max_bytes`` of a JSON or JSON-lines
    file, one batch of a parquet file, the first rows of a ``save_to_disk`` directory (a directory of another kind
    is not read: ``[]``). What a pre-flight checks before a run starts.

    Raises :class:`DataError` as :func:`load_file` does for those rows (naming the file and line or row), and for
    a file that is not a regular file, is not UTF-8, or whose first row does not end within ``max_bytes``.
    """
    p = Path(path)
    if p.is_dir():
        if not any((p / f).exists() for f in ("dataset_dict.json", "dataset_info.json", "state.json")):
            return []
        return _saved_dataset_head(p, split, answer_style, max_rows)
    if not p.is_file():
        raise DataError(f"{p}: no such data file" if not p.exists() else f"{p}: not a regular file")
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        rows: Iterable[tuple[str, Any]] = _parquet_head(p, max_rows)
    elif suffix in (".json", ".jsonl", ".ndjson"):
        rows = _json_head(p, max_rows, max_bytes, array_ok=suffix == ".json")
    else:
        raise DataError(f"{p}: unsupported data file type {suffix!r} (use .jsonl, .json, .parquet or a dataset dir)")
    problems = problems_from_rows(rows, stem=p.stem, answer_style=answer_style)
    if not problems:
        raise DataError(f"{p}: no problems in file")
    return problems


def _json_head(path: Path, max_rows: int, max_bytes: int, *, array_ok: bool) -> list[tuple[str, Any]]:
    """The first ``max_rows`` rows of a JSON-lines file (or a JSON array, ``array_ok``) within its first
    ``max_bytes`` bytes; a row cut off at that bound is left out."""
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    cut = len(data) > max_bytes
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(data[:max_bytes], final=not cut)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    rows: list[tuple[str, Any]] = []
    if array_ok and text.lstrip().startswith("["):
        decoder, pos = json.JSONDecoder(), text.index("[") + 1
        while len(rows) < max_rows:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos < len(text) and text[pos] == "]":
                break
            try:
                item, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as err:
                if cut and rows:
                    break
                raise DataError(f"{path}:{err.lineno}: not valid JSON: {err.msg} (column {err.colno})"
                                + (f" (no complete item in its first {max_bytes} bytes)" if cut else "")) from None
            except RecursionError:
                raise DataError(f"{path}: item {len(rows) + 1}: nested too deeply") from None
            rows.append((f"{path}: item {len(rows) + 1}", item))
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos < len(text) and text[pos] == ",":
                pos += 1
            elif pos < len(text) and text[pos] != "]":
                raise DataError(f"{path}: item {len(rows)}: not valid JSON: expected ',' or ']' after it")
        return rows
    lines = text.split("\n")
    if cut:
        lines = lines[:-1]  # cut off at the bound
        if not any(line.strip() for line in lines):
            raise DataError(f"{path}: no complete row in its first {max_bytes} bytes")
    for lineno, line in enumerate(lines, start=1):
        if len(rows) == max_rows:
            break
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: not valid JSON: {err.msg} (column {err.colno})") from None
        except (ValueError, RecursionError) as err:
            raise DataError(f"{path}:{lineno}: not valid JSON: {' '.join(str(err).split())[:200]}") from None
    return rows


def _parquet_head(path: Path, max_rows: int) -> list[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=max_rows), None)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for corrupt files
        raise DataError(f"{path}: not a readable parquet file: {' '.join(str(err).split())[:300]}") from None
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(batch.to_pylist() if batch is not None else [])]


def _saved_dataset_head(path: Path, split: str, answer_style: str, max_rows: int) -> list[Problem]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{path}: no split {split!r}; available: {', '.join(ds)}")
            ds = ds[split]
        ds = ds.select(range(min(max_rows, len(ds))))
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types
        why = " ".join(str(err).split())[:300]
        raise DataError(f"{path}: could not load dataset (split {split!r}): {why}") from None
    return problems_from_rows(_dataset_rows(ds, f"{path} [{split}]"), stem=path.name, answer_style=answer_style)


def split_held_out(problems: list[Problem], eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: ``eval_size`` problems with distinct texts are held out (a fixed,
    seed-independent selection); every problem whose text is held out leaves train, so the two
    never share a problem text. Train keeps the original order."""
    texts = sorted({p.problem for p in problems})
    random.Random(HELD_OUT_LABEL).shuffle(texts)
    held_texts = set(texts[:eval_size])
    held, taken = [], set()
    for p in problems:
        if p.problem in held_texts and p.problem not in taken:
            held.append(p)
            taken.add(p.problem)
    train = [p for p in problems if p.problem not in held_texts]
    return train, held


def _arithmetic(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    held_out = []
    for p in iter_problems(cfg.difficulty, HELD_OUT_LABEL):
        if len(held_out) == cfg.eval_size:
            break
        held_out.append(p)
    held_ids = {p.id for p in held_out}
    train = []
    for p in iter_problems(cfg.difficulty, cfg.seed):
        if len(train) == cfg.num_problems:
            break
        if p.id not in held_ids:
            train.append(p)
    if len(train) < cfg.num_problems:
        log.warning("arithmetic level %d has %d training problems besides %d held out (%d requested)",
                    cfg.difficulty, len(train), len(held_out), cfg.num_problems)
    return train, held_out


def load_problems(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)`` for a run's ``[run.data]`` section, from the loader ``cfg.source`` names in
    :data:`hacrl_fed.registries.DATA_SOURCES` (``load(cfg) -> (train, held_out)``; docs/extending.md). Built in:

    * ``arithmetic``: ``num_problems`` generated training problems (seeded by ``cfg.seed``) and
      ``eval_size`` held-out problems that are the same for every seed; disjoint by construction.
    * ``reasoning_gym``: procedural tasks (:func:`hacrl_fed.data.tasks.load_task_problems`): training items split
      over ``cfg.tasks`` by weight, held-out items of every task and of ``cfg.eval_tasks``; disjoint, checked.
    * ``episodes``: environment instances (:func:`hacrl_fed.data.episodes.load_episode_problems`), seeded alike.
    * ``file`` / ``hf``: ``cfg.path`` loaded with ``cfg.answer_style``; held out are the first
      ``eval_size`` rows of ``cfg.eval_path`` if given, else ``eval_size`` rows of the source.
      Train never contains a held-out problem text.

    Raises :class:`DataError` for an unknown source or one that does not import, unreadable data, bad rows, a
    loader that returns anything but two lists of :class:`Problem` with known answer styles, or an empty training
    set.
    """
    try:
        load = DATA_SOURCES.get_callable(cfg.source)
    except ValueError as err:
        raise DataError(f"data.source: {err}") from None
    train, held = _checked(cfg.source, load(cfg))
    if not train:
        raise DataError(f"no training problems left from data source {cfg.source!r} ({cfg.path or 'generated'})")
    return train, held


def _restyle(p: Problem, style: str) -> Problem:
    return Problem(p.id, p.problem, p.answer, style, p.source)


def _checked(source: str, loaded: Any) -> tuple[list[Problem], list[Problem]]:
    """A loader's ``(train, held_out)``, checked: two lists of :class:`Problem` whose answer styles this process
    knows (``episode`` for an episode). Raises :class:`DataError` naming the source."""
    if not isinstance(loaded, tuple) or len(loaded) != 2 or not all(isinstance(x, list) for x in loaded):
        raise DataError(f"data source {source!r} must return (train, held_out), two lists of Problem; got "
                        f"{type(loaded).__name__}")
    for p in (*loaded[0], *loaded[1]):
        if not isinstance(p, Problem):
            raise DataError(f"data source {source!r} returned a {type(p).__name__}, not a Problem")
        if p.episode is None and not is_answer_style(p.answer_style):
            raise DataError(f"data source {source!r}: problem {p.id[:80]!r} has unknown answer style "
                            f"{p.answer_style[:80]!r}")
    return loaded[0], loaded[1]


def load_arithmetic(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``data.source = "arithmetic"``: the built-in generator (:func:`load_problems`), every problem in
    ``cfg.answer_style``."""
    train, held = _arithmetic(cfg)
    if cfg.answer_style != "boxed":
        train = [_restyle(p, cfg.answer_style) for p in train]
        held = [_restyle(p, cfg.answer_style) for p in held]
    return train, held


def load_file_source(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``data.source = "file"``: ``cfg.path`` (JSONL, JSON, parquet or a saved dataset) with its held-out part
    (:func:`load_problems`)."""
    assert cfg.path is not None  # DataConfig validates this
    return _held_out_of(cfg, load_file(cfg.path, answer_style=cfg.answer_style, split=cfg.split))


def load_hf_source(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``data.source = "hf"``: the ``datasets`` dataset ``cfg.path`` (split ``cfg.split``) with its held-out part
    (:func:`load_problems`)."""
    assert cfg.path is not None  # DataConfig validates this
    return _held_out_of(cfg, load_hf(cfg.path, cfg.split, answer_style=cfg.answer_style))


def _held_out_of(cfg: DataConfig, problems: list[Problem]) -> tuple[list[Problem], list[Problem]]:
    if cfg.eval_path:
        held = load_file(cfg.eval_path, answer_style=cfg.answer_style, split=cfg.split)[: cfg.eval_size]
        held_texts = {p.problem for p in held}
        return [p for p in problems if p.problem not in held_texts], held
    return split_held_out(problems, cfg.eval_size)
