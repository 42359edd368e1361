"""The screens' statistics and decisions (pure, no I/O): likelihood, answer tail and length, quarantine.

What each decides, why, and the sources are the module docstring of :mod:`hacrl_fed.screen_config` (the
settings, beside the other TOML sections); :class:`hacrl_fed.screens.SiteGuard` applies them to a step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from hacrl_fed.screen_config import LikelihoodScreenConfig, QuarantineConfig, TailScreenConfig

__all__ = [
    "LikelihoodDecision",
    "SourceStanding",
    "TailDecision",
    "length_reference",
    "likelihood_decision",
    "per_byte_loglik",
    "quarantine_step",
    "release",
    "robust_center_scale",
    "robust_z",
    "step_flagged",
    "tail_decision",
]

MAD_TO_SIGMA = 1.4826
"""1 / Φ⁻¹(3/4): 1.4826 · MAD estimates σ for normal data."""


# ----------------------------------------------------------------------------- statistics


def per_byte_loglik(logprob_sum: float, content_bytes: int) -> float:
    """ℓ = Σ log π / B: nats per UTF-8 byte of content (B floored at 1). Pure arithmetic."""
    return float(logprob_sum) / max(1, int(content_bytes))


def robust_center_scale(values: Sequence[float], min_scale: float) -> tuple[float, float]:
    """(median, max(1.4826 · MAD, ``min_scale``)) of ``values``. Raises ``ValueError`` when empty."""
    if not values:
        raise ValueError("robust_center_scale needs at least one value")
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med, max(MAD_TO_SIGMA * mad, min_scale)


def robust_z(value: float, values: Sequence[float], min_scale: float) -> float:
    """Robust z-score of ``value`` against ``values``: (x − median) / max(1.4826·MAD, ``min_scale``)."""
    med, scale = robust_center_scale(values, min_scale)
    return (value - med) / scale


@dataclass(frozen=True)
class LikelihoodDecision:
    """Outcome of :func:`likelihood_decision`; ``reason`` is empty when the row is kept."""

    keep: bool
    value: float
    """ℓ of the row, nats per byte."""
    z_source: float | None
    """Robust z against the source's window (None during its warm-up)."""
    gap_own: float | None
    """Median of the learner's own window minus ℓ, nats per byte (None without own rows)."""
    reason: str = ""


def likelihood_decision(value: float, source_window: Sequence[float], own_window: Sequence[float],
                        cfg: LikelihoodScreenConfig) -> LikelihoodDecision:
    """Keep or screen one foreign row by its learner log-likelihood per byte ``value`` (module docstring).

    ``source_window``: ℓ of the source's recent accepted rows; ``own_window``: ℓ of the learner's own recent
    rows (both nats per byte, any order). A non-finite ``value`` is screened. With ``cfg.enabled`` false
    every row is kept.
    """
    own_med = statistics.median(own_window) if own_window else None
    gap = None if own_med is None else own_med - value
    z = (robust_z(value, source_window, cfg.min_scale)
         if len(source_window) >= cfg.warmup_rows and math.isfinite(value) else None)
    if not cfg.enabled:
        return LikelihoodDecision(True, value, z, gap)
    if not math.isfinite(value):
        return LikelihoodDecision(False, value, z, gap, "likelihood: not a finite log-likelihood")
    if cfg.own_margin is not None and gap is not None and gap > cfg.own_margin:
        return LikelihoodDecision(False, value, z, gap, f"likelihood: {value:.3f} nats/byte is {gap:.3f} below the "
                                  f"learner's own median (margin {cfg.own_margin})")
    if z is not None and z < -cfg.z_threshold and (gap is None or gap > 0):
        return LikelihoodDecision(False, value, z, gap, f"likelihood: robust z {z:.2f} < -{cfg.z_threshold} against "
                                  f"the source's last {len(source_window)} rows ({value:.3f} nats/byte)")
    return LikelihoodDecision(True, value, z, gap)


@dataclass(frozen=True)
class TailDecision:
    """Outcome of :func:`tail_decision`: ``action`` ``keep`` | ``cut`` | ``reject``; ``keep_bytes`` is the
    prefix to keep when cutting (bytes of the response)."""

    action: Literal["keep", "cut", "reject"]
    reason: str = ""
    keep_bytes: int | None = None
    screen: Literal["", "tail", "length"] = ""


def length_reference(own_bytes: Sequence[int], step_bytes: Sequence[int] = ()) -> float | None:
    """The length the length screen compares a foreign response with (:func:`tail_decision`'s ``reference_bytes``):
    the median UTF-8 bytes of **this learner's own** responses to the same prompt (``own_bytes``), or, when it has
    none to that prompt, of all its own responses of the step (``step_bytes``); ``None`` without any (then there
    is no length screen).

    Only the learner's own responses count, never a peer's. The reference used to be the median of the other
    sources' responses to the prompt, the learner's and every other peer's: one member answering every prompt
    with a bare ``\\boxed{N}`` pulled it down so far that an honest peer answering at ≈ 3× the learner's length
    was length-rejected, down-weighted at step 1 and quarantined at step 3, and two members padding every answer
    raised it for each other until both passed. The learner's own distribution is the one no peer can write
    to: no single source, nor any coalition of sources, moves the bar another source is judged by. The screen
    keeps its purpose (a response padded to many times what this learner needs for the prompt is rejected),
    and with one peer, as in the default pair, the reference is the same as before.
    """
    if own_bytes:
        return float(statistics.median(own_bytes))
    return float(statistics.median(step_bytes)) if step_bytes else None


def tail_decision(response_bytes: int, answer_end_bytes: int | None, reference_bytes: float | None,
                  cfg: TailScreenConfig, closing_bytes: int = 0) -> TailDecision:
    """Keep, cut or reject one foreign response by its answer tail and its length (module docstring).

    Args:
        response_bytes: UTF-8 bytes of the response (content, leading whitespace excluded).
        answer_end_bytes: bytes of the response up to the end of its final stated answer (None: no stated
            answer — the tail screen does not apply; such a row earns no reward).
        reference_bytes: the length the prompt needs: the median bytes of this learner's own responses to it
            (:func:`length_reference`, which no peer can move; None: unknown — no length screen).
        cfg: the tail screen's settings.
        closing_bytes: bytes of closing punctuation right after the answer (``.``, ``$.``, ``)``) that a cut keeps.
    """
    if not cfg.enabled:
        return TailDecision("keep")
    if (cfg.max_length_factor is not None and reference_bytes is not None
            and response_bytes > max(cfg.min_length_bytes, cfg.max_length_factor * reference_bytes)):
        return TailDecision("reject", f"length: {response_bytes} bytes > {cfg.max_length_factor:g} × {reference_bytes:.0f} "
                            "(median of this learner's own responses to this prompt)", screen="length")
    if answer_end_bytes is not None:
        tail = response_bytes - answer_end_bytes
        if tail > cfg.budget_bytes:
            reason = f"tail: {tail} bytes after the final answer > budget {cfg.budget_bytes}"
            if cfg.policy == "cut":
                return TailDecision("cut", reason + "; cut after the answer",
                                    keep_bytes=answer_end_bytes + min(closing_bytes, tail), screen="tail")
            return TailDecision("reject", reason, screen="tail")
    return TailDecision("keep")


# ----------------------------------------------------------------------------- quarantine


@dataclass(frozen=True)
class SourceStanding:
    """A learner's view of one source: ``status`` ``trusted`` | ``downweighted`` | ``quarantined``, its last
    ``memory`` step flags (oldest first), the clean steps in a row, and the step of the last change."""

    status: Literal["trusted", "downweighted", "quarantined"] = "trusted"
    flags: tuple[bool, ...] = ()
    clean_run: int = 0
    since_step: int = 0
    reason: str = ""
    """Why the last change happened (log and report)."""
    history: tuple[str, ...] = field(default=())
    """Every change as ``"step N: status (reason)"``, oldest first (at most 32 kept)."""
    offences: int = 0
    """Times the source was quarantined in the run (never reset, not even by a release): its probation."""

    def weight(self, cfg: QuarantineConfig) -> float:
        """Multiplier of the source's rows' advantages: 1, ``cfg.downweight`` or 0 (quarantined)."""
        if not cfg.enabled or self.status == "trusted":
            return 1.0
        return 0.0 if self.status == "quarantined" else float(cfg.downweight)


def step_flagged(rewarded: int, screened: int, reward_disagreements: int, cfg: QuarantineConfig) -> tuple[bool, str]:
    """(flagged, reason) of one step of one source: of its ``rewarded`` rows (reward > 0), ``screened`` were
    screened — more than ``flag_frac`` of them and at least ``flag_min_rows`` — or at least
    ``reward_disagreements`` of its reward claims were contradicted by the site's verifier."""
    if reward_disagreements >= cfg.reward_disagreements:
        return True, f"{reward_disagreements} reward claim(s) contradicted by this site's verifier"
    if rewarded and screened >= cfg.flag_min_rows and screened / rewarded > cfg.flag_frac:
        return True, f"{screened} of its {rewarded} rewarded rows screened (> {cfg.flag_frac:g})"
    return False, ""


def _moved(standing: SourceStanding, status: str, step: int, reason: str) -> SourceStanding:
    history = (*standing.history, f"step {step}: {status} ({reason})")[-32:]
    return replace(standing, status=status, since_step=step, reason=reason, history=history)


def quarantine_step(standing: SourceStanding, flagged: bool, reason: str, step: int,
                    cfg: QuarantineConfig) -> SourceStanding:
    """The source's standing after one more step (``flagged`` with ``reason``, at ``step``).

    trusted / down-weighted: ``quarantine_after`` flags among the last ``memory`` steps ⇒ quarantined,
    ``downweight_after`` ⇒ down-weighted, none ⇒ trusted. Quarantined: stays until
    ``release_after_clean`` × 2^min(10, offences − 1) clean steps in a row (then trusted with a clean memory; 0 ⇒
    only :func:`release`). Probation: a source quarantined before (``offences`` ≥ 1) is quarantined again by
    one flagged step — without it, an attacker alternating ``quarantine_after`` flagged steps with
    ``release_after_clean`` clean ones would be trusted most of the run. Disabled: unchanged.
    """
    if not cfg.enabled:
        return standing
    flags = (*standing.flags, bool(flagged))[-cfg.memory:]
    clean_run = 0 if flagged else standing.clean_run + 1
    out = replace(standing, flags=flags, clean_run=clean_run)
    n = sum(flags)
    if standing.status == "quarantined":
        need = cfg.release_after_clean * 2 ** min(10, max(0, standing.offences - 1))
        if cfg.release_after_clean and clean_run >= need:
            return replace(_moved(out, "trusted", step, f"{clean_run} clean steps"), flags=(), clean_run=0)
        return out
    if n >= (1 if standing.offences else cfg.quarantine_after):
        why = "on probation" if standing.offences else f"{n} flagged steps of the last {len(flags)}"
        return replace(_moved(out, "quarantined", step, f"{why}: {reason}"), offences=standing.offences + 1)
    if n >= cfg.downweight_after and standing.status != "downweighted":
        return _moved(out, "downweighted", step, f"{n} flagged step(s) of the last {len(flags)}: {reason}")
    if n == 0 and standing.status == "downweighted":
        return _moved(out, "trusted", step, f"no flagged step in the last {len(flags)}")
    return out


def release(standing: SourceStanding, step: int, reason: str = "released by the operator") -> SourceStanding:
    """Trusted again with a clean memory (the operator's knob, ``screens.release``)."""
    if standing.status == "trusted" and not standing.flags:
        return standing
    return replace(_moved(standing, "trusted", step, reason), flags=(), clean_run=0)
