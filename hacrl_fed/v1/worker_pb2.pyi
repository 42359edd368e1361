from hacrl_fed.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("plan", "notice")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    plan: _rollout_pb2.RoundPlan
    notice: str
    def __init__(self, plan: _Optional[_Union[_rollout_pb2.RoundPlan, _Mapping]] = ..., notice: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("envelope", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    envelope: _rollout_pb2.SignedEnvelope
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, envelope: _Optional[_Union[_rollout_pb2.SignedEnvelope, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("run_id", "step", "envelopes", "capabilities", "plan", "deadline_unix_s", "checkpoint_every", "notice", "peer_plans")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    PEER_PLANS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    envelopes: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.SignedEnvelope]
    capabilities: _rollout_pb2.CapabilityTable
    plan: _rollout_pb2.RoundPlan
    deadline_unix_s: float
    checkpoint_every: int
    notice: str
    peer_plans: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.RoundPlan]
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., envelopes: _Optional[_Iterable[_Union[_rollout_pb2.SignedEnvelope, _Mapping]]] = ..., capabilities: _Optional[_Union[_rollout_pb2.CapabilityTable, _Mapping]] = ..., plan: _Optional[_Union[_rollout_pb2.RoundPlan, _Mapping]] = ..., deadline_unix_s: _Optional[float] = ..., checkpoint_every: _Optional[int] = ..., notice: _Optional[str] = ..., peer_plans: _Optional[_Iterable[_Union[_rollout_pb2.RoundPlan, _Mapping]]] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("prompts", "samples", "sampling", "run_id")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.PromptItem]
    samples: int
    sampling: _rollout_pb2.SamplingParams
    run_id: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[_rollout_pb2.PromptItem, _Mapping]]] = ..., samples: _Optional[int] = ..., sampling: _Optional[_Union[_rollout_pb2.SamplingParams, _Mapping]] = ..., run_id: _Optional[str] = ...) -> None: ...

class EvaluateResult(_message.Message):
    __slots__ = ("prompt_id", "correct", "total", "reward_sum")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    REWARD_SUM_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    correct: int
    total: int
    reward_sum: float
    def __init__(self, prompt_id: _Optional[str] = ..., correct: _Optional[int] = ..., total: _Optional[int] = ..., reward_sum: _Optional[float] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("metrics", "results")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    results: _containers.RepeatedCompositeFieldContainer[EvaluateResult]
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., results: _Optional[_Iterable[_Union[EvaluateResult, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("agent_id", "model_fingerprint", "step", "device", "ready", "run_id", "engine")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    model_fingerprint: str
    step: int
    device: str
    ready: bool
    run_id: str
    engine: str
    def __init__(self, agent_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., step: _Optional[int] = ..., device: _Optional[str] = ..., ready: _Optional[bool] = ..., run_id: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("kind", "path")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[CheckpointRequest.Kind]
        SAVE: _ClassVar[CheckpointRequest.Kind]
        EXPORT: _ClassVar[CheckpointRequest.Kind]
    KIND_UNSPECIFIED: CheckpointRequest.Kind
    SAVE: CheckpointRequest.Kind
    EXPORT: CheckpointRequest.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    kind: CheckpointRequest.Kind
    path: str
    def __init__(self, kind: _Optional[_Union[CheckpointRequest.Kind, str]] = ..., path: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...
