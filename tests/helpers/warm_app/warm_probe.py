"""Probe app (tests/flower/test_executor.py): each ClientApp reply says in which process it ran, in which
process this module was imported, and the CPU seconds its process had used when the handler started; with
``fail`` the ServerApp then sends one order whose handler raises."""

from __future__ import annotations

import json
import os
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

IMPORTED_IN = os.getpid()

client = ClientApp()
server = ServerApp()


@client.query("probe")
def probe(msg: Message, context: Context) -> Message:
    cpu_s = time.process_time()
    rec = ConfigRecord({"pid": os.getpid(), "imported-in": IMPORTED_IN, "cpu-s": cpu_s})
    return Message(RecordDict({"probe": rec}), reply_to=msg)


@client.query("fail")
def fail(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"probe": ConfigRecord({"quotient": 1 // 0})}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    want = int(context.run_config["nodes"])
    deadline = time.monotonic() + 120
    while len(nodes := list(grid.get_node_ids())) < want and time.monotonic() < deadline:
        time.sleep(0.5)
    out = {"server": {"pid": os.getpid(), "imported-in": IMPORTED_IN, "cpu-s": time.process_time()}, "replies": []}
    for r in range(int(context.run_config["rounds"])):
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.probe", group_id=f"round-{r}") for n in nodes]
        for reply in grid.send_and_receive(msgs, timeout=120):
            out["replies"].append({"error": reply.error.reason} if reply.has_error()
                                  else dict(reply.content["probe"]))
    if context.run_config["fail"]:
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.fail", group_id="fail") for n in nodes]
        replies = grid.send_and_receive(msgs, timeout=120)
        out["failed"] = [r.error.reason if r.has_error() else "no error" for r in replies]
    with open(str(context.run_config["out"]), "w", encoding="utf-8") as f:
        json.dump(out, f)
