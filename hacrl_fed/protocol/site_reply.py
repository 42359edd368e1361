"""What a site's reply to an order carries, whatever carries it to the coordinator.

The site fills one per order (:mod:`hacrl_fed.site.courier`), the Flower adapter packs it into
message records and back (:mod:`hacrl_fed.flower.records`), and the coordinator's step loop reads
it (:class:`hacrl_fed.coordinator.rounds.Reply`). Protobuf messages stay serialized: ``envelope``
is a ``SignedEnvelope`` (generate), ``report`` a ``TrainReport`` (train), ``evaluation`` an
``EvaluateResponse`` (evaluate). Nothing in it is trusted: the coordinator verifies the envelope
and treats the agent name and the numbers as claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ALREADY_TRAINED", "SiteReply"]

ALREADY_TRAINED = "already trained:"
"""How a worker's refusal of a train order starts when its weights already hold that step (a re-sent order whose
first copy was trained): the coordinator counts it as trained (``reason = "already_trained"``), not as failed."""


@dataclass
class SiteReply:
    """Everything a reply can carry; absent parts are None / empty."""

    agent: str = ""
    version: str = ""
    envelope: bytes | None = None
    report: bytes | None = None
    evaluation: bytes | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    generate_metrics: dict[str, float] = field(default_factory=dict)
    generate_error: str = ""
    """Why the generation for the next plan failed after a successful training (train orders)."""
    checkpoint_error: str = ""
    """Why the checkpoint asked for after a successful training could not be saved (train orders)."""
