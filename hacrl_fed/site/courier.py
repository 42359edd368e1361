"""What a site does with each order of the coordinator: the calls to its agent worker.

The Flower ClientApp (:mod:`hacrl_fed.flower.client_app`) unpacks an order from its message
records and hands the decoded protobufs to one function here, with the
:class:`~hacrl_fed.site.worker_link.WorkerLink` of that message and the
:class:`~hacrl_fed.protocol.site_reply.SiteReply` to fill:

* :func:`generate` — RoundPlan → worker Generate → signed envelope;
* :func:`train` — pool + CapabilityTable → worker Train (it verifies the peers' signatures itself)
  → TrainReport; then Checkpoint(SAVE) when asked, then Generate for the next plan when the order
  carries one (a failed checkpoint or generation does not lose the training result);
* :func:`evaluate` — held-out prompts → worker Evaluate → EvaluateResponse.

``time_left()`` is the number of seconds the next worker call may take (the message's TTL minus
a margin for the reply). Worker failures raise :class:`~hacrl_fed.site.worker_link.WorkerError`,
which the ClientApp turns into an error reply. Nothing here trusts the coordinator, and nothing is
heavy (no torch): Flower runs the ClientApp in a fresh process for every message.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.site.worker_link import WorkerError, WorkerLink
from hacrl_fed.v1 import rollout_pb2 as rpb
from hacrl_fed.v1 import worker_pb2 as wpb

__all__ = ["evaluate", "generate", "train"]

TimeLeft = Callable[[], float]


def generate(link: WorkerLink, plan: rpb.RoundPlan, reply: SiteReply, time_left: TimeLeft, *,
             notice: str = "") -> None:
    """RoundPlan → worker Generate → signed envelope. ``notice`` (what the coordinator tells the site)
    goes to the worker, whose log line the site's terminal shows."""
    res = link.generate(plan, timeout_s=time_left(), notice=notice)
    reply.envelope, reply.metrics = res.envelope.SerializeToString(), dict(res.metrics)


def train(link: WorkerLink, request: wpb.TrainRequest, reply: SiteReply, time_left: TimeLeft, *,
          checkpoint: bool = False, next_plan: rpb.RoundPlan | None = None) -> None:
    """Worker Train → TrainReport; then Checkpoint(SAVE) if ``checkpoint``; then Generate for ``next_plan``.

    A failed checkpoint does not lose the training result (the update is applied): it goes back as
    ``reply.checkpoint_error`` with the report."""
    report = link.train(request, timeout_s=time_left())
    reply.report, reply.metrics = report.SerializeToString(), dict(report.metrics)
    if checkpoint:
        t0 = time.time()
        try:
            link.checkpoint(timeout_s=time_left())
        except WorkerError as err:  # the worker logged it on the site's terminal; the coordinator is told
            reply.checkpoint_error = str(err)
        reply.metrics["time/checkpoint_s"] = time.time() - t0
    if next_plan is not None:
        try:
            res = link.generate(next_plan, timeout_s=time_left())
        except WorkerError as err:  # the training result still goes back
            reply.generate_error = str(err)
        else:
            reply.envelope, reply.generate_metrics = res.envelope.SerializeToString(), dict(res.metrics)


def evaluate(link: WorkerLink, request: wpb.EvaluateRequest, reply: SiteReply, time_left: TimeLeft) -> None:
    """EvaluateRequest (held-out prompts) → worker Evaluate → EvaluateResponse."""
    res = link.evaluate(request, timeout_s=time_left())
    reply.evaluation, reply.metrics = res.SerializeToString(), dict(res.metrics)
