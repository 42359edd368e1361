"""Helpers shared by the tests of the federation packages (importable by name: tests/helpers is on sys.path)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hacrl_fed.config import SamplingConfig
from hacrl_fed.coordinator.phases import build_round_plan
from hacrl_fed.data.problem import Problem
from hacrl_fed.protocol.keys import Roster, generate_identity, load_signing_key, roster_entry_toml
from hostile import Keys


@dataclass
class Federation:
    """Identities of a few agents (keys on disk) and the roster listing them."""

    root: Path
    roster_path: Path
    roster: Roster
    keys: dict[str, Keys]

    def key_file(self, agent: str) -> Path:
        return self.root / f"{agent}.ed25519.key"

    def node_key_file(self, agent: str) -> Path:
        return self.root / f"{agent}.node.key"


def make_federation(root: Path, agents: list[str], roles: dict[str, str] | None = None) -> Federation:
    """Generate identities for ``agents`` (+ an outsider ``eve``, not in the roster) under ``root``; ``roles``:
    roster ``role`` per agent (default ``learner``)."""
    root.mkdir(parents=True, exist_ok=True)
    blocks, keys = [], {}
    eve = generate_identity("eve", root)
    for agent in agents:
        ident = generate_identity(agent, root)
        blocks.append(roster_entry_toml(agent, ident.ed25519, ident.node_public, (roles or {}).get(agent, "learner")))
        keys[agent] = Keys(own=load_signing_key(ident.signing_key), stranger=load_signing_key(eve.signing_key))
    roster_path = root / "roster.toml"
    roster_path.write_text("\n".join(blocks), encoding="utf-8")
    return Federation(root, roster_path, Roster.load(roster_path), keys)


def problems(n: int, offset: int = 0) -> list[Problem]:
    return [Problem(id=f"p{offset + i}", problem=f"What is {i} + {i + 1}?", answer=str(2 * i + 1)) for i in range(n)]


def make_plan(step: int = 1, *, b: int = 3, g: int = 2, run_id: str = "run-test"):
    return build_round_plan(run_id=run_id, step=step, problems=problems(b), samples_per_prompt=g,
                            sampling=SamplingConfig(max_new_tokens=16), seed=0, deadline_unix_s=time.time() + 60)


@dataclass
class FakeVerdict:
    verdict: str
    reward: float


def boxed_verify(responses, references, styles, problems=None):
    """Verifier stand-in: correct iff the response contains ``\\boxed{<reference>}``."""
    out = []
    for r, ref in zip(responses, references):
        ok = f"\\boxed{{{ref}}}" in r
        out.append(FakeVerdict("correct" if ok else "incorrect", 1.0 if ok else 0.0))
    return out
