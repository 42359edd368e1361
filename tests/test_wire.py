"""Wire schema (protos/hacrl_fed/v1): every message round-trips; committed generated code is current."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from hacrl_fed.v1 import rollout_pb2, worker_pb2

ROOT = Path(__file__).resolve().parents[1]
MODULES = (rollout_pb2, worker_pb2)

# Non-default values per scalar kind: non-ASCII text, extremes of the integer ranges, negative floats.
_SCALARS = {
    FieldDescriptor.TYPE_STRING: ["π ≈ 3.14 \\boxed{x} 東京 🙂", "second"],
    FieldDescriptor.TYPE_BYTES: [bytes(range(256)), b"\x00\xff"],
    FieldDescriptor.TYPE_DOUBLE: [-1234.5678e-3, 1e300],
    FieldDescriptor.TYPE_FLOAT: [-0.5, 3.25],
    FieldDescriptor.TYPE_INT32: [-(2**31), 2**31 - 1],
    FieldDescriptor.TYPE_INT64: [-(2**63), 2**63 - 1],
    FieldDescriptor.TYPE_UINT32: [2**32 - 1, 7],
    FieldDescriptor.TYPE_UINT64: [2**64 - 1, 9],
    FieldDescriptor.TYPE_BOOL: [True, True],
}


def _all_messages() -> list[type[Message]]:
    """Every top-level and nested message class of the two proto modules (map entries excluded)."""
    found: dict[str, type[Message]] = {}

    def visit(desc: Descriptor, module) -> None:
        if desc.GetOptions().map_entry:
            return
        found[desc.full_name] = _class_of(desc, module)
        for nested in desc.nested_types:
            visit(nested, module)

    for module in MODULES:
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            visit(desc, module)
    return [found[k] for k in sorted(found)]


def _class_of(desc: Descriptor, module):
    if desc.containing_type is None:
        return getattr(module, desc.name)
    return getattr(_class_of(desc.containing_type, module), desc.name)


def _value(field: FieldDescriptor, i: int):
    if field.type == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values if v.number != 0]
        return values[i % len(values)]
    return _SCALARS[field.type][i]


def _fill(msg: Message, depth: int = 0) -> Message:
    """Set every field of ``msg`` to a non-default value (two elements for repeated and map fields)."""
    for field in msg.DESCRIPTOR.fields:
        target = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            for i in range(2):
                key = _value(key_f, i)
                if val_f.message_type is not None:
                    _fill(target[key], depth + 1)
                else:
                    target[key] = _value(val_f, i)
        elif field.is_repeated:
            for i in range(2):
                if field.message_type is not None:
                    _fill(target.add(), depth + 1)
                else:
                    target.append(_value(field, i))
        elif field.message_type is not None:
            _fill(target, depth + 1)
        else:
            setattr(msg, field.name, _value(field, 0))
    return msg


MESSAGES = _all_messages()


def test_every_message_is_covered():
    names = {m.DESCRIPTOR.full_name for m in MESSAGES}
    declared = {d.full_name for mod in MODULES for d in mod.DESCRIPTOR.message_types_by_name.values()}
    assert declared <= names
    assert {"hacrl_fed.v1.RolloutBatch", "hacrl_fed.v1.SignedEnvelope", "hacrl_fed.v1.TrainRequest",
            "hacrl_fed.v1.CheckpointRequest", "hacrl_fed.v1.HealthRequest"} <= names


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda c: c.DESCRIPTOR.full_name)
def test_round_trip(cls: type[Message]):
    msg = _fill(cls())
    # every field really carries a non-default value (an empty message trivially round-trips)
    assert len(msg.ListFields()) == len(cls.DESCRIPTOR.fields)
    data = msg.SerializeToString(deterministic=True)
    parsed = cls.FromString(data)
    assert parsed == msg
    assert parsed.SerializeToString(deterministic=True) == data
    if cls.DESCRIPTOR.fields:
        assert parsed != cls()


def test_round_trip_detects_a_change():
    """Guard for the round-trip test itself: a one-field difference is not equal."""
    batch = _fill(rollout_pb2.RolloutBatch())
    other = rollout_pb2.RolloutBatch.FromString(batch.SerializeToString())
    other.rollouts[1].reward = 0.25
    assert other != batch


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extra) not installed")
def test_generated_code_is_current(tmp_path: Path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run(["bash", str(ROOT / "protos" / "generate.sh"), str(tmp_path)], check=True, env=env,
                   capture_output=True, timeout=120)
    fresh = sorted((tmp_path / "hacrl_fed" / "v1").glob("*.py*"))
    assert {p.name for p in fresh} >= {"rollout_pb2.py", "worker_pb2.py", "worker_pb2_grpc.py"}
    stale = [p.name for p in fresh if p.read_bytes() != (ROOT / "hacrl_fed" / "v1" / p.name).read_bytes()]
    assert not stale, f"committed generated code differs from protos/ (run `bash protos/generate.sh`): {stale}"
