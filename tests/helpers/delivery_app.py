"""A ServerApp for the delivery tests (tests/flower/test_delivery_relay.py): one generate order through
:class:`~hacrl_fed.flower.server_app.FlowerTransport` to the first node online, its reply written as JSON.

Run config: ``out-path`` (where the JSON goes), ``timeout-s`` (the exchange's timeout, seconds). The JSON:
``{"node": id, "timed_out": bool, "error": str, "step": int | null, "exchange_s": float}``.
"""

from __future__ import annotations

import json
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


@app.main()
def main(grid: Grid, context: Context) -> None:
    log_to_stdout()
    transport = FlowerTransport(grid)
    while not (nodes := transport.nodes()):
        time.sleep(0.2)
    node = nodes[0].node_id
    t0 = time.monotonic()
    order = Order(node, "generate", plan=make_plan(step=1).SerializeToString())
    reply = transport.exchange([order], float(context.run_config["timeout-s"]))[node]
    envelope = reply.site.envelope
    step = pb.RolloutBatch.FromString(pb.SignedEnvelope.FromString(envelope).payload).step if envelope else None
    result = {"node": node, "timed_out": reply.timed_out, "error": reply.error, "step": step,
              "exchange_s": time.monotonic() - t0}
    Path(str(context.run_config["out-path"])).write_text(json.dumps(result), encoding="utf-8")
