"""Flower ClientApp: a thin courier between the SuperNode and the site's agent worker.

Flower starts a fresh process for every message (flower-notes §5.1), so this module imports
nothing heavy (no torch, no transformers): it unpacks the order (:mod:`hacrl_fed.flower.records`),
lets the site make its local gRPC calls to the persistent worker whose address the site put in its
node config (:mod:`hacrl_fed.site.courier`), packs the reply, and turns a failure into a Flower
error reply. The worker verifies peers' signatures against the site's own roster before it trains;
nothing here trusts the coordinator.

Node config (``flower-supernode --node-config``): ``agent-name="org-a" worker-address="127.0.0.1:50051"
worker-token-file="/site/org-a/worker.token"``. The token file (mode 0600) holds the secret every call to the
worker carries (:mod:`hacrl_fed.protocol.worker_token`); it is read for each message, never passed on a
command line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from google.protobuf.message import DecodeError

from hacrl_fed import __version__
from hacrl_fed.flower import records
from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.protocol.worker_token import TokenFileError, read_token
from hacrl_fed.site import courier
from hacrl_fed.site.worker_link import WorkerError, WorkerLink, WorkerUnavailableError
from hacrl_fed.v1 import rollout_pb2 as rpb
from hacrl_fed.v1 import worker_pb2 as wpb

log = logging.getLogger("hacrl_fed.client_app")

REPLY_MARGIN_S = 5.0
"""Seconds of a message's TTL kept for packing and pushing the reply after the worker calls."""

app = ClientApp()


def _time_left(msg: Message) -> float:
    """Seconds until the message's TTL expires, minus :data:`REPLY_MARGIN_S`."""
    meta = msg.metadata
    return meta.created_at + meta.ttl - time.time() - REPLY_MARGIN_S


def _parse(cls, data: bytes, what: str):
    try:
        return cls.FromString(data)
    except DecodeError:
        raise records.ProtocolError(f"{what} is not a valid {cls.__name__}") from None


def _token(context: Context) -> str:
    """The worker token from the file the node config names. Raises WorkerError (one line)."""
    path = str(context.node_config.get("worker-token-file", ""))
    if not path:
        raise WorkerError("no worker token file configured (node_config worker-token-file)")
    try:
        return read_token(path)
    except TokenFileError as err:
        raise WorkerError(str(err)) from None


def _serve(msg: Message, context: Context, call: Callable[[WorkerLink, SiteReply], None]) -> Message:
    """Run ``call(link, reply)`` (it fills ``reply``) and turn every failure into an error reply."""
    agent = str(context.node_config.get("agent-name", ""))
    address = str(context.node_config.get("worker-address", ""))
    reply = SiteReply(agent=agent, version=__version__)
    t0 = time.time()
    try:
        with WorkerLink(address, token=_token(context)) as link:
            call(link, reply)
        reply.metrics["courier/worker_s"] = time.time() - t0
        return Message(records.reply_content(reply), reply_to=msg)
    except records.ProtocolError as err:
        code, reason = records.ERROR_BAD_ORDER, f"bad order: {err}"
    except WorkerUnavailableError as err:
        code, reason = records.ERROR_WORKER_UNAVAILABLE, str(err)
    except WorkerError as err:
        code, reason = records.ERROR_WORKER, str(err)
    log.error("%s %s of %s not carried out, the coordinator gets an error reply: %s", msg.metadata.group_id or "-",
              msg.metadata.message_type, agent or "?", reason)  # on the site's terminal (executor output)
    return Message(Error(code=code, reason=f"{agent or '?'}: {reason}"), reply_to=msg)


@app.query("generate")
def generate(msg: Message, context: Context) -> Message:
    """RoundPlan → worker Generate → signed envelope."""

    def call(link: WorkerLink, reply: SiteReply) -> None:
        plan = _parse(rpb.RoundPlan, records.read_generate_order(msg.content), "round-plan")
        courier.generate(link, plan, reply, lambda: _time_left(msg), notice=records.read_notice(msg.content))

    return _serve(msg, context, call)


@app.train("update")
def train(msg: Message, context: Context) -> Message:
    """Pool + CapabilityTable → worker Train (it verifies the peers' signatures itself) → TrainReport;
    then Checkpoint(SAVE) when asked, then Generate for the next plan when the order carries one. The
    worker refuses to start training after the message's TTL (minus the reply margin): by then the
    coordinator has recorded the step as failed here."""

    def call(link: WorkerLink, reply: SiteReply) -> None:
        order = records.read_train_order(msg.content)
        plan = _parse(rpb.RoundPlan, order.plan, "round-plan")
        next_plan = _parse(rpb.RoundPlan, order.next_plan, "next-round-plan") if order.next_plan else None
        request = wpb.TrainRequest(
            run_id=plan.run_id, step=plan.step, plan=plan,
            capabilities=_parse(rpb.CapabilityTable, order.table, "capability-table"),
            envelopes=[_parse(rpb.SignedEnvelope, env, f"pool.{name}") for name, env in sorted(order.envelopes.items())],
            deadline_unix_s=time.time() + _time_left(msg), notice=order.notice,
            peer_plans=[_parse(rpb.RoundPlan, p, f"peer-round-plans[{i}]") for i, p in enumerate(order.peer_plans)],
        )
        if order.checkpoint_every is not None:
            request.checkpoint_every = max(0, min(int(order.checkpoint_every), 2**32 - 1))
        courier.train(link, request, reply, lambda: _time_left(msg), checkpoint=order.checkpoint, next_plan=next_plan)

    return _serve(msg, context, call)


@app.evaluate("heldout")
def evaluate(msg: Message, context: Context) -> Message:
    """EvaluateRequest (held-out prompts) → worker Evaluate → EvaluateResponse."""

    def call(link: WorkerLink, reply: SiteReply) -> None:
        request = _parse(wpb.EvaluateRequest, records.read_eval_order(msg.content), "eval request")
        courier.evaluate(link, request, reply, lambda: _time_left(msg))

    return _serve(msg, context, call)


@app.query("probe")
def probe(msg: Message, context: Context) -> Message:
    """Empty reply at once, no worker call: it tells the coordinator that this node has moved past its last order
    (a node handles one message at a time), so that order was lost on its way here and is sent again
    (:class:`hacrl_fed.flower.server_app.FlowerTransport`)."""
    return Message(RecordDict(), reply_to=msg)
