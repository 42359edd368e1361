"""The process group of one site's trainer: rendezvous, the ranks the worker starts, the watchdog, the stop.

Rank 0 is the site's worker process (its gRPC service, its rollout engine). It starts the ranks of its own machine
(:func:`spawn_ranks`: ``python -m hacrl_fed.distributed.rank`` with the rendezvous in the environment); ranks on
other machines are started there (``torchrun ... -m hacrl_fed.distributed.rank``, docs/distributed.md). Every
collective has the group's timeout (``init_process_group(timeout=...)``): a rank that hangs makes the others fail
after at most that long; :class:`Watchdog` names a local rank that died (pid, exit code or signal).

Security: the rendezvous (a TCP store on ``master_addr:master_port``) has no authentication and ranks exchange
pickled Python objects: the port must be reachable by the site's own machines only.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["ENV", "RankFailure", "Watchdog", "backend_for", "broadcast", "free_port", "init_group", "rank_env",
           "spawn_ranks", "stop_ranks"]

ENV = ("HACRL_DIST_ADDR", "HACRL_DIST_PORT", "HACRL_DIST_RANK", "HACRL_DIST_WORLD", "HACRL_DIST_TIMEOUT_S",
       "HACRL_DIST_DEVICE")
"""The environment a rank started by :func:`spawn_ranks` reads (address, port, rank, world size, collective
timeout in seconds, device type)."""


class RankFailure(RuntimeError):
    """A rank of the site's trainer died, hung past the collective timeout, or could not join the group."""


def backend_for(device_type: str) -> str:
    """``nccl`` for CUDA, ``gloo`` otherwise (gloo implements every collective FSDP2 uses on a CPU)."""
    return "nccl" if device_type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the rendezvous of a single-machine site)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world_size: int, addr: str, port: int, device_type: str, timeout_s: float,
               join_s: float | None = None):
    """Join the site's process group and return its 1-D device mesh (``world_size`` ranks).

    ``timeout_s`` bounds every collective; ``join_s`` (default ``max(timeout_s, 600)``) how long the ranks may take
    to reach the rendezvous (a rank's start, imports included). On CUDA, rank r uses GPU ``r mod (visible GPUs)``.
    Raises :class:`RankFailure` (one line) when the group does not form in time."""
    if device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    join = datetime.timedelta(seconds=join_s if join_s is not None else max(timeout_s, 600.0))
    try:
        store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=join, wait_for_workers=True)
        dist.init_process_group(backend_for(device_type), store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as err:  # noqa: BLE001 - the store raises its own types (timeouts, connection errors)
        raise RankFailure(f"rank {rank} of {world_size} could not join the group at {addr}:{port}: "
                          f"{type(err).__name__}: {' '.join(str(err).split())[:300]}") from None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,))


def broadcast(obj=None):
    """Rank 0's ``obj`` on every rank (pickled; other ranks pass None). Collective."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_env(rank: int, world_size: int, addr: str, port: int, timeout_s: float, device_type: str) -> dict[str, str]:
    """The :data:`ENV` variables of one rank."""
    return dict(zip(ENV, (addr, str(port), str(rank), str(world_size), f"{timeout_s:g}", device_type), strict=True))


def spawn_ranks(ranks: Sequence[int], world_size: int, addr: str, port: int, timeout_s: float,
                device_type: str) -> list[subprocess.Popen]:
    """Start ranks ``ranks`` on this machine (``python -m hacrl_fed.distributed.rank``; each ends itself when this
    process dies). Their output goes to this process's stderr."""
    procs = []
    for r in ranks:
        env = os.environ | rank_env(r, world_size, addr, port, timeout_s, device_type) | {
            "HACRL_DIST_PARENT": str(os.getpid())}
        procs.append(subprocess.Popen([sys.executable, "-m", "hacrl_fed.distributed.rank"], env=env,
                                      stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno()))
    return procs


def stop_ranks(procs: Sequence[subprocess.Popen], grace_s: float = 10.0, wait_s: float = 0.0) -> None:
    """Wait up to ``wait_s`` seconds for the ranks to end by themselves (after ``stop``), then SIGTERM every rank still
    running and SIGKILL the ones left after ``grace_s`` more seconds; reap them all."""
    deadline = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def describe_exit(code: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Watchdog:
    """Watches the ranks rank 0 started; :attr:`cause` names the first one that ended while the group was in use.

    ``on_death`` (optional) is called once, from the watchdog's thread, with that cause — e.g. to stop the other
    ranks, which would otherwise wait in a collective until its timeout.
    """

    def __init__(self, procs: Sequence[subprocess.Popen], first_rank: int = 1, poll_s: float = 0.2,
                 on_death=None) -> None:
        self.procs = list(procs)
        self.first_rank = first_rank
        self.cause: str | None = None
        self._stop = threading.Event()
        self._on_death = on_death
        self._poll_s = poll_s
        self._thread = threading.Thread(target=self._run, name="rank-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            for n, p in enumerate(self.procs):
                code = p.poll()
                if code is not None:
                    self.cause = f"rank {self.first_rank + n} (pid {p.pid}) {describe_exit(code)}"
                    if self._on_death is not None:
                        self._on_death(self.cause)
                    return

    def stop(self) -> None:
        """Stop watching (before the ranks are stopped on purpose)."""
        self._stop.set()
        self._thread.join(timeout=5)
