"""A strong contributor for the benchmarks: an OpenAI-compatible server that answers the task suite's problems
with brief, correct worked solutions at a set accuracy p.

It stands in for a strong vendor model among the sites (docs/cross-vendor.md): a rollout-only site points its
``agent.endpoint`` at it like at any chat-completions API. It is not a model. It knows the reference answer of
every training and held-out item of a ``reasoning_gym`` config (it regenerates the items with the config's
generators and seeds) and writes, for the item a request's last user message names, a short worked solution in a
style a 135M–270M model can imitate::

    3.3 + 9.8 = 13.1. \\boxed{13.1}
    2 chickens have 2 × 2 = 4 legs, 3 cows have 3 × 4 = 12 legs, 4 + 12 = 16. \\boxed{16}

Each choice is correct with probability ``p`` and otherwise the same worked form with a wrong final value
(the last digit moved by one), drawn from a generator seeded by (server seed, request seed, item id, choice
index), so the same request gives the same choices. A message that names no known item gets the refusal
``I cannot solve this problem.`` (no boxed answer, verified wrong). Like many closed APIs the server returns no
token log-probs: the learners train its rows by ``algo.missing_behaviour_logprob``.

Run it by hand (then set ``agent.endpoint = { url = "http://127.0.0.1:8011/v1" }`` on a rollout-only site)::

    python benchmarks/strong_contributor.py --config examples/tasks.toml --accuracy 0.9 --port 8011

or in-process with :func:`serve_strong_contributor` (a uvicorn server in a thread on a free port).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

REFUSAL = "I cannot solve this problem."
"""The answer to a message that names no known item (no boxed value: the verifier scores it wrong)."""

MAX_MESSAGES = 16
MAX_MESSAGE_CHARS = 8_192
MAX_CHOICES = 64
"""Bounds of one request: a request over them is refused with HTTP 400 and the reason."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_EXPRESSION = re.compile(r"(-?\d+(?:\.\d+)?(?:\s*[-+*/×]\s*-?\d+(?:\.\d+)?)+)\s*=")


@dataclass(frozen=True)
class Item:
    """One problem the server can solve: its id (``<label>-<generator seed>``), generator, reference answer and
    the generator's metadata."""

    id: str
    generator: str
    answer: str
    metadata: dict


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def expression_of(question: str, metadata: dict) -> str | None:
    """The arithmetic expression of an item: the generator's ``expression`` metadata, else the last
    ``a op b … =`` in the question (``decimal_arithmetic``); None when there is none."""
    if isinstance(metadata.get("expression"), str):
        return metadata["expression"]
    found = _EXPRESSION.findall(question)
    return " ".join(found[-1].replace("*", " * ").replace("+", " + ").split()) if found else None


def _legs(metadata: dict, answer: str) -> str | None:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    animals = metadata.get("animals")
    if not isinstance(animals, dict) or not animals or any(a not in ANIMALS for a in animals):
        return None
    parts, totals = [], []
    for animal, count in animals.items():
        legs = int(count) * ANIMALS[animal]
        name = animal if int(count) == 1 else f"{animal}s"
        parts.append(f"{count} {name} have {count} × {ANIMALS[animal]} = {legs} legs")
        totals.append(str(legs))
    tail = f", {' + '.join(totals)} = {answer}" if len(totals) > 1 else ""
    return ", ".join(parts) + tail + "."


def worked_solution(item: Item, question: str, answer: str) -> str:
    """A brief worked solution of ``item`` ending in ``answer`` (the reference, or a wrong value).

    ``leg_counting``: the legs per animal, then their sum; an item with an arithmetic expression: the
    expression and its value; any other generator: the boxed answer alone.
    """
    if item.generator == "leg_counting" and (steps := _legs(item.metadata, answer)):
        return f"{steps} \\boxed{{{answer}}}"
    if expr := expression_of(question, item.metadata):
        return f"{expr} = {answer}. \\boxed{{{answer}}}"
    return f"\\boxed{{{answer}}}"


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A wrong final value near ``answer``: its last digit moved by ±1 (a non-numeric answer gets ``0`` or,
    when it is ``0``, ``1``)."""
    if not _NUMBER.fullmatch(answer.strip()):
        return "1" if answer.strip() == "0" else "0"
    places = len(answer.split(".")[1]) if "." in answer else 0
    step = 10.0 ** -places * rng.choice((-1, 1))
    return f"{float(answer) + step:.{places}f}"


class Solutions:
    """The items of a ``reasoning_gym`` data config, by their problem text (training and held-out alike).

    ``data``: a :class:`hacrl_fed.config.DataConfig` with ``source = "reasoning_gym"`` (ValueError otherwise).
    """

    def __init__(self, data: Any) -> None:
        from hacrl_fed.data.datasets import load_problems
        from hacrl_fed.data.tasks import _dataset

        if data.source != "reasoning_gym":
            raise ValueError(f"the strong contributor solves reasoning_gym task suites; data.source is {data.source!r}")
        specs = {s.label: s for s in [*data.tasks, *data.eval_tasks]}
        train, held = load_problems(data)
        self.by_text: dict[str, tuple[Item, str]] = {}
        for p in [*train, *held]:
            label, _, seed = p.id.rpartition("-")
            spec = specs[label]
            entry = _dataset(spec, int(seed), 1)[0]
            self.by_text[p.problem.strip()] = (Item(p.id, spec.name, p.answer, dict(entry["metadata"])), p.problem)

    def __len__(self) -> int:
        return len(self.by_text)

    def find(self, text: str) -> tuple[Item, str] | None:
        return self.by_text.get(text.strip())

    def example_request(self, url: str, model: str) -> str:
        """A ``curl`` command asking for one item of the suite (the first one), ready to paste in a shell."""
        import json
        import shlex

        question = next(iter(self.by_text.values()))[1]
        body = {"model": model, "n": 2, "messages": [{"role": "user", "content": question}]}
        return (f"curl -s {url}/chat/completions -H 'Content-Type: application/json' "
                f"-d {shlex.quote(json.dumps(body))}")


def choice_text(solutions: Solutions, messages: Sequence[dict], accuracy: float, key: Sequence[Any]) -> str:
    """The text of one choice for a chat request: the last user message's item solved, correct with probability
    ``accuracy``, drawn from a generator seeded by ``key`` (server seed, request seed, choice index)."""
    user = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), None)
    found = solutions.find(user) if isinstance(user, str) else None
    if found is None:
        return REFUSAL
    item, question = found
    digest = hashlib.sha256(repr((*key, item.id)).encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    correct = rng.random() < accuracy
    return worked_solution(item, question, item.answer if correct else wrong_answer(item.answer, rng))


def _check_request(body: Any) -> tuple[list[dict], int, int] | str:
    """``(messages, n, seed)`` of a chat-completions body, or the reason it is refused."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not 0 < len(msgs) <= MAX_MESSAGES:
        return f"messages must be a list of 1..{MAX_MESSAGES} messages"
    for m in msgs:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                and len(m["content"]) <= MAX_MESSAGE_CHARS):
            return f"each message needs a role and a text content of at most {MAX_MESSAGE_CHARS} characters"
    n, seed = body.get("n", 1), body.get("seed", 0)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        return f"n must be an integer in 1..{MAX_CHOICES}"
    if seed is None:
        seed = 0
    if not isinstance(seed, int) or isinstance(seed, bool):
        return "seed must be an integer"
    return msgs, n, seed


def make_app(solutions: Solutions, *, accuracy: float, seed: int = 0, model: str = "strong-contributor"):
    """The FastAPI app: ``GET /v1/models`` and ``POST /v1/chat/completions`` (``n`` choices; no log-probs).

    Raises ``ValueError`` for an accuracy outside [0, 1]."""
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    app = FastAPI()
    counter = iter(range(1 << 62))

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "hacrl-fed"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
        except ValueError:
            body = None
        checked = _check_request(body)
        if isinstance(checked, str):
            return JSONResponse({"error": {"message": checked, "type": "invalid_request_error"}}, status_code=400)
        msgs, n, req_seed = checked
        texts = [choice_text(solutions, msgs, accuracy, (seed, req_seed, k)) for k in range(n)]
        choices = [{"index": k, "message": {"role": "assistant", "content": t}, "finish_reason": "stop",
                    "logprobs": None} for k, t in enumerate(texts)]
        words = sum(len(t.split()) for t in texts)
        return {"id": f"chatcmpl-{next(counter)}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": choices,
                "usage": {"prompt_tokens": 0, "completion_tokens": words, "total_tokens": words}}

    return app


@contextmanager
def serve_strong_contributor(data: Any, *, accuracy: float, seed: int = 0, port: int | None = None,
                             model: str = "strong-contributor") -> Iterator[str]:
    """Serve the strong contributor for ``data`` on 127.0.0.1 in a background thread; yields its ``/v1`` base URL
    and stops the server on exit. Raises ``RuntimeError`` if it does not come up within 30 s."""
    import uvicorn

    from contributor import free_port

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(Solutions(data), accuracy=accuracy, seed=seed, model=model),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="strong-contributor", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the strong contributor did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True, help="a run config with a reasoning_gym data source")
    ap.add_argument("--accuracy", type=float, default=0.9, help="p: the share of correct choices (default 0.9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--model", default="strong-contributor", help="the model name the server reports")
    args = ap.parse_args(argv)
    from hacrl_fed.config import SimulateConfig, load_config

    try:
        cfg = load_config(args.config, SimulateConfig)
        solutions = Solutions(cfg.run.data)
        app = make_app(solutions, accuracy=args.accuracy, seed=args.seed, model=args.model)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import uvicorn

    url = f"http://127.0.0.1:{args.port}/v1"
    print(f"strong contributor: p = {args.accuracy}, {url}, {len(solutions)} items; it answers a user message that "
          f"is an item's text exactly, e.g.\n  {solutions.example_request(url, args.model)}", file=sys.stderr)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
