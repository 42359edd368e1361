"""What every command checks before it starts a process or loads a model: the files, models and paths a
run needs, each failure one line naming the config key and the path (:class:`~hacrl_fed.config.ConfigError`,
exit code 2).

* :func:`check_data` — the run's problem sources: the first rows of ``run.data.path`` and
  ``run.data.eval_path`` loaded by the run's own loader (a bounded part of the file), the tasks of a
  ``reasoning_gym`` source generated (a few items each), a registered source's loader and answer style imported;
* :func:`check_models` — every agent's model name resolves (no download, no loading);
* :func:`check_rewards` — every agent's reward functions load;
* :func:`check_report_to` — what ``run.report_to`` needs is installed;
* :func:`check_writable` — an output directory can be created and written (a directory is created in it and
  removed again);
* :func:`read_small` — a file the command reads whole (roster, key, certificate) is a regular file of bounded
  size;
* :func:`check_simulate` / :func:`check_resume` — all of the above for ``hacrl-fed simulate``.

Relative paths are taken against the current directory, as the commands resolve them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hacrl_fed.config import AgentConfig, ConfigError, DataConfig, RunConfig, SimulateConfig
from hacrl_fed.registries import ANSWER_STYLES, DATA_SOURCES

__all__ = ["check_data", "check_models", "check_report_to", "check_resume", "check_rewards", "check_simulate",
           "check_writable", "read_small"]

_PATH_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def check_data(data: DataConfig, key: str = "run.data") -> None:
    """The data a run reads is there and loads: for ``source = "file"`` (and ``hf`` written as a path: a local
    dataset directory) and for ``eval_path``, the first rows are loaded and converted by the run's own loader
    (:func:`hacrl_fed.data.datasets.load_file_head`: at most a few MB read); for ``reasoning_gym``, every task's
    generator makes a few items (:func:`hacrl_fed.data.datasets.load_problems` with small counts). Raises
    ConfigError, one line naming the key and the file. A source or answer style registered beyond the built-ins
    (:mod:`hacrl_fed.registries`) must import."""
    from hacrl_fed.data.datasets import DataError, load_file_head

    for registry, name in ((DATA_SOURCES, data.source), (ANSWER_STYLES, data.answer_style)):
        if name not in registry.builtin_names():
            try:
                registry.get(name)
            except ValueError as err:
                raise ConfigError(f"{key}.{registry.key.partition('.')[2]}: {err}") from None
    if data.source == "file" or (data.source == "hf" and data.path and data.path.startswith(_PATH_PREFIXES)):
        what = "data file" if data.source == "file" else "dataset directory"
        path = _exists(data.path, f"{key}.path", what)
        try:
            load_file_head(path, answer_style=data.answer_style, split=data.split)
        except DataError as err:
            raise ConfigError(f"{key}.path: {' '.join(str(err).split())}") from None
    if data.eval_path:
        path = _exists(data.eval_path, f"{key}.eval_path", "data file")
        try:
            load_file_head(path, answer_style=data.answer_style, split=data.split)
        except DataError as err:
            raise ConfigError(f"{key}.eval_path: {' '.join(str(err).split())}") from None
    if data.source == "reasoning_gym":
        from hacrl_fed.data.datasets import load_problems

        few = data.model_copy(update={"num_problems": len(data.tasks), "eval_size": min(data.eval_size, 1)})
        try:
            load_problems(few)
        except DataError as err:
            raise ConfigError(f"{key}.tasks: {' '.join(str(err).split())}") from None


def _exists(path: str | None, key: str, what: str) -> Path:
    p = Path(os.path.abspath(Path(path or "").expanduser()))
    if not p.exists():
        raise ConfigError(f"{key}: {p}: no such {what} (create it, or point {key} at yours)")
    if what == "data file" and not (p.is_file() or p.is_dir()):  # load_file reads a save_to_disk directory too
        raise ConfigError(f"{key}: {p}: not a regular file")
    return p


MAX_SMALL_FILE_BYTES = 4 << 20
"""Largest roster, key or certificate file a command reads."""


def read_small(path: str | Path, key: str, what: str = "file", max_bytes: int = MAX_SMALL_FILE_BYTES) -> bytes:
    """The content of ``path``, a regular file of at most ``max_bytes`` bytes (never a device, a FIFO or an endless
    file). Raises ConfigError naming ``key`` and the file."""
    from hacrl_fed.atomic import read_bounded

    try:
        return read_bounded(Path(path), max_bytes)
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path}: no such {what}") from None
    except OSError as err:
        raise ConfigError(f"{key}: {path}: cannot read the {what}: {err.strerror}") from None


def check_models(agents: Sequence[AgentConfig], key: str = "agents") -> None:
    """Every agent's ``model.name_or_path`` resolves (:func:`hacrl_fed.worker.models.check_model_name`), and its
    ``model.engine`` can run in this environment (its worker starts here): the factory of
    :data:`hacrl_fed.registries.ROLLOUT_ENGINES` imports and its ``check_installed()`` passes (``vllm``: vllm
    imports). Raises ConfigError naming the agent's key."""
    from hacrl_fed.worker.engines import require_engine
    from hacrl_fed.worker.models import ModelLoadError, check_model_name

    for i, agent in enumerate(agents):
        try:
            require_engine(agent.model.engine)
        except ImportError as err:
            raise ConfigError(f"{key}[{i}].model.engine ({agent.name}): {err} (this command starts the worker "
                              f"here)") from None
        try:
            check_model_name(agent.model.name_or_path, agent.model.gguf_file)
        except ModelLoadError as err:
            raise ConfigError(f"{key}[{i}].model.name_or_path ({agent.name}): {' '.join(str(err).split())}") from None


def check_rewards(agents: Sequence[AgentConfig], key: str = "agents") -> None:
    """Every agent's ``reward_funcs`` load (built-in names, importable ``module:function`` paths). Raises
    ConfigError naming the agent's key."""
    from hacrl_fed.worker.trainer import reward_terms

    for i, agent in enumerate(agents):
        try:
            reward_terms(agent)
        except ValueError as err:
            raise ConfigError(f"{key}[{i}].reward_funcs ({agent.name}): {err}") from None


def check_report_to(run: RunConfig) -> None:
    """The packages ``run.report_to`` needs are installed (no import). Raises ConfigError."""
    import importlib.util

    if "tensorboard" in run.report_to and importlib.util.find_spec("tensorboard") is None:
        from hacrl_fed.coordinator.scalars import INSTALL_HINT

        raise ConfigError(INSTALL_HINT)


def check_writable(path: str | Path, key: str) -> None:
    """``path`` is, or can be created as, a writable directory: a directory is created (and removed again) in it, or
    in its deepest existing parent. Raises ConfigError naming ``key``."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    where = "it" if probe == p else str(probe)
    if not probe.is_dir():
        raise ConfigError(f"{key}: {p}: cannot create it, {probe} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hacrl-fed-probe-", dir=probe))
    except OSError as err:
        raise ConfigError(f"{key}: {p}: cannot create or write {where} ({err.strerror})") from None


def check_simulate(cfg: SimulateConfig, output_dir: str | Path | None = None) -> None:
    """Everything ``hacrl-fed simulate --config`` needs, before any file is written. Raises ConfigError."""
    check_data(cfg.run.data)
    check_report_to(cfg.run)
    check_models(cfg.agents)
    check_rewards(cfg.agents)
    check_writable(output_dir or cfg.run.output_dir, "--output-dir" if output_dir else "run.output_dir")
    for i, agent in enumerate(cfg.agents):
        if agent.model.cache_dir:
            check_writable(agent.model.cache_dir, f"agents[{i}].model.cache_dir")


def check_resume(run_dir: str | Path) -> None:
    """What a ``hacrl-fed simulate --resume`` run needs: its data and models (as resolved when the run was
    prepared). A directory that is not a simulate run is left to the resume itself to refuse."""
    from hacrl_fed.atomic import read_bounded

    try:
        data = json.loads(read_bounded(Path(run_dir) / "simulate.resolved.json", MAX_SMALL_FILE_BYTES))
        run = DataConfig.model_validate(data["server"]["run"]["data"])
        agents = [AgentConfig.model_validate(c["agent"]) for c in data["clients"].values()]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return
    check_data(run)
    check_models(agents)
