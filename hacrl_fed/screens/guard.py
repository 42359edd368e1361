"""A learner site's guard over its peers' rows: re-verification, text screens, the likelihood gate, quarantine.

:class:`SiteGuard` holds what the screens of :mod:`hacrl_fed.screens.rules` need across steps (per-source
windows of the learner log-likelihood per byte, the learner's own window, each source's standing) and
applies their decisions to one training step of :class:`hacrl_fed.worker.trainer.Trainer`::

    begin_step → reverify (the site's verdict replaces the coordinator's reward) → screen_text (quarantine,
    answer tail, length, keys, recurring phrases) → [the HACPO update calls gate() per micro-batch with the learner log-probs it
    computed] → finish_step (per-source flags, down-weighting / quarantine, metrics, report lines)

Every screened row is logged (``hacrl_fed.screens``) with its reason and counted in the step's metrics
(``src/<agent>/screened_*``); quarantine changes are logged as warnings and a quarantined source's refusal
is a line of the TrainReport's ``rejected``. :meth:`state_dict` / :meth:`load_state_dict` are plain JSON
(stored in the worker's checkpoint, written atomically with it); version 2 adds the key ledger
(:mod:`hacrl_fed.screens.keys`) and each source's ``offences``; a version-1 state still loads (an empty
ledger, no offences).
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from hacrl_fed.screen_config import ScreenConfig
from hacrl_fed.reward.extract import answer_end, extract_final_answer
from hacrl_fed.screens.keys import KeyLedger, cut_keys, words
from hacrl_fed.screens.phrases import cut_phrases, recurring_phrases, word_ngrams
from hacrl_fed.screens.rules import (
    SourceStanding,
    length_reference,
    likelihood_decision,
    per_byte_loglik,
    quarantine_step,
    release,
    step_flagged,
    tail_decision,
)
from hacrl_fed.protocol.episodes import verifier_columns, zeroed_unverified
from hacrl_fed.reward.verifier import verify_by_source
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["STATE_VERSION", "SiteGuard", "cut_rollout", "rewrite_rollout"]

log = logging.getLogger("hacrl_fed.screens")

STATE_VERSION = 2
_READS = (1, 2)
"""State versions :meth:`SiteGuard.load_state_dict` reads (1: before the key ledger and offences)."""
_TOLERANCE = 1e-9
_CLOSING = re.compile(r"[\s.,;:!?)\]}$*]{0,8}")
"""Closing punctuation right after an answer (``.``, ``$.``, ``**.``) that a cut keeps."""
_STATUS_CODE = {"trusted": 0.0, "downweighted": 1.0, "quarantined": 2.0}
RowKey = tuple[str, str, int]
"""(source agent, prompt id, sample index)."""
VerifyFn = Callable[..., Sequence[Any]]
"""``verify(responses, references, styles, problems) -> [verdict]`` (``hacrl_fed.reward.Verifier.verify``)."""


def rewrite_rollout(rollout: pb.Rollout, content: str, *, stop: bool = False) -> pb.Rollout:
    """A copy of ``rollout`` whose content (text without leading whitespace) is ``content``; with ``stop`` it
    ends with STOP (a cut tail), else it keeps its finish reason.

    Per-token log-probs never cross the wire, so the source's behaviour sum and token count over the content
    are scaled by the kept share of the bytes (the per-byte mean is kept); the EOS log-prob is kept when the
    source sent one (a row made STOP without one gets 0: the learner's EOS is then left out of the ratio on
    both sides). A row without a behaviour log-prob keeps having none (its token count, if known, is scaled).
    """
    old = rollout.response_text.lstrip()
    lead = rollout.response_text[: len(rollout.response_text) - len(old)]
    frac = len(content.encode("utf-8")) / max(1, len(old.encode("utf-8")))
    out = pb.Rollout()
    out.CopyFrom(rollout)
    had_eos = rollout.finish_reason == pb.STOP and rollout.HasField("behaviour_eos_logprob")
    eos = float(rollout.behaviour_eos_logprob) if had_eos else 0.0
    content_sum = rollout.behaviour_logprob_sum - eos
    content_count = rollout.behaviour_token_count - (1 if had_eos else 0)
    out.response_text = lead + content
    if not rollout.HasField("behaviour_logprob_sum"):   # no behaviour log-prob: nothing to scale but the count
        out.behaviour_token_count = round(rollout.behaviour_token_count * frac)
        if stop:
            out.finish_reason = pb.STOP
        return out
    out.behaviour_logprob_sum = content_sum * frac + eos
    if stop or had_eos:
        out.behaviour_token_count = max(1, round(content_count * frac)) + 1
        out.behaviour_eos_logprob = eos
        out.finish_reason = pb.STOP
    else:   # unchanged finish reason; a STOP row without the EOS field keeps its terms together
        out.behaviour_token_count = max(1, round(content_count * frac))
    return out


def cut_rollout(rollout: pb.Rollout, keep_bytes: int) -> pb.Rollout:
    """A copy of ``rollout`` whose content is cut to its first ``keep_bytes`` UTF-8 bytes (at a character
    boundary), ending with STOP (:func:`rewrite_rollout`)."""
    raw = rollout.response_text.lstrip().encode("utf-8")
    return rewrite_rollout(rollout, raw[:keep_bytes].decode("utf-8", errors="ignore"), stop=True)


def _final_answer(text: str, style: str) -> str | None:
    found = extract_final_answer(text, style)
    return None if found is None else found.answer


def _answer_span(text: str, style: str) -> tuple[int, int] | None:
    """Character range of the final stated answer in ``text`` (a ``\\boxed{…}`` from its backslash; else the
    answer's last occurrence before its end), or None when nothing is stated."""
    end = answer_end(text, style)
    if end is None:
        return None
    start = text.rfind("\\boxed", 0, end)
    if start < 0:
        answer = _final_answer(text, style) or ""
        start = text.rfind(answer, 0, end) if answer else -1
    return (max(0, start), end) if start >= 0 else (max(0, end - 1), end)


class SiteGuard:
    """One learner's screens over a run (module docstring).

    Args:
        learner: this site's agent id.
        cfg: the screens' settings (``agent.screens``).
        verify: the site's own verifier (``Verifier.verify``); None ⇒ no re-verification.
        truncated_reward: ``zero`` gives a LENGTH response reward 0 without verifying it (as the site does for
            its own rollouts, ``VerifierConfig.truncated_reward``), ``verify`` verifies it.
    """

    def __init__(self, learner: str, cfg: ScreenConfig, verify: VerifyFn | None = None, *,
                 truncated_reward: str = "zero") -> None:
        self.learner = learner
        self.cfg = cfg
        self.verify = verify
        self.truncated_zero = truncated_reward == "zero"
        self.standing: dict[str, SourceStanding] = {}
        self.windows: dict[str, deque[float]] = {}
        self.own_window: deque[float] = deque(maxlen=cfg.likelihood.window)
        self.totals: dict[str, Counter] = {}
        """Cumulative counts per source over the run (the report's screen table)."""
        self.ledger = KeyLedger()
        """Run-long word counts, foreign (all sources) and own (:mod:`hacrl_fed.screens.keys`)."""
        self.step = 0
        self._counts: dict[str, Counter] = {}
        self._ll: dict[str, list[float]] = {}
        self._z: dict[str, list[float]] = {}
        self._decided: dict[RowKey, float] = {}
        self._own_bytes: dict[tuple[str, int], int] = {}
        self._refused: list[str] = []
        self._screened: dict[str, dict[tuple[str, int], bool]] = {}

    @property
    def active(self) -> bool:
        return self.cfg.enabled

    def weight(self, source: str) -> float:
        """The source's standing weight now (1 trusted, ``downweight``, 0 quarantined)."""
        return self.standing.get(source, SourceStanding()).weight(self.cfg.quarantine)

    def _window(self, source: str) -> deque[float]:
        return self.windows.setdefault(source, deque(maxlen=self.cfg.likelihood.window))

    def _count(self, source: str, what: str, n: float = 1.0) -> None:
        self._counts.setdefault(source, Counter())[what] += n

    def _screened_row(self, source: str, key: tuple[str, int], rewarded: bool, *, out: bool) -> None:
        """Record that a screen acted on row ``key`` (prompt id, sample index) of ``source``: a row that two
        screens act on (a cut tail, then the likelihood gate) counts once in ``screened_rows`` and
        ``rewarded_screened``; ``out`` marks it not trained (``screened_out``)."""
        rows = self._screened.setdefault(source, {})
        if key not in rows:
            self._count(source, "rewarded_screened", float(rewarded))
        rows[key] = rows.get(key, False) or out

    # ------------------------------------------------------------------ the step

    def begin_step(self, step: int, own_texts: Mapping[tuple[str, int], str]) -> None:
        """Start ``step``; ``own_texts`` maps (prompt id, sample index) → the learner's own response text."""
        self.step = step
        self._counts, self._ll, self._z, self._decided, self._refused = {}, {}, {}, {}, []
        self._screened = {}
        self._own_bytes = {k: len(t.lstrip().encode("utf-8")) for k, t in own_texts.items()}

    def reverify(self, foreign: Mapping[str, Sequence[pb.Rollout]], references: Mapping[str, pb.PromptItem],
                 rewards: dict[RowKey, float]) -> None:
        """Re-verify every foreign rollout with the site's verifier; ``rewards`` (coordinator-corrected, keyed
        by (source, prompt id, sample index)) is updated in place to the site's verdict.

        A reward the coordinator gave that the site's verdict contradicts is counted per source
        (``coordinator_disagreements``) and logged; a source's own reward claim that it contradicts is
        counted (``claim_disagreements``, which flags the source's step). A verifier error at the site gives
        reward 0 (as for the site's own rollouts) and counts as neither. No-op when re-verification is off,
        there is no verifier or a prompt has no reference (then nothing is re-verified).
        """
        if not (self.cfg.enabled and self.cfg.reverify and self.verify is not None):
            return
        rows = [(src, r) for src in sorted(foreign) for r in foreign[src]]
        if not rows or any(r.prompt_id not in references for _, r in rows):
            if rows:
                log.warning("step %d: the plan's reference answers are missing here: foreign rows not re-verified",
                            self.step)
            return
        todo = [(s, r) for s, r in rows if not zeroed_unverified(r, self.truncated_zero)]
        columns = verifier_columns(references, [r for _, r in todo])
        verdicts = list(verify_by_source(self.verify, columns, [s for s, _ in todo])) if todo else []
        if len(verdicts) != len(todo):
            raise ValueError(f"verifier returned {len(verdicts)} verdicts for {len(todo)} responses")
        mine: dict[RowKey, tuple[float, bool]] = {(s, r.prompt_id, r.sample_index): (0.0, False) for s, r in rows}
        for (s, r), v in zip(todo, verdicts):
            mine[(s, r.prompt_id, r.sample_index)] = (float(v.reward), v.verdict == "verifier_error")
        for src, r in rows:
            key = (src, r.prompt_id, r.sample_index)
            site, error = mine[key]
            self._count(src, "reverified")
            if error:
                self._count(src, "site_verifier_errors")
            coord = rewards.get(key, float(r.reward))
            if not error and abs(coord - site) > _TOLERANCE:
                self._count(src, "coordinator_disagreements")
                log.warning("step %d: %s %s#%d: the coordinator's reward %.3g contradicts this site's verifier "
                            "(%.3g); training on this site's verdict", self.step, src, r.prompt_id, r.sample_index,
                            coord, site)
            if not error and r.verdict != pb.VERIFIER_ERROR and abs(float(r.reward) - site) > _TOLERANCE:
                self._count(src, "claim_disagreements")
                log.info("step %d: %s %s#%d claimed reward %.3g, this site's verifier says %.3g", self.step, src,
                         r.prompt_id, r.sample_index, r.reward, site)
            rewards[key] = site

    def screen_text(self, foreign: Mapping[str, Sequence[pb.Rollout]],
                    own_texts: Mapping[tuple[str, int], str],
                    styles: Mapping[str, str] | None = None,
                    rewards: Mapping[RowKey, float] | None = None,
                    prompt_texts: Mapping[str, str] | None = None) -> dict[str, list[pb.Rollout]]:
        """The foreign rollouts to train on: a quarantined source's rows left out (one ``rejected`` line per
        source), then the answer-tail and length screens on each row and the phrase screen on each source's
        rows (cut copies replace cut rows).

        ``own_texts`` are the learner's own responses (every prompt's length reference, the only one: a peer's
        rows never move the bar another peer is judged by, :func:`hacrl_fed.screens.rules.length_reference`; and
        their phrases are never cut); ``styles`` maps prompt id → answer style (default ``boxed``); ``rewards`` the
        rewards trained on (default: the rollouts' own), which tell the rewarded rows that flag a step;
        ``prompt_texts`` maps prompt id → problem text (its phrases are never cut). The text screens also run
        on a quarantined source's rows: they decide whether its step was clean.
        """
        if not self.cfg.enabled:
            return {s: list(rs) for s, rs in foreign.items()}
        styles = styles or {}
        own_bytes: dict[str, list[int]] = {}
        for (pid, _), text in own_texts.items():
            own_bytes.setdefault(pid, []).append(len(text.lstrip().encode("utf-8")))
        step_bytes = [n for ns in own_bytes.values() for n in ns]
        excluded = ({g for t in (prompt_texts or {}).values()
                     for g in word_ngrams(t, self.cfg.phrase.ngram_words)} if self.cfg.phrase.enabled else set())
        licensed = self._observe_words(foreign, own_texts, prompt_texts or {})
        keys = self._keys(foreign)
        out: dict[str, list[pb.Rollout]] = {}
        for src in sorted(foreign):
            kept: list[pb.Rollout] = []
            for r in foreign[src]:
                rewarded = self._count_seen(src, r, rewards)
                content = r.response_text.lstrip()
                nbytes = len(content.encode("utf-8"))
                end = answer_end(content, styles.get(r.prompt_id) or "boxed")
                end_bytes = None if end is None else len(content[:end].encode("utf-8"))
                closing = 0 if end is None else len(_CLOSING.match(content, end).group(0).rstrip().encode("utf-8"))
                ref = length_reference(own_bytes.get(r.prompt_id, ()), step_bytes)
                d = tail_decision(nbytes, end_bytes, ref, self.cfg.tail, closing)
                if d.action == "keep":
                    kept.append(r)
                    continue
                what = "screened_length" if d.screen == "length" else f"screened_tail_{d.action}"
                self._count(src, what)
                self._screened_row(src, (r.prompt_id, int(r.sample_index)), rewarded, out=d.action != "cut")
                log.info("step %d: %s %s#%d: %s", self.step, src, r.prompt_id, r.sample_index, d.reason)
                if d.action == "cut":
                    kept.append(cut_rollout(r, int(d.keep_bytes or 0)))
            kept = self._cut_keys(src, kept, keys, licensed, styles)
            kept = self._cut_recurring(src, kept, excluded, styles)
            if not self._left_out_quarantined(src, len(foreign[src])):
                out[src] = kept
        return out

    def pass_episodes(self, foreign: Mapping[str, Sequence[pb.Rollout]],
                      rewards: Mapping[RowKey, float] | None = None) -> dict[str, list[pb.Rollout]]:
        """The foreign episode rollouts to train on (docs/multi-turn.md). The text screens read one-shot responses
        and do not run on episodes, whose check is the replay in :meth:`reverify`; the rows are still counted as
        seen (``src/<agent>/screen_rows``, ``rewarded_rows``), a quarantined source's rows are left out as by
        :meth:`screen_text`, and the likelihood screen (:meth:`gate`) weighs every row in the update."""
        if not self.cfg.enabled:
            return {s: list(rs) for s, rs in foreign.items()}
        out: dict[str, list[pb.Rollout]] = {}
        for src in sorted(foreign):
            for r in foreign[src]:
                self._count_seen(src, r, rewards)
            if not self._left_out_quarantined(src, len(foreign[src])):
                out[src] = list(foreign[src])
        return out

    def _count_seen(self, src: str, r: pb.Rollout, rewards: Mapping[RowKey, float] | None) -> bool:
        """Count one of ``src``'s rows as seen (``rows``, and ``rewarded_rows`` when the reward trained on, default
        the row's own, is positive); returns whether it is rewarded."""
        self._count(src, "rows")
        rewarded = (rewards or {}).get((src, r.prompt_id, r.sample_index), r.reward) > 0
        self._count(src, "rewarded_rows", float(rewarded))
        return rewarded

    def _left_out_quarantined(self, src: str, rows: int) -> bool:
        """True when ``src`` is quarantined here: its ``rows`` rows are counted and one refusal line is kept."""
        if self.weight(src) != 0.0:
            return False
        standing = self.standing[src]
        self._count(src, "quarantined_rows", rows)
        self._refused.append(f"{src}: quarantined by this site since step {standing.since_step} "
                             f"({standing.reason}); its {rows} rows are not trained")
        return True

    def _observe_words(self, foreign: Mapping[str, Sequence[pb.Rollout]], own_texts: Mapping[tuple[str, int], str],
                       prompt_texts: Mapping[str, str]) -> dict[str, set[str]]:
        """Add the step's prompt-groups to the key ledger (foreign: every source's rows of a prompt together;
        own: the learner's samples of a prompt; a prompt's own words left out of both). Returns prompt id → the
        prompt's words (licensed in its rows)."""
        kc = self.cfg.key
        licensed = {pid: words(t, kc.max_word_chars) for pid, t in prompt_texts.items()}
        foreign_groups: dict[str, set[str]] = {}
        for rows in foreign.values():
            for r in rows:
                foreign_groups.setdefault(r.prompt_id, set()).update(words(r.response_text, kc.max_word_chars))
        own_groups: dict[str, set[str]] = {}
        for (pid, _), text in own_texts.items():
            own_groups.setdefault(pid, set()).update(words(text, kc.max_word_chars))
        self.ledger.observe([g - licensed.get(p, set()) for p, g in foreign_groups.items()],
                            [g - licensed.get(p, set()) for p, g in own_groups.items()], kc)
        return licensed

    def _keys(self, foreign: Mapping[str, Sequence[pb.Rollout]]) -> set[str]:
        """The keys among the words of the step's foreign rows (:meth:`KeyLedger.is_key`); empty when the key
        screen is off."""
        kc = self.cfg.key
        if not kc.enabled:
            return set()
        seen = {w for rows in foreign.values() for r in rows for w in words(r.response_text, kc.max_word_chars)}
        return {w for w in seen if self.ledger.is_key(w, kc)}

    def _cut_keys(self, src: str, rows: list[pb.Rollout], keys: set[str], licensed: Mapping[str, set[str]],
                  styles: Mapping[str, str]) -> list[pb.Rollout]:
        """``rows`` of ``src`` with every key cut out (:func:`hacrl_fed.screens.keys.cut_keys`; never inside the
        final answer, never a word of the row's prompt); counted (``screened_key_cut``, ``keys_cut``) and logged;
        a rewarded row whose final answer the cut would change is left out (its reward was for the other answer;
        an unrewarded row is trained cut, still unrewarded: on the real pair a wrong Gemma row with an unclosed
        ``\\boxed{n. \\l`` lost its answer to the cut of ``n`` and ``l``). No quarantine flag: an honest peer's house
        word is a key too, and the cut is the defence (the ledger is never released)."""
        if not keys or not rows:
            return rows
        out, found = [], set()
        for r in rows:
            content = r.response_text.lstrip()
            style = styles.get(r.prompt_id) or "boxed"
            kept = cut_keys(content, keys, self.cfg.key.max_word_chars, _answer_span(content, style),
                            licensed.get(r.prompt_id, set()))
            if kept == content:
                out.append(r)
                continue
            found |= keys & words(content, self.cfg.key.max_word_chars)
            self._count(src, "screened_key_cut")
            if r.reward > 0 and _final_answer(kept, style) != _final_answer(content, style):
                self._screened_row(src, (r.prompt_id, int(r.sample_index)), r.reward > 0, out=True)
                log.info("step %d: %s %s#%d: a key holds its answer: left out", self.step, src, r.prompt_id,
                         r.sample_index)
                continue
            out.append(rewrite_rollout(r, kept))
        if found:
            self._count(src, "keys_cut", len(found))
            shown = sorted(found)
            log.info("step %d: %s: %d key word(s) cut: %s", self.step, src, len(found),
                     ", ".join(repr(x) for x in shown[:8]) + (" …" if len(shown) > 8 else ""))
        return out

    def _cut_recurring(self, src: str, rows: list[pb.Rollout], excluded: set, styles: Mapping[str, str]
                       ) -> list[pb.Rollout]:
        """``rows`` of ``src`` with its recurring phrases of the step cut out (:func:`recurring_phrases`; not
        one every word of which is the learner's own, :meth:`KeyLedger.own_common`: an honest carrier phrase),
        never inside the final answer; counted (``screened_phrase_cut``, ``phrases_cut``) and logged, but no
        flag for the quarantine: a cut row is still trained. A row whose final answer the cut would change
        (the phrase holds it) is left out instead."""
        cfg = self.cfg.phrase
        if not cfg.enabled or not rows:
            return rows
        n = cfg.ngram_words
        by_prompt: dict[str, list[str]] = {}
        for r in rows:
            by_prompt.setdefault(r.prompt_id, []).append(r.response_text)
        kc = self.cfg.key
        phrases = {g for g in recurring_phrases(by_prompt, excluded, cfg)
                   if not all(self.ledger.own_common(w[:kc.max_word_chars], kc) for w in g)}
        if not phrases:
            return rows
        out = []
        for r in rows:
            content = r.response_text.lstrip()
            style = styles.get(r.prompt_id) or "boxed"
            kept = cut_phrases(content, phrases, n, _answer_span(content, style))
            if kept == content:
                out.append(r)
                continue
            self._count(src, "screened_phrase_cut")
            if _final_answer(kept, style) != _final_answer(content, style):   # the cut reached the answer
                self._screened_row(src, (r.prompt_id, int(r.sample_index)), r.reward > 0, out=True)
                log.info("step %d: %s %s#%d: a recurring phrase holds its answer: left out", self.step, src,
                         r.prompt_id, r.sample_index)
                continue
            out.append(rewrite_rollout(r, kept))
        shown = sorted(" ".join(g) for g in phrases)
        self._count(src, "phrases_cut", len(phrases))
        log.info("step %d: %s: %d phrase(s) recur across its answers to %d prompts and were cut: %s", self.step,
                 src, len(phrases), len(by_prompt), "; ".join(repr(x) for x in shown[:8]) + (" …" if len(shown) > 8 else ""))
        return out

    def gate(self, rows: Sequence[Any], content_logprob_sums: Sequence[float]) -> list[float]:
        """Row weights for one micro-batch of the update (:func:`hacrl_fed.update.loop.hacpo_update`'s
        ``row_gate``): own rows 1 (their ℓ joins the learner's own window), a foreign row its source's weight,
        or 0 when the likelihood screen screens it out. ``content_logprob_sums`` are the learner's
        Σ log π over each row's content tokens (nats, before the update's optimizer step on that row). Decided once per row and step (later epochs reuse it)."""
        out = []
        for row, total in zip(rows, content_logprob_sums, strict=True):
            key = (row.source_agent, row.prompt_id, int(row.sample_index))
            if key in self._decided:
                out.append(self._decided[key])
                continue
            if row.is_own:
                nbytes = self._own_bytes.get((row.prompt_id, int(row.sample_index)), 0)
                value = per_byte_loglik(total, nbytes)
                if math.isfinite(value) and nbytes >= self.cfg.likelihood.min_bytes:
                    self.own_window.append(value)
                self._ll.setdefault(row.source_agent, []).append(value)
                self._decided[key] = 1.0
                out.append(1.0)
                continue
            self._decided[key] = weight = self._foreign_weight(row, per_byte_loglik(total, row.content_bytes))
            out.append(weight)
        return out

    def _foreign_weight(self, row: Any, value: float) -> float:
        """The weight of one foreign row after the likelihood screen (:meth:`gate`)."""
        src = row.source_agent
        self._ll.setdefault(src, []).append(value)
        lk = self.cfg.likelihood
        if row.content_bytes < lk.min_bytes:
            return self.weight(src)
        d = likelihood_decision(value, list(self._window(src)), list(self.own_window), lk)
        if not d.keep and lk.rewarded_only and not row.reward > 0:
            d = replace(d, keep=True, reason="")
        if d.z_source is not None:
            self._z.setdefault(src, []).append(d.z_source)
        if d.keep:
            if math.isfinite(value):
                self._window(src).append(value)
            return self.weight(src)
        self._count(src, "screened_likelihood")
        self._screened_row(src, (row.prompt_id, int(row.sample_index)), row.reward > 0, out=True)
        log.info("step %d: %s %s#%d: %s", self.step, src, row.prompt_id, row.sample_index, d.reason)
        return 0.0

    def finish_step(self, sources: Sequence[str]) -> tuple[dict[str, float], list[str]]:
        """Close the step: flag each source seen this step, move its standing, and return (metrics, refusal
        lines for the TrainReport's ``rejected``). ``sources`` are the peers whose batches were opened."""
        metrics: dict[str, float] = {}
        q = self.cfg.quarantine
        for src in sorted(set(sources) | set(self._counts)):
            if src == self.learner:
                continue
            c = self._counts.get(src, Counter())
            acted = self._screened.get(src, {})
            screened = len(acted)
            before = self.standing.get(src, SourceStanding())
            flagged, reason = step_flagged(int(c["rewarded_rows"]), int(c["rewarded_screened"]),
                                           int(c["claim_disagreements"]), q)
            after = quarantine_step(before, flagged, reason, self.step, q) if self.cfg.enabled else before
            self.standing[src] = after
            if after.status != before.status:
                log.warning("step %d: source %s is now %s (%s)", self.step, src, after.status, after.reason)
            total = self.totals.setdefault(src, Counter())
            total.update(c)
            total["flagged_steps"] += flagged
            for name in ("rows", "rewarded_rows", "rewarded_screened", "reverified", "claim_disagreements", "coordinator_disagreements",
                         "site_verifier_errors", "screened_likelihood", "screened_phrase_cut", "phrases_cut",
                         "screened_key_cut", "keys_cut",
                         "screened_tail_cut", "screened_tail_reject",
                         "screened_length", "quarantined_rows"):
                metrics[f"src/{src}/{name}" if name != "rows" else f"src/{src}/screen_rows"] = float(c[name])
            metrics[f"src/{src}/screened_rows"] = float(screened)
            metrics[f"src/{src}/screened_out"] = float(sum(acted.values()))
            metrics[f"src/{src}/flagged"] = float(flagged)
            metrics[f"src/{src}/standing"] = _STATUS_CODE[after.status]
            metrics[f"src/{src}/screen_weight"] = after.weight(q)
            zs = self._z.get(src)
            if zs:
                metrics[f"src/{src}/ll_z_min"] = min(zs)
        for src, values in self._ll.items():
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                metrics[f"src/{src}/ll_per_byte"] = statistics.fmean(finite)
        metrics["screened_rows"] = sum(v for k, v in metrics.items() if k.endswith("/screened_rows"))
        metrics["coordinator_reward_disagreements"] = sum(
            v for k, v in metrics.items() if k.endswith("/coordinator_disagreements"))
        metrics["quarantined_sources"] = float(sum(s.status == "quarantined" for s in self.standing.values()))
        refused, self._refused = self._refused, []
        return metrics, refused

    # ------------------------------------------------------------------ operator and state

    def release(self, sources: Sequence[str]) -> list[str]:
        """Trust ``sources`` again (the operator's ``screens.release``); returns those that were not trusted."""
        out = []
        for src in sources:
            before = self.standing.get(src)
            if before is None or (before.status == "trusted" and not before.flags):
                continue
            self.standing[src] = release(before, self.step)
            out.append(src)
            log.warning("source %s released from %s by the operator (screens.release)", src, before.status)
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: standings, likelihood windows, cumulative counts, the key ledger."""
        return {"version": STATE_VERSION, "step": self.step,
                "standing": {s: {**asdict(v), "flags": list(v.flags), "history": list(v.history)}
                             for s, v in self.standing.items()},
                "windows": {s: list(w) for s, w in self.windows.items()}, "own_window": list(self.own_window),
                "totals": {s: dict(c) for s, c in self.totals.items()}, "keys": self.ledger.state()}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict` output (None or an empty mapping: a fresh guard). Raises ``ValueError``
        (the guard unchanged) for a state version other than 1 or 2 or a malformed state. A version-1 state
        (before the key ledger) loads with an empty ledger and no offences."""
        if state is None or (isinstance(state, Mapping) and not state):
            return
        if not isinstance(state, Mapping):
            raise ValueError(f"screen state is a {type(state).__name__}, not a mapping")
        version = state.get("version")
        if isinstance(version, bool) or version not in _READS:
            raise ValueError(f"screen state version {str(version)[:40]!r}, expected one of {_READS}")
        n = self.cfg.likelihood.window
        try:
            step = int(state.get("step", 0))
            standing = {str(s): SourceStanding(status=_status(v["status"]), flags=tuple(bool(f) for f in v["flags"]),
                                               clean_run=int(v["clean_run"]), since_step=int(v["since_step"]),
                                               reason=str(v["reason"]), history=tuple(str(h) for h in v["history"]),
                                               offences=_offences(v["offences"] if version >= 2 else 0))
                        for s, v in dict(state.get("standing", {})).items()}
            windows = {str(s): deque((float(x) for x in w), maxlen=n)
                       for s, w in dict(state.get("windows", {})).items()}
            own_window = deque((float(x) for x in state.get("own_window", [])), maxlen=n)
            totals = {str(s): Counter({str(k): _count(x) for k, x in dict(c).items()})
                      for s, c in dict(state.get("totals", {})).items()}
            ledger = KeyLedger.from_state(state["keys"], self.cfg.key) if version >= 2 else KeyLedger()
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            why = " ".join(str(err).split())[:200]
            raise ValueError(f"malformed screen state: {type(err).__name__}: {why}") from None
        self.step, self.standing, self.windows, self.own_window = step, standing, windows, own_window
        self.totals, self.ledger = totals, ledger


def _status(value: Any) -> str:
    """A source standing's status read back from a saved state. Raises ValueError for any other value."""
    if value not in ("trusted", "downweighted", "quarantined"):
        raise ValueError(f"unknown standing status {str(value)[:40]!r}")
    return value


def _offences(value: Any) -> int:
    """A source's offences read back from a saved state. Raises ValueError for anything but an int ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"offences {str(value)[:40]!r} is not an int >= 0")
    return value


def _count(value: Any) -> int | float:
    """A cumulative count read back from a saved state. Raises ValueError for anything but a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float)
                                                                        and not math.isfinite(value)):
        raise ValueError(f"count {str(value)[:40]!r} is not a finite number")
    return value
