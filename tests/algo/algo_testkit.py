"""Row builders and constants shared by the algorithm tests (real tiny models, real views)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

LLAMA, GEMMA = "tiny-llama-bpe", "tiny-gemma-unigram"

RESPONSES = [
    "We add 2 and 3 so the answer is \\boxed{5}.",
    "first 17 * 4 = 68 then 68 + 5 = 73 so \\boxed{73}",
    "The total is 12.",
    "apples left: 9 - 4 = 5",
    "\\boxed{0}",
    "so the result equals the sum of the numbers, which is 41",
]
PROBLEMS = ["What is 2 + 3?", "Compute 17 * 4, then add 5.", "How many apples are left if I had 9 and ate 4?"]


@torch.no_grad()
def sequence_logprob_sum(model, prompt_ids, response_ids) -> float:
    """Σ log π(response | prompt) with the project's log-prob function (the behaviour forward)."""
    from hacrl_fed.update.logprobs import token_logprobs

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    logp = token_logprobs(model, ids, torch.ones_like(ids))
    return float(logp[0, len(prompt_ids):].sum())


def make_agent_rows(agent: str, model, tok, *, n_prompts: int = 2, g: int = 2, seed: int = 0):
    """Own rows of ``agent`` with their response texts: each prompt × g responses, EOS appended
    (finish reason stop), behaviour log-prob sums from ``model``; rewards vary within each group.

    Returns ``[(TrainingRow, text), ...]``.
    """
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.tokenization.views import encode_response_text, own_row

    out = []
    for p in range(n_prompts):
        prompt = render_prompt(tok, PROBLEMS[p % len(PROBLEMS)], system_prompt="Solve.")
        for i in range(g):
            text = RESPONSES[(seed + p * g + i) % len(RESPONSES)]
            resp = encode_response_text(tok, text) + [tok.eos_token_id]
            row = own_row(prompt_id=f"q{p}", sample_index=i, agent=agent, prompt_ids=prompt, response_ids=resp,
                          reward=float((p + i + seed) % 2),
                          behaviour_logprob_sum=sequence_logprob_sum(model, prompt, resp),
                          finish_reason="stop", max_response_tokens=256)
            out.append((row, text))
    return out


def as_foreign(pairs, learner_tok, source: str) -> list:
    """Another agent's rows as the learner sees them: text over the wire, re-encoded with ``learner_tok``."""
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.tokenization.views import foreign_row

    out = []
    for row, text in pairs:
        rollout = SimpleNamespace(
            prompt_id=row.prompt_id, sample_index=row.sample_index, response_text=text, reward=row.reward,
            behaviour_logprob_sum=row.behaviour_logprob_sum, behaviour_token_count=row.behaviour_token_count,
            finish_reason="stop")
        prompt = render_prompt(learner_tok, PROBLEMS[int(row.prompt_id[1:]) % len(PROBLEMS)], system_prompt="Solve.")
        out.append(foreign_row(learner_tok, prompt, rollout, source, 256))
    return out
