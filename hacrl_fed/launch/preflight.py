"""What every command checks before it starts a process or loads a model: the files, models and paths a
run needs, each failure one line naming the config key and the path (:class:`~hacrl_fed.config.ConfigError`,
exit code 2).

* :func:`check_data` — the run's problem sources (``run.data.path``, ``run.data.eval_path``);
* :func:`check_models` — every agent's model name resolves (no download, no loading);
* :func:`check_rewards` — every agent's reward functions load;
* :func:`check_report_to` — what ``run.report_to`` needs is installed;
* :func:`check_writable` — an output directory can be created and written;
* :func:`check_simulate` / :func:`check_resume` — all of the above for ``hacrl-fed simulate``.

Relative paths are taken against the current directory, as the commands resolve them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from hacrl_fed.config import AgentConfig, ConfigError, DataConfig, RunConfig, SimulateConfig

__all__ = ["check_data", "check_models", "check_report_to", "check_resume", "check_rewards", "check_simulate",
           "check_writable"]

_PATH_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def check_data(data: DataConfig, key: str = "run.data") -> None:
    """The data files a run reads exist: ``path`` for ``source = "file"`` (and for ``hf`` when it is written
    as a path: a local dataset directory), ``eval_path`` whenever it is set. Raises ConfigError."""
    if data.source == "file" or (data.source == "hf" and data.path and data.path.startswith(_PATH_PREFIXES)):
        _exists(data.path, f"{key}.path", "data file" if data.source == "file" else "dataset directory")
    if data.eval_path:
        _exists(data.eval_path, f"{key}.eval_path", "data file")
    check_data_rows(data, key)


def _exists(path: str | None, key: str, what: str) -> None:
    p = Path(os.path.abspath(Path(path or "").expanduser()))
    if not p.exists():
        raise ConfigError(f"{key}: {p}: no such {what} (create it, or point {key} at yours)")
    if what == "data file" and not p.is_file():
        raise ConfigError(f"{key}: {p}: not a file")


def check_models(agents: Sequence[AgentConfig], key: str = "agents") -> None:
    """Every agent's ``model.name_or_path`` resolves (:func:`hacrl_fed.worker.models.check_model_name`), and an
    agent with ``model.engine = "vllm"`` finds vllm in this environment (its worker starts here). Raises
    ConfigError naming the agent's key."""
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
    """``path`` is, or can be created as, a writable directory. Raises ConfigError."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {p}: cannot create or write {'it' if probe == p else probe}")


def check_simulate(cfg: SimulateConfig, output_dir: str | Path | None = None) -> None:
    """Everything ``hacrl-fed simulate --config`` needs, before any file is written. Raises ConfigError."""
    check_data(cfg.run.data)
    check_report_to(cfg.run)
    check_models(cfg.agents)
    check_rewards(cfg.agents)
    check_writable(output_dir or cfg.run.output_dir, "run.output_dir")
    for i, agent in enumerate(cfg.agents):
        if agent.model.cache_dir:
            check_writable(agent.model.cache_dir, f"agents[{i}].model.cache_dir")


def check_resume(run_dir: str | Path) -> None:
    """What a ``hacrl-fed simulate --resume`` run needs: its data and models (as resolved when the run was
    prepared). A directory that is not a simulate run is left to the resume itself to refuse."""
    try:
        data = json.loads((Path(run_dir) / "simulate.resolved.json").read_text(encoding="utf-8"))
        run = DataConfig.model_validate(data["server"]["run"]["data"])
        agents = [AgentConfig.model_validate(c["agent"]) for c in data["clients"].values()]
    except (OSError, ValueError, KeyError, TypeError):
        return
    check_data(run)
    check_models(agents)


PREFLIGHT_ROWS = 32
"""Rows of each data source :func:`check_data_rows` reads."""


def check_data_rows(data: DataConfig, key: str = "run.data", rows: int = PREFLIGHT_ROWS) -> None:
    """The first ``rows`` rows of every local data source a run reads (``path`` of a ``file`` source, or of an
    ``hf`` source written as a path; ``eval_path``) load with the run's own loader
    (:func:`hacrl_fed.data.datasets.peek_problems`), so a file with unknown columns, bad JSON or an unsupported
    type stops the command here with the loader's message (file and line) instead of killing the run later.
    Called by :func:`check_data`. Raises ConfigError naming the key."""
    from hacrl_fed.data.datasets import DataError, peek_problems

    sources = []
    if data.source == "file" or (data.source == "hf" and data.path and data.path.startswith(_PATH_PREFIXES)):
        sources.append(("path", data.path, data.source == "hf"))
    if data.eval_path:
        sources.append(("eval_path", data.eval_path, False))
    for field, path, hf in sources:
        try:
            peek_problems(os.path.expanduser(path or ""), answer_style=data.answer_style, split=data.split,
                          max_rows=rows, hf=hf)
        except DataError as err:
            raise ConfigError(f"{key}.{field}: {' '.join(str(err).split())}") from None
