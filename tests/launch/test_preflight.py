"""The pre-flight parses what it checks, bounded in size (issue 25, D6): a data file that is not a dataset, a
reasoning-gym task that does not generate, a roster or key that is a device or an endless file, an output
directory that cannot be created — each refused before anything starts, in one line naming the key and the file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.config import ConfigError, DataConfig
from hacrl_fed.launch.preflight import check_data, check_writable

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

ROW = {"id": "1", "problem": "1+1?", "answer": "2"}


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


NOT_A_DATASET = {
    "prose.jsonl": (b"hello world, this is not JSON\n", "train.jsonl:1: not valid JSON"),
    "columns.jsonl": (json.dumps({"foo": 1}).encode() + b"\n", "train.jsonl:1: no problem text"),
    "no_answer.json": (json.dumps([ROW, {"problem": "2+2?"}]).encode(), "item 2: no answer"),
    "broken_array.json": (b'[{"problem": "1+1?", "answer": "2"} {"x": 1}]', "expected ',' or ']'"),
    "garbage.parquet": (b"PAR1 not really parquet at all", "not a readable parquet file"),
    "latin1.jsonl": ('{"problem": "caf\xe9?", "answer": "1"}\n'.encode("latin-1"), "not UTF-8"),
    "empty.jsonl": (b"\n\n", "no problems in file"),
    "table.csv": (b"problem,answer\n1+1?,2\n", "unsupported data file type '.csv'"),
}


@pytest.mark.parametrize("case", sorted(NOT_A_DATASET))
def test_a_data_file_that_is_not_a_dataset_fails_the_preflight(tmp_path, case):
    content, expected = NOT_A_DATASET[case]
    path = tmp_path / ("train" + Path(case).suffix)
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        check_data(DataConfig(source="file", path=str(path), eval_size=0))
    line = _one_line(err)
    assert line.startswith("run.data.path: ") and str(path) in line and expected in line, line


def test_a_bad_eval_file_names_its_key(tmp_path):
    good, bad = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    good.write_text(json.dumps(ROW) + "\n")
    bad.write_text("not json\n")
    with pytest.raises(ConfigError) as err:
        check_data(DataConfig(source="file", path=str(good), eval_path=str(bad)))
    assert _one_line(err).startswith(f"run.data.eval_path: {bad}:1: not valid JSON")


def test_good_data_files_pass_and_only_a_bounded_prefix_is_read(tmp_path):
    rows = [dict(ROW, id=str(i)) for i in range(200)]
    jsonl = tmp_path / "train.jsonl"
    # 200 good rows, then 8 MB of something else: the pre-flight reads the first rows only
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows) + "x" * (8 << 20) + "\n")
    array = tmp_path / "train.json"
    array.write_text(json.dumps(rows + [{"problem": "p" * (8 << 20), "answer": "1"}]))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, array, parquet):
        t0 = time.monotonic()
        check_data(DataConfig(source="file", path=str(path), eval_size=0))
        assert time.monotonic() - t0 < 5, path


def test_a_first_row_beyond_the_bound_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("x" * (5 << 20))
    with pytest.raises(ConfigError, match=r"run.data.path: .*train.jsonl: no complete row in its first \d+ bytes"):
        check_data(DataConfig(source="file", path=str(path), eval_size=0))


def test_a_saved_dataset_directory_is_loaded_by_the_preflight(tmp_path):
    datasets = pytest.importorskip("datasets")
    good, bad = tmp_path / "good", tmp_path / "bad"
    datasets.Dataset.from_list([dict(ROW, id=str(i)) for i in range(300)]).save_to_disk(str(good))
    datasets.Dataset.from_list([{"foo": 1}]).save_to_disk(str(bad))
    check_data(DataConfig(source="hf", path=str(good), eval_size=0))
    with pytest.raises(ConfigError) as err:
        check_data(DataConfig(source="file", path=str(bad), eval_size=0))
    line = _one_line(err)
    assert line.startswith(f"run.data.path: {bad} [train]: row 1: no problem text"), line


@pytest.mark.parametrize("task, expected", [
    ({"name": "no_such_generator"}, "reasoning-gym has no generator 'no_such_generator'"),
    ({"name": "chain_sum", "config": {"no_such_option": 3}}, "bad config for generator 'chain_sum'"),
])
def test_a_task_that_does_not_generate_fails_the_preflight(task, expected):
    cfg = DataConfig(source="reasoning_gym", tasks=[task], num_problems=5000, eval_size=200)
    with pytest.raises(ConfigError) as err:
        check_data(cfg)
    line = _one_line(err)
    assert line.startswith("run.data.tasks: ") and expected in line, line


def test_good_tasks_pass_the_preflight_quickly():
    t0 = time.monotonic()
    check_data(DataConfig(source="reasoning_gym", tasks=[{"name": "chain_sum"}], num_problems=100000, eval_size=1000))
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("where", ["/proc/hacrl-fed-test/runs", "/dev/null/runs"])
def test_an_output_dir_that_cannot_be_created_is_named(where):
    with pytest.raises(ConfigError) as err:
        check_writable(where, "run.output_dir")
    assert _one_line(err).startswith(f"run.output_dir: {where}: ")


def test_a_writable_output_dir_passes_and_nothing_is_left(tmp_path):
    check_writable(tmp_path / "a" / "b", "run.output_dir")
    check_writable(tmp_path, "run.output_dir")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- at the commands


def _server_toml(tmp_path, federation, **top) -> Path:
    from hacrl_fed.launch.supervise import free_port

    fields = {"roster": str(federation.roster_path)} | top
    body = "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    path = tmp_path / "server.toml"
    path.write_text(f'{body}[superlink]\ninsecure = true\nnode_auth = false\nport = {free_port()}\n'
                    f'[run]\noutput_dir = "{tmp_path / "runs"}"\n', encoding="utf-8")
    return path


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_server_with_a_roster_that_is_a_device_fails_at_once(tmp_path, federation):
    t0 = time.monotonic()
    result = runner.invoke(app, ["server", "--config", str(_server_toml(tmp_path, federation, roster="/dev/zero"))])
    line = _error_line(result)
    assert line.startswith("error: roster: /dev/zero: ") and "not a regular file" in line
    assert time.monotonic() - t0 < 30 and not (tmp_path / "runs").exists()


def test_server_with_a_huge_roster_fails_at_once(tmp_path, federation):
    huge = tmp_path / "roster.toml"
    huge.write_text(federation.roster_path.read_text() + "#" + "x" * (8 << 20) + "\n")
    result = runner.invoke(app, ["server", "--config", str(_server_toml(tmp_path, federation, roster=str(huge)))])
    line = _error_line(result)
    assert line.startswith(f"error: roster: {huge}: ") and "larger than" in line


def test_server_with_a_data_file_that_is_not_a_dataset_fails_before_anything_starts(tmp_path, federation):
    data = tmp_path / "train.jsonl"
    data.write_text("this is not a dataset\n")
    cfg = _server_toml(tmp_path, federation)
    cfg.write_text(cfg.read_text() + f'[run.data]\nsource = "file"\npath = "{data}"\n')
    line = _error_line(runner.invoke(app, ["server", "--config", str(cfg)]))
    assert line.startswith(f"error: run.data.path: {data}:1: not valid JSON")
    assert not (tmp_path / "runs").exists()


def test_server_with_an_output_dir_under_proc_names_the_key(tmp_path, federation):
    cfg = _server_toml(tmp_path, federation)
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "runs"), "/proc/hacrl-fed-test"))
    line = _error_line(runner.invoke(app, ["server", "--config", str(cfg)]))
    assert line.startswith("error: run.output_dir: /proc/hacrl-fed-test: ")


def test_simulate_with_an_output_dir_under_proc_names_the_option(tmp_path):
    result = runner.invoke(app, ["simulate", "--config", str(ROOT / "examples" / "tiny.toml"), "--no-progress",
                                 "--output-dir", "/proc/hacrl-fed-test"])
    assert _error_line(result).startswith("error: --output-dir: /proc/hacrl-fed-test: ")


def test_a_config_file_that_is_a_device_is_refused(tmp_path):
    result = runner.invoke(app, ["simulate", "--config", "/dev/zero", "--no-progress"])
    assert "/dev/zero: cannot read config file: not a regular file" in _error_line(result)


def test_client_with_keys_or_roster_that_are_devices_names_the_key(tmp_path, federation, monkeypatch):
    from procs import lay_out_site

    lay_out_site(tmp_path, federation)
    monkeypatch.chdir(tmp_path)
    base = ["client", "--name", "alice", "--model", "tiny-llama-bpe", "--insecure", "--server", "127.0.0.1:9"]
    cfg = tmp_path / "client.toml"
    model = '[agent.model]\nname_or_path = "tiny-llama-bpe"\n'
    for key, toml in (("agent.roster", '[agent]\nname = "alice"\nroster = "/dev/zero"\n'),
                      ("agent.private_key", '[agent]\nname = "alice"\nprivate_key = "/dev/zero"\n')):
        cfg.write_text(toml + model)
        line = _error_line(runner.invoke(app, [*base, "--config", str(cfg)]))
        assert line.startswith(f"error: {key}: /dev/zero: not a regular file"), line
    big = tmp_path / "big.key"
    big.write_bytes(b"-----BEGIN PRIVATE KEY-----\n" + b"A" * (1 << 20))
    cfg.write_text(f'[agent]\nname = "alice"\nprivate_key = "{big}"\n' + model)
    line = _error_line(runner.invoke(app, [*base, "--config", str(cfg)]))
    assert line.startswith(f"error: agent.private_key: {big}: ") and "larger than" in line, line
    line = _error_line(runner.invoke(app, [*base, "--output-dir", "/proc/hacrl-fed-test"]))
    assert line.startswith("error: output_dir: /proc/hacrl-fed-test: "), line
