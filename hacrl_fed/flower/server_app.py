"""Flower ServerApp: the HACRL coordinator (ARCHITECTURE.md §2) on a Flower ``Grid``.

``main`` reads the resolved server config that ``hacrl-fed server`` wrote (its path arrives in the
run config as ``config-path``), loads the roster, the dataset, the prompt sampler and the verifier,
and runs :func:`hacrl_fed.coordinator.rounds.run_coordinator` over :class:`FlowerTransport`.

:class:`FlowerTransport` maps the loop's three verbs onto Flower messages
(:mod:`hacrl_fed.flower.records`): one message per order with an explicit TTL (the phase
timeout), ``group_id`` = ``step-<t>/<verb>``, replies pulled every ``poll_s`` seconds until all are
in or the timeout passes (Grid.send_and_receive would poll every 3 s). Error replies (worker failure, or Flower's synthetic NODE_UNAVAILABLE
reply for a node that went offline) and missing replies become ``Reply.error`` / ``timed_out``;
nothing raises for a misbehaving node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from hacrl_fed.config import ServerConfig
from hacrl_fed.coordinator.rounds import Node, Order, Reply, Setup, run_coordinator
from hacrl_fed.flower import records
from hacrl_fed.logs import log_to_stdout
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["FlowerTransport", "app", "load_resolved_config", "make_setup"]

log = logging.getLogger("hacrl_fed.coordinator")

app = ServerApp()


class FlowerTransport:
    """The :class:`~hacrl_fed.coordinator.rounds.Transport` over a Flower Grid."""

    def __init__(self, grid: Grid, *, poll_s: float = 0.5) -> None:
        self.grid = grid
        self.poll_s = poll_s

    def nodes(self) -> list[Node]:
        return [Node(int(n.node_id), str(n.name)) for n in self.grid.get_nodes()
                if str(getattr(n, "status", "online") or "online") == "online"]

    def exchange(self, orders: Sequence[Order], timeout_s: float) -> dict[int, Reply]:
        """Push one message per order (TTL ``timeout_s``), pull replies until all arrived or time is up."""
        deadline = time.monotonic() + timeout_s
        contents = {o.node_id: _content(o) for o in orders}
        sizes = {nid: records.content_bytes(c) for nid, c in contents.items()}
        msgs = [Message(contents[o.node_id], dst_node_id=o.node_id, message_type=_MESSAGE_TYPES[o.kind],
                        ttl=timeout_s, group_id=_group(o)) for o in orders]
        ids = list(self.grid.push_messages(msgs)) if msgs else []
        out: dict[int, Reply] = {}
        pending: dict[str, int] = {}
        for i, o in enumerate(orders):
            msg_id = ids[i] if i < len(ids) else None
            if msg_id:
                pending[msg_id] = o.node_id
            else:
                out[o.node_id] = Reply(o.node_id, error="the SuperLink did not accept the message (too large?)")
        while pending and time.monotonic() < deadline:
            for msg in self.grid.pull_messages(list(pending)):
                nid = pending.pop(msg.metadata.reply_to_message_id, None)
                if nid is not None:
                    out[nid] = _reply(nid, msg, sizes[nid])
            if pending:
                time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        for nid in pending.values():
            out[nid] = Reply(nid, timed_out=True, bytes_out=sizes[nid])
        return out


_MESSAGE_TYPES = {"generate": records.MSG_GENERATE, "train": records.MSG_TRAIN, "evaluate": records.MSG_EVALUATE}


def _content(order: Order) -> RecordDict:
    if order.kind == "generate":
        return records.generate_order(order.plan, notice=order.notice)
    if order.kind == "train":
        return records.train_order(order.plan, order.table, order.envelopes, checkpoint=order.checkpoint,
                                    next_plan=order.next_plan, checkpoint_every=order.checkpoint_every,
                                    notice=order.notice)
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
            run_coordinator(make_setup(cfg, verifier.verify), FlowerTransport(grid))
    except (ConfigError, RosterError, DataError, StateError) as err:
        log.error("%s", err)  # one clear line instead of a traceback
        raise SystemExit(1) from None
