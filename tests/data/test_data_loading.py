"""Loading problems from JSONL / JSON / parquet / datasets dirs in the ours, TRL and verl column
conventions; bad rows name the file and line; held-out splits never share a problem text."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hacrl_fed.config import DataConfig
from hacrl_fed.data.datasets import DataError, Problem, load_file, load_hf, load_problems, peek_problems, split_held_out

OURS = [
    {"id": "p1", "problem": "What is 2 + 2?", "answer": "4", "source": "toy"},
    {"id": "p2", "problem": "What is 3 * 3?", "answer": "9", "source": "toy"},
]
TRL = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
     "solution": r"We add: $2+2=\boxed{4}$."},
    {"prompt": "What is 3 * 3?", "solution": "9"},
]
TRL_CHAT = [TRL[0], {"prompt": [{"role": "user", "content": "What is 3 * 3?"}], "solution": "9"}]  # one column type
VERL = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2 + 2?"}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 0}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 3 * 3?"}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "9"}, "extra_info": {"split": "train", "index": 1}},
]
GSM8K_HF = [{"question": "What is 2 + 2?", "answer": "Two and two.\n#### 4"},
            {"question": "What is 3 * 3?", "answer": "Three threes.\n#### 9"}]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def core(problems: list[Problem]) -> list[tuple[str, str]]:
    return [(p.problem, p.answer) for p in problems]


EXPECTED = [("What is 2 + 2?", "4"), ("What is 3 * 3?", "9")]


@pytest.mark.parametrize("rows", [OURS, TRL, VERL, GSM8K_HF], ids=["ours", "trl", "verl", "gsm8k-hf"])
def test_jsonl_conventions(tmp_path, rows):
    problems = load_file(write_jsonl(tmp_path / "d.jsonl", rows))
    assert core(problems) == EXPECTED
    assert len({p.id for p in problems}) == 2


def test_ids_and_sources(tmp_path):
    ours = load_file(write_jsonl(tmp_path / "ours.jsonl", OURS))
    verl = load_file(write_jsonl(tmp_path / "verl.jsonl", VERL))
    trl = load_file(write_jsonl(tmp_path / "trl.jsonl", TRL), answer_style="gsm8k")
    assert [(p.id, p.source) for p in ours] == [("p1", "toy"), ("p2", "toy")]
    assert [(p.id, p.source) for p in verl] == [("openai/gsm8k-0", "openai/gsm8k"), ("openai/gsm8k-1", "openai/gsm8k")]
    assert [p.id for p in trl] == ["trl-1", "trl-2"] and {p.answer_style for p in trl} == {"gsm8k"}


@pytest.mark.parametrize("rows", [OURS, TRL_CHAT, VERL], ids=["ours", "trl", "verl"])
def test_parquet(tmp_path, rows):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert core(load_file(path)) == EXPECTED


@pytest.mark.parametrize("rows", [OURS, VERL], ids=["ours", "verl"])
def test_datasets_save_to_disk(tmp_path, rows):
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert core(load_file(tmp_path / "ds")) == EXPECTED
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    assert core(load_hf(str(tmp_path / "dd"), "train")) == EXPECTED
    with pytest.raises(DataError, match="no split 'test'; available: train"):
        load_hf(str(tmp_path / "dd"), "test")


def test_json_array(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(OURS))
    assert core(load_file(path)) == EXPECTED


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "x", "problem": "Q?", "answer": ""}', r"bad\.jsonl:3: empty answer"),
        ('{"id": "x", "problem": "Q?"}', r"bad\.jsonl:3: no answer"),
        ('{"id": "x", "answer": "1"}', r"bad\.jsonl:3: no problem text"),
        ('{"id": "x", "problem": "Q?", "answer": "1"', r"bad\.jsonl:3: not valid JSON"),
        ('[1, 2]', r"bad\.jsonl:3: expected an object"),
        ('{"id": "p1", "problem": "Q?", "answer": "1"}',
         r"bad\.jsonl:3: duplicate id 'p1' \(first at .*bad\.jsonl:1\)"),
        ('{"id": "x", "problem": "Q?", "answer": ["1"]}', r"bad\.jsonl:3: answer must be a string or number"),
        ('{"id": "x", "problem": "Q?", "answer": "1", "answer_style": "latex"}', r"bad\.jsonl:3: answer_style"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(OURS[0]) + "\n\n" + line + "\n")  # the blank line 2 is skipped, not miscounted
    with pytest.raises(DataError, match=message):
        load_file(path)


def test_bad_parquet_row_names_the_row(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "Q?", "answer": "1"}, {"problem": "R?", "answer": " "}]), path)
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: empty answer"):
        load_file(path)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(DataError, match="no such data file"):
        load_file(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type"):
        load_file(tmp_path / "d.csv")
    with pytest.raises(DataError, match="could not load dataset"):
        load_hf(str(tmp_path / "no-such-dataset-dir"), "train")


def test_numeric_answers_become_strings(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"problem": "a", "answer": 4}, {"problem": "b", "answer": 2.5}])
    assert [p.answer for p in load_file(path)] == ["4", "2.5"]


def test_split_held_out_is_disjoint_by_text():
    problems = [Problem(f"id{i}", f"Q{i % 30}", str(i)) for i in range(60)]  # every text twice
    train, held = split_held_out(problems, 10)
    assert len(held) == 10 and len({p.problem for p in held}) == 10
    assert not {p.problem for p in train} & {p.problem for p in held}
    assert len(train) == 40
    assert split_held_out(problems, 10) == (train, held)


def test_load_problems_file_and_eval_path(tmp_path):
    rows = [{"id": f"q{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    train, held = load_problems(DataConfig(source="file", path=str(path), eval_size=5))
    assert (len(train), len(held)) == (15, 5)
    assert not {p.problem for p in train} & {p.problem for p in held}
    eval_path = write_jsonl(tmp_path / "eval.jsonl", rows[:3])
    train, held = load_problems(DataConfig(source="file", path=str(path), eval_path=str(eval_path), eval_size=48))
    assert [p.id for p in held] == ["q0", "q1", "q2"] and len(train) == 17


def test_load_problems_hf_dir(tmp_path):
    import datasets

    datasets.Dataset.from_list(GSM8K_HF * 1).save_to_disk(str(tmp_path / "ds"))
    train, held = load_problems(DataConfig(source="hf", path=str(tmp_path / "ds"), eval_size=1, answer_style="gsm8k"))
    assert len(train) == 1 and len(held) == 1 and {p.answer_style for p in train + held} == {"gsm8k"}


def test_everything_held_out_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", OURS)
    with pytest.raises(DataError, match="no training problems"):
        load_problems(DataConfig(source="file", path=str(path), eval_size=5))


def test_the_first_rows_only(tmp_path):
    """``peek_problems`` (pre-flight's bounded look) parses the first rows with the loaders' code and stops there."""
    rows = OURS + [{"id": "p3", "q": "no problem column", "a": "1"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    assert core(peek_problems(path, max_rows=2)) == EXPECTED
    with pytest.raises(DataError, match=r"d\.jsonl:3: no problem text"):
        peek_problems(path, max_rows=3)
    pq.write_table(pa.Table.from_pylist([{**r, "id": f"{r['id']}-{i}"} for i in range(50) for r in OURS]),
                   tmp_path / "d.parquet")
    assert len(peek_problems(tmp_path / "d.parquet", max_rows=3)) == 3 == len(peek_problems(_saved(tmp_path),
                                                                                            max_rows=3))
    (tmp_path / "json-dir").mkdir()
    write_jsonl(tmp_path / "json-dir" / "train.jsonl", OURS + [{"id": "p3"}])   # a load_dataset directory: streamed
    assert core(peek_problems(tmp_path / "json-dir", max_rows=2)) == EXPECTED
    with pytest.raises(DataError, match="unsupported data file type"):
        peek_problems(write_jsonl(tmp_path / "d.csv", OURS))


def _saved(tmp_path: Path) -> Path:
    import datasets

    out = tmp_path / "saved"
    datasets.Dataset.from_list([{**r, "id": f"{r['id']}-{i}"} for i in range(5) for r in OURS]).save_to_disk(str(out))
    return out
