"""A ServerApp for the delivery tests and measurements: orders sent with the coordinator's
:class:`~hacrl_fed.flower.server_app.FlowerTransport`, the replies written as JSON.

Run config: ``out-path`` (where the JSON goes), ``timeout-s`` (each exchange's timeout, seconds); optional
``nodes`` (how many nodes to wait for, default 1), ``exchanges`` (how many in a row, default 1), ``kind``
(``generate``, default, or ``train``: a train order with the next plan, as the coordinator sends) and ``pool-mib``
(size of the pool a train order carries, MiB). The JSON: a list, one entry per exchange and node::

    {"exchange": i, "node": id, "timed_out": bool, "error": str, "step": int | null, "exchange_s": float}

Used by tests/flower/test_delivery_relay.py and benchmarks/bench_delivery_cuts.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedutil import make_plan
from hacrl_fed.coordinator.rounds import Order
from hacrl_fed.flower.server_app import FlowerTransport
from hacrl_fed.logs import log_to_stdout
from hacrl_fed.v1 import rollout_pb2 as pb

app = ServerApp()


def _order(node: int, step: int, kind: str, pool: dict[str, bytes]) -> Order:
    plan = make_plan(step=step).SerializeToString()
    if kind == "generate":
        return Order(node, "generate", plan=plan)
    return Order(node, "train", plan=plan, envelopes=pool, next_plan=make_plan(step=step + 1).SerializeToString())


def _pool(mib: float) -> dict[str, bytes]:
    """Two envelopes of ``mib`` / 2 MiB of random bytes each (the site's courier only parses them)."""
    size = int(mib * 2**20 / 2)
    return {a: pb.SignedEnvelope(payload=os.urandom(size), key_id=a).SerializeToString() for a in ("p", "q")}


def _step(envelope: bytes | None) -> int | None:
    return pb.RolloutBatch.FromString(pb.SignedEnvelope.FromString(envelope).payload).step if envelope else None


@app.main()
def main(grid: Grid, context: Context) -> None:
    log_to_stdout()
    cfg = context.run_config
    transport = FlowerTransport(grid)
    while len(nodes := transport.nodes()) < int(cfg.get("nodes", 1)):
        time.sleep(0.2)
    kind = str(cfg.get("kind", "generate"))
    pool = _pool(float(cfg.get("pool-mib", 1.0))) if kind == "train" else {}
    results = []
    for i in range(int(cfg.get("exchanges", 1))):
        t0 = time.monotonic()
        replies = transport.exchange([_order(n.node_id, i + 1, kind, pool) for n in nodes], float(cfg["timeout-s"]))
        for nid, reply in replies.items():
            results.append({"exchange": i, "node": nid, "timed_out": reply.timed_out, "error": reply.error,
                            "step": _step(reply.site.envelope), "exchange_s": time.monotonic() - t0})
    out = Path(str(cfg["out-path"]))
    out.with_suffix(".tmp").write_text(json.dumps(results), encoding="utf-8")
    out.with_suffix(".tmp").replace(out)  # whole or absent: the test waits for it
