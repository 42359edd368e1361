"""Shared fixtures of the worker tests: tiny models with two incompatible tokenizers."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.config import ModelConfig
from hacrl_fed.worker.models import LoadedModel, load_model

SHARPEN_STD = {"tiny-llama-bpe": 0.2, "tiny-gemma-unigram": None}
"""Re-initialisation std of 2-D weights so greedy outputs of the random model depend on the prompt."""


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("model-cache"))


def sharpen(model, std: float | None, seed: int = 0) -> None:
    """Seeded re-initialisation of every matrix with ``std`` (None: leave the model as built)."""
    if std is None:
        return
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture
def load_tiny(model_cache):
    """``load_tiny(kind, **model_cfg) -> LoadedModel``: a fresh tiny model, sharpened deterministically."""

    def _load(kind: str, **kw) -> LoadedModel:
        lm = load_model(ModelConfig(name_or_path=kind, cache_dir=model_cache, **kw))
        sharpen(lm.model, SHARPEN_STD[kind])
        return lm

    return _load


@pytest.fixture
def render_prompts():
    """``render_prompts(tokenizer) -> list[list[int]]``: the four test problems, rendered for ``tokenizer``."""
    from hacrl_fed.data.prompts import render_prompt

    return lambda tok: [render_prompt(tok, p, system_prompt="Solve the problem.") for p in PROBLEMS]


@pytest.fixture
def extra_eos():
    """``extra_eos(lm, prompts) -> token``: declare a token the model greedily emits mid-response as an extra EOS
    id, so rows stop at different steps."""
    from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling

    def _declare(lm: LoadedModel, prompts) -> int:
        probe = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, Sampling(temperature=0, max_new_tokens=12),
                                                                 0)
        token = probe[1].response_ids[5]
        lm.model.generation_config.eos_token_id = [lm.tokenizer.eos_token_id, token]
        return token

    return _declare


@pytest.fixture
def stop_string_case(render_prompts):
    """``stop_string_case(lm) -> (prompts, sampling, stop, hf samples)``: a stop string cut out of the model's own
    greedy text (3 characters at offset 4) and the ``hf`` engine's greedy samples under it, the reference every
    engine's stop-string cut is compared with."""
    from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling

    def _case(lm: LoadedModel):
        prompts = render_prompts(lm.tokenizer)
        sp = Sampling(temperature=0, max_new_tokens=16)
        plain = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
        stop = next(s.text[4:7] for s in plain if len(s.text) > 8 and s.text[4:7].strip())
        hf = HFRolloutEngine(lm.model, lm.tokenizer, stop_strings=[stop]).generate(prompts, 1, sp, seed=0)
        return prompts, sp, stop, hf

    return _case


PROBLEMS = [
    "What is 2 + 3?",
    "Compute 17 * 4, then add 5 to the result.",
    "x",
    "How many apples are left if I had 9 and ate 4? Explain each step of the computation carefully.",
]


@pytest.fixture(scope="session")
def verifier():
    """One verifier process shared by every worker of the test session (math-verify imports once)."""
    from hacrl_fed.reward import Verifier

    with Verifier(timeout_s=30, workers=1) as v:
        yield v


class Sites:
    """Agent configs with keys in one shared roster; ``start(name)`` builds an AgentWorker (its site directory
    ``<root>/<name>``, its checkpoints in ``<root>/<name>/checkpoints``)."""

    def __init__(self, root, cache: str, verifier, kinds: dict[str, str], **agent_kw) -> None:
        from hacrl_fed.config import AgentConfig, ModelConfig, OptimConfig
        from hacrl_fed.protocol.keys import generate_identity, update_roster

        self.root, self.verifier, self.cfg, self.workers = root, verifier, {}, {}
        roster = root / "roster.toml"
        model_kw = agent_kw.pop("model_kw", {})
        optim = agent_kw.pop("optim", None) or OptimConfig(lr=1e-3, mini_batch_rows=8, seed=0)
        for name, kind in kinds.items():
            ident = generate_identity(name, root / "keys")
            update_roster(roster, name, ident.ed25519)
            self.cfg[name] = AgentConfig(
                name=name, private_key=str(ident.signing_key), roster=str(roster),
                checkpoint_dir=str(root / name / "checkpoints"),
                model=ModelConfig(name_or_path=kind, cache_dir=cache, max_response_tokens=24, **model_kw),
                optim=optim, **agent_kw)

    def start(self, name: str, **kw):
        from hacrl_fed.worker.agent import AgentWorker

        kw.setdefault("site_dir", self.root / name)
        self.workers[name] = AgentWorker(self.cfg[name], verifier=self.verifier, max_batch_sequences=16, **kw)
        return self.workers[name]

    def close(self) -> None:
        for w in self.workers.values():
            w.close()


@pytest.fixture
def make_sites(tmp_path, model_cache, verifier):
    made: list[Sites] = []

    def _make(kinds: dict[str, str], **agent_kw) -> Sites:
        made.append(Sites(tmp_path / f"sites{len(made)}", model_cache, verifier, kinds, **agent_kw))
        return made[-1]

    yield _make
    for s in made:
        s.close()


def make_plan(step: int = 1, *, run_id: str = "run-a", prompts: int = 3, g: int = 2, max_new_tokens: int = 10,
              temperature: float = 1.0, seed: int = 5):
    """A RoundPlan over small arithmetic prompts."""
    from hacrl_fed.v1 import rollout_pb2 as pb

    items = [pb.PromptItem(prompt_id=f"q{step}-{i}", text=f"What is {i} + {step}?", reference_answer=str(i + step),
                           answer_style="boxed") for i in range(prompts)]
    return pb.RoundPlan(run_id=run_id, step=step, samples_per_prompt=g, prompts=items,
                        sampling=pb.SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens,
                                                   seed=seed))


def make_table(plan, capabilities: dict[str, float], *, warmup: bool = False, corrections=()):
    """CapabilityTable for ``plan``; ``corrections`` = [(agent, prompt_id, sample_index, reward)]."""
    from hacrl_fed.v1 import rollout_pb2 as pb

    table = pb.CapabilityTable(run_id=plan.run_id, step=plan.step, warmup=warmup)
    for agent, cap in capabilities.items():
        table.agents.add(agent_id=agent, capability=cap, window=[cap], step_accuracy=cap)
    for agent, pid, idx, reward in corrections:
        table.corrections.add(agent_id=agent, prompt_id=pid, sample_index=idx, reward=reward,
                              verdict=pb.CORRECT if reward > 0 else pb.INCORRECT)
    return table


@pytest.fixture
def plans():
    """``(make_plan, make_table)`` helpers."""
    return make_plan, make_table
