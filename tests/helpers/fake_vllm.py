"""A stand-in for the parts of vLLM's documented API the vLLM rollout engine uses.

Fields and signatures follow vLLM's documentation: ``RequestOutput(prompt_token_ids, outputs)``,
``CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs, finish_reason, stop_reason)``,
``Logprob(logprob, rank, decoded_token)``, ``SamplingParams(**kw)``, ``LoRARequest(lora_name, lora_int_id, lora_path)``,
``LLM.generate / collective_rpc / sleep / wake_up / reset_prefix_cache`` and ``LLM.llm_engine.add_lora / remove_lora /
list_loras``. The model behind ``collective_rpc`` stores q/k/v and gate/up projections fused, as vLLM's Llama and
Gemma do, and its ``load_weights`` maps Hugging Face names onto those slices and returns the names it wrote.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

SAMPLING_FIELDS = {
    "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "max_tokens", "stop", "stop_token_ids", "seed", "logprobs", "skip_special_tokens", "include_stop_str_in_output",
}


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    request_id: str = "0"
    finished: bool = True


class SamplingParams:
    """Keeps its keywords; an unknown one is a TypeError, as in vLLM."""

    def __init__(self, **kw: Any) -> None:
        unknown = set(kw) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unexpected SamplingParams keyword(s): {sorted(unknown)}")
        self.kw = kw

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["kw"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class FusedModel(torch.nn.Module):
    """vLLM-style copy of a Hugging Face causal LM's parameters: q/k/v and gate/up stacked along dim 0.

    ``load_weights`` ignores names it does not know (as vLLM's loaders skip unexpected names) and returns the set
    of its own parameter names it wrote. ``lose_writes`` makes it claim every write while storing nothing
    (memory that sleep mode freed, say).
    """

    def __init__(self, hf_model) -> None:
        super().__init__()
        self.params = torch.nn.ParameterDict()
        self.slices: dict[str, tuple[str, int, int]] = {}
        groups: dict[str, list[tuple[int, str, torch.Tensor]]] = {}
        for name, p in hf_model.named_parameters():
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            if proj in _FUSED:
                fused, order = _FUSED[proj]
                groups.setdefault(f"{parent}.{fused}.{leaf}", []).append((order, name, p.detach()))
            else:
                self.params[_key(name)] = torch.nn.Parameter(p.detach().clone(), requires_grad=False)
                self.slices[name] = (name, 0, p.shape[0])
        for fused_name, parts in groups.items():
            parts.sort()
            start = 0
            for _, name, t in parts:
                self.slices[name] = (fused_name, start, start + t.shape[0])
                start += t.shape[0]
            self.params[_key(fused_name)] = torch.nn.Parameter(torch.cat([t for _, _, t in parts]).clone(),
                                                               requires_grad=False)
        self.lose_writes = False
        self.loads = 0

    def named_parameters(self, *args, **kwargs):           # vLLM-side names, dots restored
        for key, p in self.params.items():
            yield key.replace("__", "."), p

    def load_weights(self, weights):
        loaded = set()
        self.loads += 1
        for name, tensor in weights:
            if name not in self.slices:
                continue
            target, start, end = self.slices[name]
            if not self.lose_writes:
                with torch.no_grad():
                    self.params[_key(target)][start:end].copy_(tensor)
            loaded.add(target)
        return loaded

    def tensor(self, hf_name: str) -> torch.Tensor:
        target, start, end = self.slices[hf_name]
        return self.params[_key(target)][start:end]


def _key(name: str) -> str:
    return name.replace(".", "__")


@dataclass
class ModelRunner:
    model: Any

    def get_model(self):
        return self.model


@dataclass
class Worker:
    model_runner: ModelRunner
    rank: int = 0


@dataclass
class Engine:
    loras: dict[int, LoRARequest] = field(default_factory=dict)
    accept: bool = True
    events: list = field(default_factory=list)

    def add_lora(self, request: LoRARequest) -> bool:
        self.events.append(("add_lora", request.lora_int_id))
        if self.accept:
            self.loras[request.lora_int_id] = request
        return self.accept

    def remove_lora(self, lora_id: int) -> bool:
        self.events.append(("remove_lora", lora_id))
        return self.loras.pop(lora_id, None) is not None

    def list_loras(self) -> set[int]:
        return set(self.loras)


Responder = Callable[[list[int], SamplingParams, int], list[CompletionOutput]]


def random_responder(vocab_size: int, logprob: float = -0.5) -> Responder:
    """n completions of random ids; sample j drawn from seed + j, as vLLM seeds the n samples of a request
    (``vllm/v1/engine/parallel_sampling.py``); finish ``length``; every log-prob ``logprob``."""

    def respond(prompt: list[int], params: SamplingParams, _: int) -> list[CompletionOutput]:
        out = []
        for i in range(params.n):
            rng = random.Random(params.seed + i)
            ids = [rng.randrange(3, vocab_size) for _ in range(params.max_tokens)]
            lps = ([{t: Logprob(logprob, 1)} for t in ids] if params.kw.get("logprobs") is not None else None)
            out.append(CompletionOutput(i, "", ids, None, lps, "length", None))
        return out

    return respond


class FakeLLM:
    """``vllm.LLM`` as the engine uses it: generation from a ``responder``; one worker holding a :class:`FusedModel`."""

    def __init__(self, hf_model, responder: Responder, *, shuffle: bool = False) -> None:
        self.workers = [Worker(ModelRunner(FusedModel(hf_model)))]
        self.responder = responder
        self.shuffle = shuffle
        self.llm_engine = Engine()
        self.events = self.llm_engine.events
        self.calls: list[dict[str, Any]] = []

    @property
    def model(self) -> FusedModel:
        return self.workers[0].model_runner.model

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.events.append(("generate", getattr(lora_request, "lora_int_id", None)))
        self.calls.append({"prompts": prompts, "params": params, "lora_request": lora_request})
        out = []
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            completions = self.responder(list(p["prompt_token_ids"]), sp, i)
            if self.shuffle:
                completions = list(reversed(completions))
            out.append(RequestOutput(list(p["prompt_token_ids"]), completions, request_id=str(i)))
        return out

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.events.append(("rpc", getattr(method, "__name__", str(method))))
        return [method(w, *args, **(kwargs or {})) for w in self.workers]

    def sleep(self, level: int = 1) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.events.append(("wake_up", tuple(tags or ())))

    def reset_prefix_cache(self) -> bool:
        self.events.append(("reset_prefix_cache",))
        return True
