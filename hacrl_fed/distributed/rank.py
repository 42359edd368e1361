"""A rank other than 0 of a site's sharded trainer: ``python -m hacrl_fed.distributed.rank``.

Started by the site's worker (rank 0) on its own machine, or by ``torchrun`` on another machine of the site
(docs/distributed.md). It joins the group, builds its shards from rank 0's weights and then runs each command rank 0
broadcasts (update, gather, save, load, load_full) until ``stop``. Settings come from rank 0; the rank reads only the
rendezvous: ``HACRL_DIST_ADDR``, ``HACRL_DIST_PORT``, ``HACRL_DIST_WORLD``, ``HACRL_DIST_TIMEOUT_S``,
``HACRL_DIST_DEVICE`` and ``HACRL_DIST_RANK`` (or ``HACRL_DIST_FIRST_RANK`` + torchrun's ``LOCAL_RANK``).

Any failure ends the process with a one-line cause on stderr and exit code 1 (a native crash: the Python stack of every
thread, from :mod:`faulthandler`); rank 0 then restarts the group. A rank
started by the worker also ends when the worker does (``HACRL_DIST_PARENT``).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

COMMANDS = ("update", "gather", "save", "load", "load_full")


def _rank_from_env(env) -> tuple[int, int]:
    world = int(env["HACRL_DIST_WORLD"])
    if "HACRL_DIST_RANK" in env:
        rank = int(env["HACRL_DIST_RANK"])
    else:
        rank = int(env["HACRL_DIST_FIRST_RANK"]) + int(env.get("LOCAL_RANK", "0"))
    if not 1 <= rank < world:
        raise ValueError(f"rank {rank} is not in 1..{world - 1} (rank 0 is the site's worker)")
    return rank, world


def _follow_parent(parent: int) -> None:
    """End this process when the worker that started it is gone (a SIGKILLed worker runs no clean-up)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(env=os.environ) -> None:
    """Join the group and run rank 0's commands until ``stop``."""
    import torch.distributed as dist

    import transformers  # noqa: F401 - imported before the group forms: a slow import counts in no collective

    from hacrl_fed.distributed.group import broadcast, init_group
    from hacrl_fed.distributed.ranks import RankState

    if env.get("HACRL_DIST_PARENT"):
        _follow_parent(int(env["HACRL_DIST_PARENT"]))
    rank, world = _rank_from_env(env)
    mesh = init_group(rank, world, env["HACRL_DIST_ADDR"], int(env["HACRL_DIST_PORT"]),
                      env.get("HACRL_DIST_DEVICE", "cpu"), float(env.get("HACRL_DIST_TIMEOUT_S", "300")))
    state = RankState(broadcast(), mesh, None)
    while True:
        name, payload = broadcast()
        if name == "stop":
            break
        if name not in COMMANDS:
            raise ValueError(f"unknown command {name!r} from rank 0")
        fn = getattr(state, name)
        fn() if name == "gather" else fn(payload)
    dist.destroy_process_group()


def main() -> int:
    faulthandler.enable()   # a native crash (signal) leaves this rank's Python stack in the site's log
    try:
        serve()
    except KeyboardInterrupt:
        return 1
    except Exception as err:  # noqa: BLE001 - one line for the site's log, whatever failed
        rank = os.environ.get("HACRL_DIST_RANK", "?")
        print(f"hacrl-fed rank {rank}: {type(err).__name__}: {' '.join(str(err).split())[:500]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
