"""Flower ServerApp: the HACRL coordinator (ARCHITECTURE.md §2) on a Flower ``Grid``.

``main`` reads the resolved server config that ``hacrl-fed server`` wrote (its path arrives in the
run config as ``config-path``), loads the roster, the dataset, the prompt sampler and the verifier,
and runs :func:`hacrl_fed.coordinator.rounds.run_coordinator` (or, with ``run.mode = "async"``,
:func:`hacrl_fed.async_rounds.loop.run_async`) over :class:`FlowerTransport`.

:class:`FlowerTransport` maps the loop's three verbs onto Flower messages
(:mod:`hacrl_fed.flower.records`): one message per order with an explicit TTL (the phase
timeout), ``group_id`` = ``step-<t>/<verb>``, replies pulled every ``poll_s`` seconds until all are
in or the timeout passes (Grid.send_and_receive would poll every 3 s). An order lost in delivery, or
whose reply was lost on its way back (a connection cut), is found with a probe and sent again
(:class:`FlowerTransport`).
Error replies (worker failure, or Flower's synthetic NODE_UNAVAILABLE reply for a node that went offline) and
missing replies become ``Reply.error`` / ``timed_out``; nothing raises for a misbehaving node.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from hacrl_fed.config import ServerConfig
from hacrl_fed.async_rounds.loop import run_async
from hacrl_fed.coordinator.rounds import Node, Order, Reply, Setup, run_coordinator
from hacrl_fed.flower import records
from hacrl_fed.logs import log_to_stdout
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["FlowerTransport", "app", "load_resolved_config", "make_setup"]

log = logging.getLogger("hacrl_fed.coordinator")

app = ServerApp()


PROBE_AFTER_S = 30.0
"""Seconds an order may stay unanswered before its node is probed (:class:`FlowerTransport`): an order lost in
delivery goes again after about this long; an order answered within it costs no probe."""
PROBE_TTL_S = 60.0
"""TTL of a probe, in seconds: the time an idle SuperNode has to pull it and its ClientApp to answer. A busy node
never pulls it; it expires and the next probe follows."""
MAX_RESENDS = 3
"""Copies of one order sent again after a probe showed the previous copy lost, before the order counts as failed."""


@dataclass
class _Delivery:
    """One order on its way to one node: the copies sent, the probe outstanding."""

    order: Order
    content: RecordDict
    size: int
    copies: list[str] = field(default_factory=list)
    """Flower message ids of every copy sent (a reply to any of them answers the order)."""
    quiet_since: float = 0.0
    """Monotonic time of the last copy sent or probe expired: the next probe waits PROBE_AFTER_S from here."""
    probe: str = ""
    """Message id of the probe outstanding ('' if none)."""
    moved_on: float | None = None
    """When a probe answer showed the node past the order (None: not seen since the last copy was sent)."""


class _Pulls:
    """``grid.pull_messages([id])`` for each message id on its own daemon thread, so one reply that cannot be
    inflated does not hold up the others: Flower's ``HttpGrid.pull_messages`` waits in ``pull_objects`` until a
    reply's objects arrive, and when the SuperNode gave up pushing them (a retried PushObject after a cut
    answers ``stored=False``) that lasts until the object-push session expires (180 s) and ends in a
    MESSAGE_UNAVAILABLE error. ``threads=False`` pulls in the caller's thread (tests with a fake clock)."""

    def __init__(self, grid: Grid, clock: Callable[[], float], *, threads: bool = True) -> None:
        self.grid, self.clock, self.threads = grid, clock, threads
        self._lock = threading.Lock()
        self._started: dict[str, float] = {}
        """Message id → when its pull in flight started."""
        self._finished: dict[str, float] = {}
        """Message id → when its last finished pull had started."""
        self._done: list[Message] = []
        self._error: Exception | None = None

    def start(self, ids: Sequence[str]) -> None:
        """Start a pull for every id of ``ids`` with none in flight."""
        for mid in ids:
            with self._lock:
                if mid in self._started:
                    continue
                self._started[mid] = self.clock()
            if self.threads:
                threading.Thread(target=self._pull, args=(mid,), daemon=True, name="flower-pull").start()
            else:
                self._pull(mid)

    def take(self) -> list[Message]:
        """The messages pulled since the last call. Raises what a pull raised (the SuperLink failed or stopped the
        run), as ``grid.pull_messages`` would in the caller's thread."""
        with self._lock:
            done, self._done = self._done, []
            error, self._error = self._error, None
        if error is not None:
            raise error
        return done

    def settled(self, ids: Sequence[str], since: float, stall_s: float) -> bool:
        """True when every id of ``ids`` had a pull that started after ``since`` and finished, or has had one in
        flight since before ``since`` for ``stall_s`` or longer (a reply Flower holds, :class:`_Pulls`)."""
        now = self.clock()
        with self._lock:
            return all(self._finished.get(mid, -math.inf) > since
                       or (mid in self._started and self._started[mid] <= since and now - self._started[mid] >= stall_s)
                       for mid in ids)

    def _pull(self, mid: str) -> None:
        got: list[Message] = []
        try:
            got = list(self.grid.pull_messages([mid]))
        except Exception as err:  # noqa: BLE001 - handed to the caller by take()
            with self._lock:
                self._error = err
        with self._lock:
            self._done += got
            self._finished[mid] = self._started.pop(mid)


class FlowerTransport:
    """The :class:`~hacrl_fed.coordinator.rounds.Transport` over a Flower Grid.

    **Orders lost in delivery are sent again.** Flower 1.42 delivers a message at most once: the SuperLink marks
    an order delivered when it answers the SuperNode's pull (``get_message_ins``), before the answer reaches the
    node; if the connection is cut then, Flower's retried pull finds nothing and the order is never delivered
    again (it waits for a reply until its TTL). A SuperNode handles one message at a time, oldest first, and pulls
    the next only after pushing its reply. So when an order has been unanswered for ``probe_after_s``, its node
    gets a probe (``query.probe``, TTL ``probe_ttl_s``, one outstanding per node): a busy node never pulls it (it
    expires and another follows), but a probe *answered* while the order is not means the node has moved past the
    order without answering it. The order is then sent again (same content, TTL = what is left of the phase's
    timeout; the pool is de-duplicated on the SuperLink), at most ``max_resends`` times before it counts as an
    error. Cost: at most one extra ClientApp run per node and order that takes longer than ``probe_after_s``
    (the last probe, answered once the order is done).

    **Replies lost on their way back** are found the same way: when a cut makes the SuperNode give up pushing a
    reply's objects (Flower's PushObject is not idempotent: the retry of a stored object answers
    ``stored=False`` and the SuperNode drops the reply), the node moves on and answers the probe; the order goes
    again (a worker refuses to train a step twice, so a repeated train order cannot apply an update twice).
    Replies are pulled one message per thread (:class:`_Pulls`), so such a half-pushed reply, which Flower
    holds for 180 s, does not stall the other nodes' replies.

    **Exchanges may overlap** (asynchronous rounds send each node's order from its own thread): every exchange
    pulls only the replies to its own messages.
    """

    def __init__(self, grid: Grid, *, poll_s: float = 0.5, probe_after_s: float = PROBE_AFTER_S,
                 probe_ttl_s: float = PROBE_TTL_S, max_resends: int = MAX_RESENDS,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 pull_threads: bool = True) -> None:
        self.grid = grid
        self.pull_threads = pull_threads
        self.poll_s = poll_s
        self.clock, self.sleep = clock, sleep
        self.probe_after_s = probe_after_s
        self.probe_ttl_s = probe_ttl_s
        self.max_resends = max_resends

    def nodes(self) -> list[Node]:
        return [Node(int(n.node_id), str(n.name)) for n in self.grid.get_nodes()
                if str(getattr(n, "status", "online") or "online") == "online"]

    def exchange(self, orders: Sequence[Order], timeout_s: float) -> dict[int, Reply]:
        """Push one message per order (TTL ``timeout_s``), pull replies until all arrived or time is up; an order
        lost in delivery is sent again (class docstring). Never raises for a misbehaving node."""
        deadline = self.clock() + timeout_s
        pending = {o.node_id: _Delivery(o, c, records.content_bytes(c)) for o in orders for c in [_content(o)]}
        out: dict[int, Reply] = {}
        pulls = _Pulls(self.grid, self.clock, threads=self.pull_threads)  # this exchange's own: exchanges may overlap
        self._send(list(pending.values()), deadline, pending, out)
        while pending and self.clock() < deadline:
            self._collect(pending, out, deadline, pulls)
            self._probe(pending, deadline)
            if pending:
                self.sleep(min(self.poll_s, max(0.0, deadline - self.clock())))
        for nid, d in pending.items():
            out[nid] = Reply(nid, timed_out=True, bytes_out=d.size)
        return out

    def _send(self, deliveries: Sequence[_Delivery], deadline: float, pending: dict[int, _Delivery],
              out: dict[int, Reply]) -> None:
        """Push one copy of each delivery's order (TTL: the time left to ``deadline``); a copy the SuperLink
        refuses ends that delivery with an error reply."""
        ttl = max(1.0, deadline - self.clock())
        msgs = [Message(d.content, dst_node_id=d.order.node_id, message_type=_MESSAGE_TYPES[d.order.kind],
                        ttl=ttl, group_id=_group(d.order)) for d in deliveries]
        ids = list(self.grid.push_messages(msgs)) if msgs else []
        for i, d in enumerate(deliveries):
            nid = d.order.node_id
            if i < len(ids) and ids[i]:
                d.copies.append(ids[i])
                d.quiet_since, d.probe, d.moved_on = self.clock(), "", None
            else:
                pending.pop(nid, None)
                out[nid] = Reply(nid, error="the SuperLink did not accept the message (too large?)", bytes_out=d.size)

    def _collect(self, pending: dict[int, _Delivery], out: dict[int, Reply], deadline: float, pulls: _Pulls) -> None:
        """Pull the replies to every copy and probe outstanding; answered orders move from ``pending`` to ``out``;
        an order whose node answered a later probe, and whose copies then still had no reply, goes again."""
        copies = {mid: d for d in pending.values() for mid in d.copies}
        probes = {d.probe: d for d in pending.values() if d.probe}
        pulls.start([*copies, *probes])
        replies = pulls.take()
        for msg in replies:  # order replies first: a probe answered after its order changes nothing
            d = copies.get(msg.metadata.reply_to_message_id)
            if d is not None and pending.pop(d.order.node_id, None) is not None:
                out[d.order.node_id] = _reply(d.order.node_id, msg, d.size)
        for msg in replies:
            d = probes.get(msg.metadata.reply_to_message_id)
            if d is None or d.order.node_id not in pending:
                continue
            d.probe = ""
            if msg.has_error() and msg.error.code in _UNDELIVERED:  # expired unpulled (node busy), or node offline
                d.quiet_since = self.clock()
            elif d.moved_on is None:
                d.moved_on = self.clock()
        # lost only once the order's copies were pulled again after the probe answer: a reply pushed before the
        # probe was pulled may still be on its way here (being inflated by a pull in flight)
        lost = [d for d in pending.values()
                if d.moved_on is not None and pulls.settled(d.copies, d.moved_on, self.probe_after_s)]
        for d in lost:
            self._lost(d, pending, out, deadline)

    def _lost(self, d: _Delivery, pending: dict[int, _Delivery], out: dict[int, Reply], deadline: float) -> None:
        """The node answered a probe sent after ``d``'s order but not the order: send it again, or give up after
        ``max_resends`` copies (error reply naming the cause)."""
        nid, what = d.order.node_id, f"{d.order.kind} order to node {d.order.node_id}"
        if len(d.copies) > self.max_resends:
            pending.pop(nid)
            out[nid] = Reply(nid, bytes_out=d.size, error=f"the {what} got no reply {len(d.copies)} times although "
                             "the node answered later probes (order or reply lost on a cut connection)")
            log.error("%s", out[nid].error)
            return
        log.warning("the %s got no reply but the node answered a later probe (the order or its reply was lost on a "
                    "cut connection): sending it again (copy %d)", what, len(d.copies) + 1)
        self._send([d], deadline, pending, out)

    def _probe(self, pending: dict[int, _Delivery], deadline: float) -> None:
        """Send a probe to every node whose order has been quiet for ``probe_after_s`` and has none outstanding."""
        now = self.clock()
        due = [d for d in pending.values() if not d.probe and d.copies and now - d.quiet_since >= self.probe_after_s]
        if not due or deadline - now < 1.0:
            return
        ttl = min(self.probe_ttl_s, deadline - now)
        msgs = [Message(RecordDict(), dst_node_id=d.order.node_id, message_type=records.MSG_PROBE, ttl=ttl,
                        group_id=f"{_group(d.order)}/probe") for d in due]
        ids = list(self.grid.push_messages(msgs))
        for d, mid in zip(due, ids):
            d.probe, d.quiet_since = mid or "", now


_UNDELIVERED = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE)
"""Flower's synthetic error replies (``flwr/server/superlink/linkstate/utils.py``): the message expired (a probe:
not pulled within its TTL, or its reply came too late) or the node is offline. Any other reply to a probe, an
error of the ClientApp included, shows that the node pulled it."""

_MESSAGE_TYPES = {"generate": records.MSG_GENERATE, "train": records.MSG_TRAIN, "evaluate": records.MSG_EVALUATE}


def _content(order: Order) -> RecordDict:
    if order.kind == "generate":
        return records.generate_order(order.plan, notice=order.notice)
    if order.kind == "train":
        return records.train_order(order.plan, order.table, order.envelopes, checkpoint=order.checkpoint,
                                    next_plan=order.next_plan, checkpoint_every=order.checkpoint_every,
                                    notice=order.notice, peer_plans=order.peer_plans)
    if order.kind == "evaluate":
        return records.eval_order(order.request)
    raise ValueError(f"unknown order kind {order.kind!r}")


def _group(order: Order) -> str:
    if order.kind == "evaluate":
        return "evaluate"
    return f"step-{pb.RoundPlan.FromString(order.plan).step}/{order.kind}"


def _reply(node_id: int, msg: Message, bytes_out: int) -> Reply:
    if msg.has_error():
        return Reply(node_id, error=f"error {msg.error.code}: {msg.error.reason}", bytes_out=bytes_out)
    try:
        site = records.read_reply(msg.content)
    except records.ProtocolError as err:
        return Reply(node_id, error=f"unreadable reply: {err}", bytes_out=bytes_out)
    return Reply(node_id, site=site, bytes_out=bytes_out, bytes_in=records.content_bytes(msg.content))


def load_resolved_config(path: str | Path) -> ServerConfig:
    """The resolved ServerConfig JSON written by ``hacrl-fed server``. Raises ConfigError."""
    from hacrl_fed.config import ConfigError, format_validation_error
    from pydantic import ValidationError

    p = Path(path)
    try:
        return ServerConfig.model_validate_json(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{p}: cannot read the resolved server config: {err.strerror}") from None
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(p))) from None


def make_setup(cfg: ServerConfig, verify: Callable) -> Setup:
    """Roster, data, sampler and paths for :func:`run_coordinator`. Raises RosterError, DataError, ValueError."""
    from hacrl_fed.data.datasets import load_problems
    from hacrl_fed.data.sampler import PromptSampler
    from hacrl_fed.protocol.keys import Roster

    roster = Roster.load(cfg.roster)
    train, held_out = load_problems(cfg.run.data)
    sampler = PromptSampler(train, batch_size=cfg.run.prompts_per_step, seed=cfg.run.seed)
    run_dir = Path(cfg.run.output_dir) / cfg.run.run_id
    return Setup(run=cfg.run, roster=roster, verify=verify, sampler=sampler, run_dir=run_dir, held_out=held_out,
                 truncated_reward=cfg.verifier.truncated_reward)


def _setup_logging() -> None:
    log_to_stdout()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run (or resume) the HACRL run described by ``run_config["config-path"]``."""
    _setup_logging()
    path = str(context.run_config.get("config-path", ""))
    if not path:
        log.error("run config 'config-path' is empty: start runs with `hacrl-fed server --config ...`")
        raise SystemExit(2)
    from hacrl_fed.config import ConfigError
    from hacrl_fed.coordinator.state import StateError
    from hacrl_fed.data.problem import DataError
    from hacrl_fed.protocol.keys import RosterError
    from hacrl_fed.reward.verifier import Verifier

    try:
        cfg = load_resolved_config(path)
        with Verifier.from_config(cfg.verifier) as verifier:
            loop = run_async if cfg.run.mode == "async" else run_coordinator
            loop(make_setup(cfg, verifier.verify), FlowerTransport(grid))
    except (ConfigError, RosterError, DataError, StateError) as err:
        log.error("%s", err)  # one clear line instead of a traceback
        raise SystemExit(1) from None
