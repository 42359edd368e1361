"""A warm SuperExec: Flower's task processes forked, already imported, from one long-lived process.

Why: Flower 1.42 runs every ClientApp message (and the ServerApp of a run) in a task process started
for it, and the task must send its first heartbeat within 30 s of being claimed, then one at least
every 60 s (``claim_task`` / ``acknowledge_task_heartbeat`` in
``flwr/supercore/corestate/in_memory_corestate.py``: ``HEARTBEAT_DEFAULT_INTERVAL`` = 30 s,
``HEARTBEAT_PATIENCE`` = 2, constants in ``flwr/common/constant.py``, no option changes them).
Flower's own launcher (``flower-superexec``, ``flwr/supercore/superexec/run_superexec.py``) starts
``flwr-clientapp`` / ``flwr-serverapp`` by name, and that process imports 1.2 CPU-s of Flower
(``flwr.supernode.cli``: 1464 modules) before its heartbeat thread starts. On a loaded machine
(2 cores, load 60) that is more than 30 s of wall time: the claim expires, the SuperNode hands the
task to a new process, the old one is refused (``Runtime task-token authentication failed``) — a loop
in which a step may never run. Imports of extension modules inside a running task hold the GIL and
can starve its heartbeat thread past the 60 s.

What: with ``--isolation process`` (``flower-supernode`` / ``flower-superlink``: "a separate
independent process" executes the tasks), this process takes ``flower-superexec``'s place. It imports
Flower's task runtime and the app (``--preload``) once, then polls the Runtime API for tasks
(``AcquireTask``, as ``flower-superexec`` does) and runs each task in a forked child that calls
Flower's own entry point (``flwr_clientapp`` / ``flwr_serverapp``, the functions behind the
``flwr-clientapp`` / ``flwr-serverapp`` scripts) with the task's token. Each task still has a process
of its own (nothing leaks between messages), but it starts with nothing to import: its first
heartbeat goes out milliseconds after the fork.

Every task start is one line on stdout (:data:`TASK_STARTED`), every task that ends unsuccessfully one more
(:data:`TASK_FAILED`), after Flower's own lines that give the cause; :class:`hacrl_fed.site.watch.TaskWatcher`
turns these into the site's terminal message.

Run as ``python -m hacrl_fed.flower.executor --runtime-api-address 127.0.0.1:9094 --insecure
--task clientapp --preload hacrl_fed.flower.client_app --parent-pid <SuperNode pid>``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hacrl_fed.site.watch import TASK_FAILED, TASK_STARTED

__all__ = ["TASK_FAILED", "TASK_STARTED", "TASK_TYPES", "main", "serve"]

TASK_TYPES = {"clientapp": "flwr-clientapp", "serverapp": "flwr-serverapp"}
"""``--task`` → Flower's task type (``flwr.supercore.constant.TaskType``)."""
POLL_S = 0.5
"""Seconds between two AcquireTask polls when no task was waiting (``flower-superexec``: 1 s)."""


def _entry(task_type: str) -> Callable[[], None]:
    """Flower's own entry function of the task's process (what its console script calls)."""
    if task_type == "flwr-clientapp":
        from flwr.supernode.cli import flwr_clientapp

        return flwr_clientapp
    from flwr.superlink.cli.flwr_serverapp import flwr_serverapp

    return flwr_serverapp


@dataclass
class _Child:
    task_id: int
    run_id: int


def _alive(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _task_argv(task_type: str, address: str, token: str, insecure: bool, root_certificates: str | None) -> list[str]:
    argv = [task_type, "--runtime-api-address", address, "--token", token, "--parent-pid", str(os.getpid())]
    if insecure:
        argv.append("--insecure")
    elif root_certificates:
        argv += ["--root-certificates", root_certificates]
    return argv


def _run_child(entry: Callable[[], None], argv: list[str]) -> None:
    """In the forked child: Flower's entry point with ``argv``, then ``os._exit`` (never returns). A ClientApp's
    ``hacrl_fed.*`` log lines go to stdout (a ServerApp sets that up itself, after Flower has redirected stdout
    into the run's log)."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if argv[0] == "flwr-clientapp":
            from hacrl_fed.logs import log_to_stdout

            log_to_stdout()
        sys.argv = argv
        entry()
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    except BaseException as ex:  # noqa: BLE001 - reported, then the child ends
        print(f"{argv[0]}: {type(ex).__name__}: {ex}", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(children: dict[int, _Child], task_type: str) -> None:
    """Collect ended task processes; print :data:`TASK_FAILED` for each that did not end with 0."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if child is not None and code != 0:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"{TASK_FAILED} {task_type} task {child.task_id} of run {child.run_id} ({how})", flush=True)


def _client(address: str, insecure: bool, root_certificates: str | None, secret: bytes | None):
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret:
        protected = frozenset({"/flwr.proto.Runtime/AcquireTask"})  # as flower-superexec (run_superexec.py)
        interceptors.append(SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=protected))
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure,
        root_certificates=validate_and_resolve_root_certificates(root_certificates, insecure),
        interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker())


def serve(address: str, task: str, *, insecure: bool, root_certificates: str | None = None,
          preload: Sequence[str] = (), parent_pid: int | None = None, secret: bytes | None = None,
          poll_s: float = POLL_S) -> None:
    """Import ``preload``, then run every ``task`` (a key of :data:`TASK_TYPES`) the Runtime API at ``address``
    hands out in a forked child, until the process ``parent_pid`` (the SuperLink or SuperNode) is gone (then
    return) or a signal ends it.

    Raises ImportError when a preloaded module cannot be imported, ValueError for an unknown ``task``.
    """
    if task not in TASK_TYPES:
        raise ValueError(f"--task {task!r}: expected one of {', '.join(TASK_TYPES)}")
    task_type = TASK_TYPES[task]
    entry = _entry(task_type)
    for module in preload:
        importlib.import_module(module)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest

    client = _client(address, insecure, root_certificates, secret)
    request = AcquireTaskRequest(supported_task_types=[task_type])
    children: dict[int, _Child] = {}
    print(f"hacrl-fed executor: running {task_type} tasks of {address} (preloaded: {', '.join(preload) or '-'})",
          flush=True)
    while parent_pid is None or _alive(parent_pid):
        _reap(children, task_type)
        res = client.AcquireTask(request)
        if not (res.HasField("task") and res.token):
            time.sleep(poll_s)
            continue
        argv = _task_argv(task_type, address, res.token, insecure, root_certificates)
        print(f"{TASK_STARTED} {task_type} task {res.task.task_id} of run {res.task.run_id}")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(entry, argv)
        children[pid] = _Child(res.task.task_id, res.task.run_id)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hacrl_fed.flower.executor", description=__doc__.split("\n")[0])
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's / SuperLink's Runtime API host:port")
    p.add_argument("--task", required=True, choices=sorted(TASK_TYPES))
    p.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API")
    p.add_argument("--root-certificates", help="CA certificate of the Runtime API's TLS certificate")
    p.add_argument("--preload", action="append", default=[], help="module imported once before any task (repeat)")
    p.add_argument("--parent-pid", type=int, help="stop when this process (the SuperLink or SuperNode) is gone")
    p.add_argument("--superexec-auth-secret-file", help="the secret file the SuperNode / SuperLink was given")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry; returns the exit code (0 when the parent is gone or after SIGTERM/SIGINT; 1 when the
    Runtime API fails us, e.g. refuses the SuperExec secret; 2: a bad argument or an unimportable ``--preload``)."""
    args = _parse(argv)
    secret = None
    if args.superexec_auth_secret_file:
        with open(args.superexec_auth_secret_file, "rb") as f:
            secret = f.read()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(args.runtime_api_address, args.task, insecure=args.insecure, root_certificates=args.root_certificates,
              preload=args.preload, parent_pid=args.parent_pid, secret=secret)
    except ImportError as err:
        print(f"error: --preload: {err}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0
    except Exception as err:  # noqa: BLE001 - one line instead of a traceback (e.g. the Runtime API refused us)
        print(f"error: {args.runtime_api_address}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
