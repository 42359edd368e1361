from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    CORRECT: _ClassVar[Verdict]
    INCORRECT: _ClassVar[Verdict]
    VERIFIER_ERROR: _ClassVar[Verdict]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    STOP: _ClassVar[FinishReason]
    LENGTH: _ClassVar[FinishReason]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ENV: _ClassVar[Role]
    AGENT: _ClassVar[Role]
VERDICT_UNSPECIFIED: Verdict
CORRECT: Verdict
INCORRECT: Verdict
VERIFIER_ERROR: Verdict
FINISH_REASON_UNSPECIFIED: FinishReason
STOP: FinishReason
LENGTH: FinishReason
ROLE_UNSPECIFIED: Role
ENV: Role
AGENT: Role

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class EpisodeSpec(_message.Message):
    __slots__ = ("env_id", "config_json", "seed", "max_turns")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    config_json: str
    seed: int
    max_turns: int
    def __init__(self, env_id: _Optional[str] = ..., config_json: _Optional[str] = ..., seed: _Optional[int] = ..., max_turns: _Optional[int] = ...) -> None: ...

class PromptItem(_message.Message):
    __slots__ = ("prompt_id", "text", "reference_answer", "answer_style", "task", "episode")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ANSWER_FIELD_NUMBER: _ClassVar[int]
    ANSWER_STYLE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    text: str
    reference_answer: str
    answer_style: str
    task: str
    episode: EpisodeSpec
    def __init__(self, prompt_id: _Optional[str] = ..., text: _Optional[str] = ..., reference_answer: _Optional[str] = ..., answer_style: _Optional[str] = ..., task: _Optional[str] = ..., episode: _Optional[_Union[EpisodeSpec, _Mapping]] = ...) -> None: ...

class RoundPlan(_message.Message):
    __slots__ = ("run_id", "step", "samples_per_prompt", "sampling", "prompts", "deadline_unix_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    samples_per_prompt: int
    sampling: SamplingParams
    prompts: _containers.RepeatedCompositeFieldContainer[PromptItem]
    deadline_unix_s: float
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., prompts: _Optional[_Iterable[_Union[PromptItem, _Mapping]]] = ..., deadline_unix_s: _Optional[float] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("role", "text", "finish_reason", "behaviour_eos_logprob")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_EOS_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    role: Role
    text: str
    finish_reason: FinishReason
    behaviour_eos_logprob: float
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., behaviour_eos_logprob: _Optional[float] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("prompt_id", "sample_index", "response_text", "reward", "verdict", "behaviour_logprob_sum", "behaviour_token_count", "finish_reason", "behaviour_eos_logprob", "episode", "turns")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOGPROB_SUM_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_EOS_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    sample_index: int
    response_text: str
    reward: float
    verdict: Verdict
    behaviour_logprob_sum: float
    behaviour_token_count: int
    finish_reason: FinishReason
    behaviour_eos_logprob: float
    episode: EpisodeSpec
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    def __init__(self, prompt_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., response_text: _Optional[str] = ..., reward: _Optional[float] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., behaviour_logprob_sum: _Optional[float] = ..., behaviour_token_count: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., behaviour_eos_logprob: _Optional[float] = ..., episode: _Optional[_Union[EpisodeSpec, _Mapping]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ...) -> None: ...

class RolloutBatch(_message.Message):
    __slots__ = ("run_id", "step", "agent_id", "model_fingerprint", "rollouts", "sampling", "model_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    agent_id: str
    model_fingerprint: str
    rollouts: _containers.RepeatedCompositeFieldContainer[Rollout]
    sampling: SamplingParams
    model_version: int
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., agent_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., rollouts: _Optional[_Iterable[_Union[Rollout, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., model_version: _Optional[int] = ...) -> None: ...

class SignedEnvelope(_message.Message):
    __slots__ = ("payload", "signature", "key_id")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    key_id: str
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ...) -> None: ...

class AgentCapability(_message.Message):
    __slots__ = ("agent_id", "capability", "window", "step_accuracy", "task_capability")
    class TaskCapabilityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    STEP_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TASK_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    capability: float
    window: _containers.RepeatedScalarFieldContainer[float]
    step_accuracy: float
    task_capability: _containers.ScalarMap[str, float]
    def __init__(self, agent_id: _Optional[str] = ..., capability: _Optional[float] = ..., window: _Optional[_Iterable[float]] = ..., step_accuracy: _Optional[float] = ..., task_capability: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RewardCorrection(_message.Message):
    __slots__ = ("agent_id", "prompt_id", "sample_index", "reward", "verdict")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    prompt_id: str
    sample_index: int
    reward: float
    verdict: Verdict
    def __init__(self, agent_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., reward: _Optional[float] = ..., verdict: _Optional[_Union[Verdict, str]] = ...) -> None: ...

class CapabilityTable(_message.Message):
    __slots__ = ("run_id", "step", "agents", "corrections", "warmup")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentCapability]
    corrections: _containers.RepeatedCompositeFieldContainer[RewardCorrection]
    warmup: bool
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentCapability, _Mapping]]] = ..., corrections: _Optional[_Iterable[_Union[RewardCorrection, _Mapping]]] = ..., warmup: _Optional[bool] = ...) -> None: ...

class SourceMetrics(_message.Message):
    __slots__ = ("source_agent", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SOURCE_AGENT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    source_agent: str
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, source_agent: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class TrainReport(_message.Message):
    __slots__ = ("run_id", "step", "agent_id", "metrics", "per_source", "rejected")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    agent_id: str
    metrics: _containers.ScalarMap[str, float]
    per_source: _containers.RepeatedCompositeFieldContainer[SourceMetrics]
    rejected: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., agent_id: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., per_source: _Optional[_Iterable[_Union[SourceMetrics, _Mapping]]] = ..., rejected: _Optional[_Iterable[str]] = ...) -> None: ...
