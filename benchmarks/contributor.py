"""A rollout-only contributor for the in-process benchmarks: a model behind an OpenAI-compatible endpoint.

Given a local model directory (e.g. an export ``runs/<run>/smollm2/export`` with its ``hacrl_fed_prompt.json``),
:func:`transformers_serve` starts a real ``transformers serve`` on it (127.0.0.1, a free port, no hub access)
for the whole benchmark and stops its process group on exit — a normal end, an exception, Ctrl-C, or SIGTERM
(:func:`sigterm_as_interrupt`); on Linux the server also gets SIGTERM if the benchmark process dies outright
(``PR_SET_PDEATHSIG``). :func:`contributor_agent` is the site's ``AgentConfig`` (``agent.endpoint`` set), which
:class:`inproc.Federation` turns into an ``EndpointWorker`` with a ``role = "rollout_only"`` roster entry.

``transformers serve`` (5.24) decodes greedily whatever the request's temperature unless the model's generation
config says ``do_sample`` (docs/cross-vendor.md, "Servers"). So the server is started on a *served view* of the
directory (:func:`served_view`): a temporary directory of symbolic links to every file of it, except
``generation_config.json``, written with ``do_sample = true`` and the run's ``top_k`` (0: off) over the
directory's own settings. The directory itself is never written. The plan's temperature, top-p, token cap and
the site's stop strings go with each request. The server returns no token log-probs: the contributor's rows
carry no behaviour log-prob, and learners train them by ``algo.missing_behaviour_logprob``.

The site is prompted as the model was trained: system prompt and stop strings from the directory's
``hacrl_fed_prompt.json`` (:func:`hacrl_fed.data.prompts.read_prompt_file`); its chat template (an export of a
plain-template model carries the plain template as its chat template) renders the request's
``[system, user]`` messages into the training prompt on the server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a child gets when its parent dies (Linux)."""


@dataclass(frozen=True)
class Contributor:
    """Where the contributor's rollouts come from, as a cell and ``meta.json`` record it."""

    name: str
    """Its agent name (the roster key; the ``src/<name>`` of the learners' per-source metrics)."""
    source: str
    """The local model directory (resolved) or the endpoint URL given on the command line: its identity."""
    url: str
    """The ``/v1`` base URL requests go to (for a local directory: this run's server, a fresh port each run)."""
    api_model: str
    """The model name sent with each request."""
    system_prompt: str
    stop: tuple[str, ...]
    prompt_from: str
    """Where the system prompt and stop strings come from: the ``hacrl_fed_prompt.json`` path, or ``config``
    (the base config's first learner's system prompt, no stop strings: a directory without one, or a URL)."""
    served: bool
    """True when this script started ``transformers serve`` on ``source``."""

    def record(self) -> dict:
        """JSON-ready fields for a cell and ``meta.json``."""
        return {"name": self.name, "source": self.source, "url": self.url, "api_model": self.api_model,
                "system_prompt": self.system_prompt, "stop": list(self.stop), "prompt_from": self.prompt_from,
                "served": self.served}


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command() -> list[str]:
    """``transformers serve`` of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("transformers")
    return [str(exe) if exe.exists() else shutil.which("transformers") or "transformers", "serve"]


def saved_prompt(model_dir: str | Path) -> tuple[str, dict] | None:
    """``(path, record)`` of the directory's ``hacrl_fed_prompt.json``, or None when it has none (or is not a
    local directory). Raises ``ValueError`` for an unreadable file."""
    from hacrl_fed.data.prompts import PROMPT_FILE, read_prompt_file

    if not Path(model_dir).expanduser().is_dir():
        return None
    rec = read_prompt_file(model_dir)
    return None if rec is None else (str(Path(model_dir).expanduser().resolve() / PROMPT_FILE), rec)


def served_view(model_dir: Path, view_dir: Path, *, top_k: int = 0) -> Path:
    """A directory of symbolic links to every entry of ``model_dir`` but ``generation_config.json``, which is
    written as the directory's (or ``{}``) with ``do_sample = true`` and ``top_k`` (module docstring). Returns
    ``view_dir`` (created; must not exist)."""
    view_dir.mkdir(parents=True)
    for entry in model_dir.iterdir():
        if entry.name != "generation_config.json":
            (view_dir / entry.name).symlink_to(entry.resolve())
    src = model_dir / "generation_config.json"
    gen = json.loads(src.read_text()) if src.is_file() else {}
    (view_dir / "generation_config.json").write_text(json.dumps(gen | {"do_sample": True, "top_k": int(top_k)},
                                                                indent=2))
    return view_dir


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark process dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _wait_healthy(proc: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"transformers serve did not answer /health within {timeout_s:.0f} s:\n"
                               f"{log_path.read_text()[-3000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@contextmanager
def transformers_serve(model_dir: str | Path, log_path: Path, *, device: str = "cpu",
                       start_timeout_s: float = 300.0) -> Iterator[str]:
    """Start ``transformers serve MODEL_DIR`` (the model preloaded, on ``device``, 127.0.0.1, a free port, hub
    offline) and yield its ``/v1`` base URL once ``/health`` answers; the server's process group is stopped on
    exit, however the block ends. Its output goes to ``log_path``. Raises ``RuntimeError`` with the log's tail
    when the server exits or does not answer within ``start_timeout_s``."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*serve_command(), str(model_dir), "--device", device, "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    try:
        _wait_healthy(proc, port, log_path, start_timeout_s)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises ``KeyboardInterrupt`` (as Ctrl-C does), so the ``finally`` clauses that
    stop the server run; the previous handler is restored on exit."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def open_contributor(source: str, *, name: str, api_model: str | None, default_system_prompt: str, top_k: int,
                     log_dir: Path, device: str = "cpu") -> Iterator[Contributor]:
    """The contributor of ``--contributor SOURCE`` for the block's duration: a URL is used as it is (its model
    name ``api_model`` required); a local directory is served by :func:`transformers_serve` on its
    :func:`served_view` (the server's log: ``log_dir/contributor-serve.log``). Prompt: module docstring; a URL
    whose ``api_model`` is a local directory with a ``hacrl_fed_prompt.json`` takes it from there. Raises
    ``ValueError`` for a URL without ``api_model`` or a source that is neither a URL nor a directory."""
    if is_url(source):
        if not api_model:
            raise ValueError("--contributor URL needs --contributor-api-model NAME (the endpoint's model name)")
        yield _contributor(name, source, source, api_model, saved_prompt(api_model), default_system_prompt, False)
        return
    model_dir = Path(source).expanduser().resolve()
    if not model_dir.is_dir():
        raise ValueError(f"--contributor {source}: neither an http(s) URL nor a model directory")
    prompt = saved_prompt(model_dir)
    with tempfile.TemporaryDirectory(prefix="hacrl-contrib-") as tmp:
        view = served_view(model_dir, Path(tmp) / model_dir.name, top_k=top_k)
        with transformers_serve(view, log_dir / "contributor-serve.log", device=device) as url:
            yield _contributor(name, str(model_dir), url, str(view), prompt, default_system_prompt, True)


def _contributor(name: str, source: str, url: str, api_model: str, prompt: tuple[str, dict] | None,
                 default_system_prompt: str, served: bool) -> Contributor:
    if prompt is None:
        return Contributor(name, source, url, api_model, default_system_prompt, (), "config", served)
    path, rec = prompt
    return Contributor(name, source, url, api_model, rec["system_prompt"], tuple(s for s in rec["stop_strings"] if s),
                       path, served)


def contributor_agent(c: Contributor, *, verifier, api_key_env: str | None = None):
    """The rollout-only site's ``AgentConfig``: ``model.name_or_path`` = the endpoint's model name, the
    contributor's system prompt and stop strings (at most 4 are sent), ``agent.endpoint`` at ``c.url``; the
    learners' verifier settings (``verifier``, a ``VerifierConfig``: the same truncated-response reward).
    A server this script started gets one request at a time and no ``n`` (``transformers serve`` returns one
    choice and runs one generation at a time on the CPU; each request's seed then applies to it alone)."""
    from hacrl_fed.config import AgentConfig, EndpointConfig, ModelConfig

    endpoint = (EndpointConfig(url=c.url, n="never", max_concurrency=1) if c.served
                else EndpointConfig(url=c.url, api_key_env=api_key_env))
    return AgentConfig(name=c.name, model=ModelConfig(name_or_path=c.api_model, system_prompt=c.system_prompt,
                                                      stop=list(c.stop)),
                       verifier=verifier.model_copy(deep=True), endpoint=endpoint)
