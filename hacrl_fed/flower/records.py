"""The coordinator ↔ site message contents on Flower records (ARCHITECTURE.md §3).

Three verbs, each one Flower message and its reply (and a probe, the transport's own):

==================== ============================================ =====================================
message type         order (coordinator → site)                   reply (site → coordinator)
==================== ============================================ =====================================
``query.generate``   ``plan``: ``round-plan``                     ``rollouts``: ``envelope``
``train.update``     ``pool``: agent → envelope;                  ``report``: ``train-report``;
                     ``plan``: ``round-plan``,                    with a next plan also ``rollouts``
                     ``capability-table``, ``checkpoint``,        (or ``site.generate-error``) and
                     optional ``next-round-plan``                 ``generate-metrics``
``evaluate.heldout`` ``eval``: ``request``                        ``eval``: ``response``
``query.probe``      (empty: is the node past its order?)         (empty)
==================== ============================================ =====================================

A train order may carry the next step's plan (ARCHITECTURE §2: "the train message for step t may
carry step t+1's plan"): the site trains, then generates for the next step, and one round trip
serves both phases. Every reply carries ``site`` (ConfigRecord: ``agent-name``, the package
``version``) and ``metrics`` (MetricRecord: the worker's numbers and ``courier/worker_s``, the
time spent inside worker calls). Protobuf messages travel as serialized bytes in ConfigRecords;
signed envelopes as ``Array(dtype="uint8", stype="hacrl.SignedEnvelope.v1")`` in ArrayRecords
(Flower chunks and de-duplicates those, so the pool is uploaded once for all recipients).

:func:`read_reply` raises :class:`ProtocolError` for anything malformed; it never trusts the
other side. Besides ``flwr.app`` it imports only the plain
:class:`~hacrl_fed.protocol.site_reply.SiteReply` (the ClientApp must start fast).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from hacrl_fed.protocol.plans import MAX_PEER_PLANS
from hacrl_fed.protocol.site_reply import SiteReply

__all__ = [
    "ENVELOPE_STYPE",
    "ERROR_BAD_ORDER",
    "ERROR_WORKER",
    "ERROR_WORKER_UNAVAILABLE",
    "MSG_EVALUATE",
    "MSG_GENERATE",
    "MSG_PROBE",
    "MSG_TRAIN",
    "ProtocolError",
    "TrainOrder",
    "content_bytes",
    "envelope_array",
    "eval_order",
    "generate_order",
    "read_eval_order",
    "read_generate_order",
    "read_notice",
    "read_reply",
    "read_train_order",
    "reply_content",
    "train_order",
]

MSG_GENERATE = "query.generate"
MSG_TRAIN = "train.update"
MSG_EVALUATE = "evaluate.heldout"
MSG_PROBE = "query.probe"
"""Empty message the coordinator sends to a node whose order stays unanswered; the ClientApp answers it at once
with an empty reply (:class:`hacrl_fed.flower.server_app.FlowerTransport` says why)."""
ENVELOPE_STYPE = "hacrl.SignedEnvelope.v1"

ERROR_WORKER_UNAVAILABLE = 1001
"""Error-reply code: the site's worker did not answer (down, starting, deadline exceeded)."""
ERROR_WORKER = 1002
"""Error-reply code: the worker refused or failed the request (its status and message follow)."""
ERROR_BAD_ORDER = 1003
"""Error-reply code: the order was malformed."""


class ProtocolError(ValueError):
    """A record is missing, has the wrong type, or carries malformed bytes."""


def envelope_array(data: bytes) -> Array:
    """Wrap serialized ``SignedEnvelope`` bytes as a uint8 Array with the envelope stype."""
    return Array(dtype="uint8", shape=(len(data),), stype=ENVELOPE_STYPE, data=bytes(data))


def _array_bytes(arr: object, where: str) -> bytes:
    if not isinstance(arr, Array) or arr.dtype != "uint8" or arr.stype != ENVELOPE_STYPE:
        kind = f"{arr.dtype}/{arr.stype}" if isinstance(arr, Array) else type(arr).__name__
        raise ProtocolError(f"{where}: expected a uint8 Array with stype {ENVELOPE_STYPE}, got {kind}")
    if list(arr.shape) != [len(arr.data)]:
        raise ProtocolError(f"{where}: array shape {list(arr.shape)} does not match its {len(arr.data)} bytes")
    return bytes(arr.data)


def _record(content: RecordDict, name: str, kind: type, *, required: bool = True):
    rec = content.get(name) if isinstance(content, RecordDict) else None
    if rec is None and not required:
        return None
    if not isinstance(rec, kind):
        raise ProtocolError(f"missing {kind.__name__} {name!r}")
    return rec


def _value(rec: ConfigRecord | None, key: str, kind: type, where: str, default=None):
    value = rec.get(key, default) if rec is not None else default
    if value is not default and not isinstance(value, kind):
        raise ProtocolError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _blob(content: RecordDict, record: str, key: str) -> bytes:
    value = _value(_record(content, record, ConfigRecord), key, bytes, record)
    if value is None:
        raise ProtocolError(f"{record}.{key}: missing")
    return value


def _metrics(values: Mapping[str, float]) -> MetricRecord:
    return MetricRecord({str(k): float(v) for k, v in values.items()
                         if isinstance(v, int | float) and math.isfinite(v)})


MAX_METRICS = 256
"""Metric entries kept from one reply record (a hostile site must not bloat the coordinator's log)."""
MAX_TEXT = 1000
"""Characters kept of a reply's free-text fields."""


def _read_metrics(content: RecordDict, name: str) -> dict[str, float]:
    rec = content.get(name)
    if not isinstance(rec, MetricRecord):
        return {}
    items = [(str(k)[:128], float(v)) for k, v in rec.items() if isinstance(v, int | float)]
    return dict(items[:MAX_METRICS])


# ----------------------------------------------------------------------------- orders


def generate_order(plan: bytes, *, notice: str = "") -> RecordDict:
    """Generate order: the serialized RoundPlan, and what the site is told (``notice``, optional)."""
    cfg = ConfigRecord({"round-plan": plan})
    if notice:
        cfg["notice"] = notice
    return RecordDict({"plan": cfg})


def read_notice(content: RecordDict) -> str:
    """The ``notice`` of a generate or train order (what the coordinator tells the site), '' if none; at most
    :data:`MAX_TEXT` characters. Raises ProtocolError when it is not a string."""
    cfg = _record(content, "plan", ConfigRecord, required=False)
    return _value(cfg, "notice", str, "plan", "")[:MAX_TEXT]


def read_generate_order(content: RecordDict) -> bytes:
    """Serialized RoundPlan of a generate order. Raises ProtocolError."""
    return _blob(content, "plan", "round-plan")


@dataclass(frozen=True)
class TrainOrder:
    """A train order as the site reads it (all protobufs still serialized)."""

    plan: bytes
    table: bytes
    envelopes: dict[str, bytes]
    checkpoint: bool = False
    next_plan: bytes = b""
    """The next step's RoundPlan to generate for right after training (empty: none)."""
    checkpoint_every: int | None = None
    """The run's checkpoint interval (0: never; None: not said)."""
    notice: str = ""
    peer_plans: tuple[bytes, ...] = ()
    """Asynchronous runs: the serialized RoundPlans that pooled peer batches of other steps answer."""


def train_order(plan: bytes, table: bytes, envelopes: Mapping[str, bytes], *, checkpoint: bool = False,
                next_plan: bytes = b"", checkpoint_every: int | None = None, notice: str = "",
                peer_plans: Sequence[bytes] = ()) -> RecordDict:
    """Train order: pooled envelopes by pool key (the agent; ``agent@step`` in asynchronous runs), RoundPlan,
    CapabilityTable, checkpoint flag, next plan, and (optional) the run's checkpoint interval, what the site is
    told and the plans of peer batches of other steps (``peer_plans``, asynchronous runs)."""
    pool = ArrayRecord({agent: envelope_array(env) for agent, env in envelopes.items()})
    cfg = ConfigRecord({"round-plan": plan, "capability-table": table, "checkpoint": bool(checkpoint)})
    if next_plan:
        cfg["next-round-plan"] = next_plan
    if peer_plans:
        cfg["peer-round-plans"] = [bytes(p) for p in peer_plans]
    if checkpoint_every is not None:
        cfg["checkpoint-every"] = int(checkpoint_every)
    if notice:
        cfg["notice"] = notice
    return RecordDict({"pool": pool, "plan": cfg})


def read_train_order(content: RecordDict) -> TrainOrder:
    """Raises ProtocolError."""
    pool = _record(content, "pool", ArrayRecord)
    cfg = _record(content, "plan", ConfigRecord)
    return TrainOrder(
        plan=_blob(content, "plan", "round-plan"), table=_blob(content, "plan", "capability-table"),
        envelopes={str(k): _array_bytes(v, f"pool.{k}") for k, v in pool.items()},
        checkpoint=_value(cfg, "checkpoint", bool, "plan", False),
        next_plan=_value(cfg, "next-round-plan", bytes, "plan", b""),
        checkpoint_every=_value(cfg, "checkpoint-every", int, "plan", None),
        notice=read_notice(content),
        peer_plans=_peer_plans(cfg),
    )


def _peer_plans(cfg: ConfigRecord) -> tuple[bytes, ...]:
    """The ``peer-round-plans`` of a train order: a list of at most :data:`MAX_PEER_PLANS` byte strings, or none.
    Raises ProtocolError."""
    value = cfg.get("peer-round-plans", [])
    if not isinstance(value, list) or not all(isinstance(v, bytes) for v in value):
        raise ProtocolError("plan.peer-round-plans must be a list of bytes")
    if len(value) > MAX_PEER_PLANS:
        raise ProtocolError(f"plan.peer-round-plans holds {len(value)} plans, at most {MAX_PEER_PLANS}")
    return tuple(value)


def eval_order(request: bytes) -> RecordDict:
    """Evaluate order: the serialized EvaluateRequest."""
    return RecordDict({"eval": ConfigRecord({"request": request})})


def read_eval_order(content: RecordDict) -> bytes:
    return _blob(content, "eval", "request")


# ----------------------------------------------------------------------------- replies


def reply_content(reply: SiteReply) -> RecordDict:
    """Pack a site's reply."""
    site: dict[str, str] = {"agent-name": reply.agent, "version": reply.version}
    if reply.generate_error:
        site["generate-error"] = reply.generate_error
    if reply.checkpoint_error:
        site["checkpoint-error"] = reply.checkpoint_error
    records: dict = {"site": ConfigRecord(site), "metrics": _metrics(reply.metrics)}
    if reply.envelope is not None:
        records["rollouts"] = ArrayRecord({"envelope": envelope_array(reply.envelope)})
        if reply.generate_metrics:
            records["generate-metrics"] = _metrics(reply.generate_metrics)
    if reply.report is not None:
        records["report"] = ConfigRecord({"train-report": reply.report})
    if reply.evaluation is not None:
        records["eval"] = ConfigRecord({"response": reply.evaluation})
    return RecordDict(records)


def read_reply(content: RecordDict) -> SiteReply:
    """Unpack a site's reply. Raises ProtocolError when a present part is malformed."""
    if not isinstance(content, RecordDict):
        raise ProtocolError("reply has no content")
    site = _record(content, "site", ConfigRecord, required=False)
    out = SiteReply(agent=_value(site, "agent-name", str, "site", "")[:MAX_TEXT],
                    version=_value(site, "version", str, "site", "")[:MAX_TEXT],
                    generate_error=_value(site, "generate-error", str, "site", "")[:MAX_TEXT],
                    checkpoint_error=_value(site, "checkpoint-error", str, "site", "")[:MAX_TEXT],
                    metrics=_read_metrics(content, "metrics"),
                    generate_metrics=_read_metrics(content, "generate-metrics"))
    rollouts = _record(content, "rollouts", ArrayRecord, required=False)
    if rollouts is not None:
        if "envelope" not in rollouts:
            raise ProtocolError("rollouts: no 'envelope' array")
        out.envelope = _array_bytes(rollouts["envelope"], "rollouts.envelope")
    if content.get("report") is not None:
        out.report = _blob(content, "report", "train-report")
    if content.get("eval") is not None:
        out.evaluation = _blob(content, "eval", "response")
    return out


def content_bytes(content: RecordDict) -> int:
    """Bytes this content occupies on the wire: the sum of its serialized Flower objects
    (records, arrays, 5 MiB chunks), as they are pushed to and pulled from the SuperLink."""
    try:
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

        return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())
    except (ImportError, AttributeError):  # pragma: no cover - internal API moved: payload bytes instead
        return sum(rec.count_bytes() for rec in content.values())
