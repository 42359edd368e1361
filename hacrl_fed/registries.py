"""The named extension points a config selects: data sources, answer styles and rollout engines (docs/extending.md).

Each :class:`Registry` maps a name to a *target*: an object, or a lazy ``"package.module:attr"`` string imported
only when the entry is used, so the config can check a name without importing the data, reward or rollout code
(vllm stays unimported until a site builds its engine). Three ways add a name:

* ``register("name", target)`` (or ``@REGISTRY.register("name")`` on a function) in a module the process imports;
* an import path ``package.module:attr`` written directly as the config value (``model.engine``,
  ``data.source``; not ``data.answer_style``, which a peer's prompt carries: see below);
* a Python entry point of the registry's group (:attr:`Registry.group`) in an installed package's metadata,
  read on the first name a lookup does not know, imported only when used: the way to make a name known to every
  process of a site (worker, verifier pool) and to every site of a federation.

``data.answer_style`` travels with every prompt (``PromptItem.answer_style``) and every site checks the answers
of its peers with it, so a site resolves only names registered in its own processes, never an import path read
from a peer; a new answer style has to be registered at every site (an entry point does that).

The interfaces, one per registry (what a target receives and returns):

* :data:`DATA_SOURCES` (``data.source``): ``load(cfg: DataConfig) -> (train, held_out)``, two lists of
  :class:`hacrl_fed.data.problem.Problem`; raises :class:`hacrl_fed.data.problem.DataError` for bad data.
* :data:`ANSWER_STYLES` (``data.answer_style``): ``extract(response: str) -> str | None``, the stated final answer
  (``None``: nothing stated, reward 0), checked against the reference by math-verify; or an object with that
  ``extract`` and optionally ``check(answer: str | None, reference: str, problem: str | None) -> Verdict`` (its own
  checker) and ``answer_end(response) -> int | None`` (:mod:`hacrl_fed.reward.extract`).
* :data:`ROLLOUT_ENGINES` (``model.engine``): ``factory(request: EngineRequest) -> RolloutEngine``
  (:mod:`hacrl_fed.rollout.factory`); an optional ``factory.check_installed()`` raises ``ImportError`` (one line)
  when the engine cannot run in this environment, called by the pre-flight before any model loads.

Registering a taken name raises ``ValueError`` (unless it is the same target again); looking up an unknown name
raises ``ValueError`` listing the registered names. This module imports nothing of the package.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ANSWER_STYLES", "DATA_SOURCES", "IMPORT_PATH", "NAME", "ROLLOUT_ENGINES", "Registry", "import_target"]

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A registered name: lower-case letters, digits and ``_``, starting with a letter, at most 64 characters."""
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
"""``package.module:attr`` (``attr`` may be dotted: ``module:Class.method``)."""
_MAX_PATH = 200


def import_target(path: str) -> Any:
    """The object an import path ``package.module:attr`` names. Raises ``ValueError`` (one line) for a malformed
    path, a module that does not import or a missing attribute."""
    if not isinstance(path, str) or len(path) > _MAX_PATH or not IMPORT_PATH.match(path):
        raise ValueError(f"{str(path)[:80]!r} is not an import path package.module:attr")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of a user's module is reported in one line
        raise ValueError(f"{path}: module {module_name!r} does not import: {type(err).__name__}: "
                         f"{' '.join(str(err).split())[:200]}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{path}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


class Registry:
    """Names → targets of one extension point (module docstring).

    Args:
        kind: what an entry is, for messages (``"rollout engine"``).
        key: the config key that names one (``"model.engine"``).
        group: the entry-point group read for names not registered in the process (``"hacrl_fed.rollout_engines"``).
        builtins: the built-in entries, name → ``"module:attr"`` (imported on first use).
        import_paths: whether a config may name an entry by import path instead of by name.
    """

    def __init__(self, kind: str, key: str, group: str, builtins: dict[str, str], *, import_paths: bool) -> None:
        self.kind, self.key, self.group, self.import_paths = kind, key, group, import_paths
        self._targets: dict[str, Any] = dict(builtins)
        self._builtins = frozenset(builtins)
        self._loaded: dict[str, Any] = {}
        self._entry_points_read = False

    def register(self, name: str, target: Any = None) -> Any:
        """Register ``target`` (an object or a lazy ``"module:attr"`` string) under ``name``; without ``target``, a
        decorator that registers the function or class it decorates and returns it unchanged.

        Raises ``ValueError`` for a malformed name (:data:`NAME`) or a name taken by another target, ``TypeError``
        for a target that is neither an import path nor callable.
        """
        if target is None:
            return lambda obj: (self.register(name, obj), obj)[1]
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(f"{self.kind} name must match {NAME.pattern}, got {str(name)[:80]!r}")
        if isinstance(target, str):
            if not IMPORT_PATH.match(target):
                raise ValueError(f"{self.kind} {name!r}: {target[:80]!r} is not an import path package.module:attr")
        elif not callable(target) and not callable(getattr(target, "extract", None)):
            raise TypeError(f"{self.kind} {name!r} must be callable or an import path, got {type(target).__name__}")
        old = self._targets.get(name)
        if old is not None and old is not target and old != target:
            raise ValueError(f"{self.kind} {name!r} is already registered ({_shown(old)}); choose another name")
        self._targets[name] = target
        return target

    def unregister(self, name: str) -> None:
        """Remove an entry a :meth:`register` call added (tests, interactive sessions). Raises ``ValueError`` for a
        built-in or unknown name."""
        if name in self._builtins or name not in self._targets:
            raise ValueError(f"{self.kind} {name!r} is {'built in' if name in self._builtins else 'not registered'}")
        del self._targets[name]
        self._loaded.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Every registered name (built in, registered, entry points), sorted."""
        self._read_entry_points()
        return tuple(sorted(self._targets))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def builtin_names(self) -> tuple[str, ...]:
        """The built-in names, sorted."""
        return tuple(sorted(self._builtins))

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered (import paths are not: see :meth:`accepts`)."""
        if not isinstance(name, str):
            return False
        if name not in self._targets:
            self._read_entry_points()
        return name in self._targets

    def accepts(self, name: str) -> bool:
        """Whether a config may give ``name``: a registered name, or an import path where the registry takes them
        (not imported here)."""
        return name in self or (self.import_paths and isinstance(name, str) and len(name) <= _MAX_PATH
                                and IMPORT_PATH.match(name) is not None)

    def check(self, name: str) -> str:
        """``name`` if :meth:`accepts` it. Raises ``ValueError``: ``unknown rollout engine 'x'; registered: hf, vllm
        (or an import path package.module:attr)``."""
        if not self.accepts(name):
            shown = name[:80] if isinstance(name, str) else type(name).__name__
            paths = " (or an import path package.module:attr)" if self.import_paths else ""
            raise ValueError(f"unknown {self.kind} {shown!r}; registered: {', '.join(self.names())}{paths}")
        return name

    def get(self, name: str) -> Any:
        """The target of ``name``, imported on first use (an import path when the registry takes them). Raises
        ``ValueError`` (one line) for an unknown name or a target that does not import."""
        self.check(name)
        if name in self._loaded:
            return self._loaded[name]
        target = self._targets.get(name, name)
        obj = import_target(target) if isinstance(target, str) else target
        self._loaded[name] = obj
        return obj

    def get_callable(self, name: str) -> Callable[..., Any]:
        """:meth:`get`, for a target that must be callable (a source's loader, an engine's factory). Raises
        ``ValueError`` (one line) as :meth:`get`, or when the target is not callable."""
        obj = self.get(name)
        if not callable(obj):
            raise ValueError(f"{self.key} = {name!r} names a {type(obj).__name__}, not a callable")
        return obj

    def added(self) -> dict[str, str]:
        """The entries added to the built-ins in this process that another process can import, name → import path
        (a function or class defined at a module's top level, or a path): what a spawned verifier process
        re-registers (:meth:`restore`)."""
        out = {}
        for name, target in self._targets.items():
            path = target if isinstance(target, str) else _path_of(target)
            if name not in self._builtins and path is not None:
                out[name] = path
        return out

    def restore(self, added: dict[str, str]) -> None:
        """Register the entries of another process's :meth:`added` that this process does not have."""
        for name, path in added.items():
            if name not in self._targets:
                self.register(name, path)

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            if NAME.match(ep.name) and IMPORT_PATH.match(ep.value.replace(" ", "")) and ep.name not in self._targets:
                self._targets[ep.name] = ep.value.replace(" ", "")


def _path_of(obj: Any) -> str | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    return f"{module}:{qualname}"


def _shown(target: Any) -> str:
    return target if isinstance(target, str) else (_path_of(target) or type(target).__name__)


DATA_SOURCES = Registry("data source", "data.source", "hacrl_fed.data_sources", {
    "arithmetic": "hacrl_fed.data.datasets:load_arithmetic",
    "file": "hacrl_fed.data.datasets:load_file_source",
    "hf": "hacrl_fed.data.datasets:load_hf_source",
    "reasoning_gym": "hacrl_fed.data.tasks:load_task_problems",
    "episodes": "hacrl_fed.data.episodes:load_episode_problems",
}, import_paths=True)
"""``data.source``: ``load(cfg: DataConfig) -> (train, held_out)`` (lists of ``Problem``; raises ``DataError``)."""

ANSWER_STYLES = Registry("answer style", "data.answer_style", "hacrl_fed.answer_styles", {
    "boxed": "hacrl_fed.reward.extract:BOXED",
    "gsm8k": "hacrl_fed.reward.extract:GSM8K",
}, import_paths=False)
"""``data.answer_style``: ``extract(response) -> str | None``, or an object with ``extract`` and optionally
``check(answer, reference, problem) -> Verdict`` and ``answer_end(response) -> int | None``. Registered names
only (a peer's prompt names one); ``task:<name>`` and ``episode`` are the procedural-task and episode checkers,
not entries."""

ROLLOUT_ENGINES = Registry("rollout engine", "model.engine", "hacrl_fed.rollout_engines", {
    "auto": "hacrl_fed.worker.engines:auto_engine",
    "ct2": "hacrl_fed.worker.engines:ct2_engine",
    "hf": "hacrl_fed.worker.engines:hf_engine",
    "loop": "hacrl_fed.worker.engines:loop_engine",
    "vllm": "hacrl_fed.worker.engines:vllm_engine",
}, import_paths=True)
"""``model.engine``: ``factory(request: EngineRequest) -> RolloutEngine`` (:mod:`hacrl_fed.rollout.factory`)."""

