"""A toy rollout engine (docs/extending.md, "A rollout engine"): every response is one fixed text.

The whole extension is this module plus one registration line::

    ROLLOUT_ENGINES.register("canned", "toy_engine:make_engine")
"""

from __future__ import annotations

from hacrl_fed.rollout.engine import GeneratedSample, checked_request


class CannedEngine:
    """Answers every prompt ``n`` times with ``text`` + EOS, each token with log-prob 0 (a toy, not a policy)."""

    name = "canned"

    def __init__(self, tokenizer, text: str, max_batch_sequences: int) -> None:
        self.tokenizer, self.text, self.max_batch_sequences = tokenizer, text, max_batch_sequences

    def generate(self, prompt_token_ids, n, sampling, seed) -> list[GeneratedSample]:
        _, prompts = checked_request(prompt_token_ids, n, sampling)
        ids = (*self.tokenizer.encode(self.text, add_special_tokens=False), self.tokenizer.eos_token_id)
        return [GeneratedSample(i, j, p, ids, self.text, "stop", 0.0, len(ids), (0.0,) * len(ids))
                for i, p in enumerate(prompts) for j in range(n)]

    def prepare_update(self) -> None:
        """Nothing to free: the engine holds no weights."""

    def weights_updated(self) -> None:
        """Nothing to sync: the engine holds no weights."""


def make_engine(request) -> CannedEngine:
    """The factory: ``model.engine_options.text`` is the response (default ``=> 4``)."""
    return CannedEngine(request.tokenizer, str(request.options.get("text", "=> 4")), request.max_batch_sequences)
