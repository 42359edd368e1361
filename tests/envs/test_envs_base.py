"""EpisodeSpec bounds and its wire round trip; bounded observations."""

from __future__ import annotations

import pytest

from hacrl_fed.envs import MAX_OBSERVATION_CHARS, EpisodeSpec, bound_observation
from hacrl_fed.envs.base import MAX_CONFIG_BYTES, MAX_SEED, MAX_TURNS
from hacrl_fed.v1 import rollout_pb2


def _spec(**kw):
    args = {"env_id": "textarena/GuessTheNumber-v0", "config": {"max_number": 50}, "seed": 7, "max_turns": 8}
    return EpisodeSpec(**{**args, **kw})


def test_round_trip_through_the_wire_keeps_every_field():
    spec = _spec(config={"b": [1, 2.5, None, True], "a": {"z": "ü", "y": -3}}, seed=MAX_SEED, max_turns=MAX_TURNS)
    pb = spec.to_proto()
    assert isinstance(pb, rollout_pb2.EpisodeSpec)
    assert pb.config_json == '{"a":{"y":-3,"z":"ü"},"b":[1,2.5,null,true]}'
    back = EpisodeSpec.from_proto(rollout_pb2.EpisodeSpec.FromString(pb.SerializeToString()))
    assert back == spec and hash(back) == hash(spec)
    assert back.config_dict() == {"a": {"y": -3, "z": "ü"}, "b": [1, 2.5, None, True]}


def test_a_spec_built_from_another_specs_config_is_equal():
    spec = _spec(config={"a": {"b": [1, {"c": 2}]}})
    again = EpisodeSpec(spec.env_id, spec.config, spec.seed, spec.max_turns)
    assert again == spec and hash(again) == hash(spec) and again.config_json == spec.config_json
    assert _spec(config={"x": 1}) != _spec(config={"x": 1.0})  # equal as Python numbers, not on the wire
    assert _spec(seed=1) != _spec(seed=2) and _spec() != "spec"


def test_config_is_stored_canonical_and_read_only():
    spec = _spec(config={"k": (1, 2)})
    assert spec.config_json == '{"k":[1,2]}'
    with pytest.raises(TypeError):
        spec.config["k"] = 3  # type: ignore[index]
    copy = spec.config_dict()
    copy["k"].append(3)
    assert spec.config_dict() == {"k": [1, 2]}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("env_id", "", "env_id must be 1..128"),
    ("env_id", "a" * 129, "env_id must be 1..128"),
    ("env_id", "has space", "printable ASCII"),
    ("env_id", "ünicode", "printable ASCII"),
    ("env_id", 3, "env_id must be a string"),
    ("seed", -1, "seed must be in 0.."),
    ("seed", 2**63, "seed must be in 0.."),
    ("seed", True, "seed must be an integer"),
    ("seed", 1.0, "seed must be an integer"),
    ("max_turns", 0, "max_turns must be in 1..32"),
    ("max_turns", MAX_TURNS + 1, "max_turns must be in 1..32"),
    ("config", [1, 2], "config must be a JSON object"),
    ("config", {1: "x"}, "keys must be strings"),
    ("config", {"x": float("nan")}, "not a JSON number"),
    ("config", {"x": float("inf")}, "not a JSON number"),
    ("config", {"x": object()}, "is not a JSON value"),
    ("config", {"x": "a" * MAX_CONFIG_BYTES}, f"at most {MAX_CONFIG_BYTES}"),
])
def test_every_bound_is_checked(field, value, message):
    with pytest.raises(ValueError, match=message):
        _spec(**{field: value})


def test_the_config_size_bound_counts_utf8_bytes():
    fits = {"x": "é" * ((MAX_CONFIG_BYTES - 8) // 2)}  # '{"x":""}' is 8 bytes, é is 2
    assert len(_spec(config=fits).config_json.encode()) == MAX_CONFIG_BYTES
    with pytest.raises(ValueError, match="bytes"):
        _spec(config={"x": fits["x"] + "é"})


@pytest.mark.parametrize(("config_json", "message"), [
    ("", "not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"b":1,"a":2}', "not canonical"),
    ('{"a": 1}', "not canonical"),
    ('{"a":1,"a":2}', "not canonical"),
    ('{"a":NaN}', "not"),
    ("{" * 3000, "not JSON"),
    ("[" * 3000 + "]" * 1000, "not JSON"),
    ("[" * 2100 + "]" * 2100, "longer than"),
])
def test_from_proto_refuses_a_config_json_that_is_not_canonical(config_json, message):
    pb = rollout_pb2.EpisodeSpec(env_id="calculator", config_json=config_json, seed=1, max_turns=2)
    with pytest.raises(ValueError, match=message):
        EpisodeSpec.from_proto(pb)


def test_from_proto_checks_the_wire_ranges():
    ok = {"env_id": "calculator", "config_json": "{}", "seed": 1, "max_turns": 2}
    assert EpisodeSpec.from_proto(rollout_pb2.EpisodeSpec(**ok)).config == {}
    for key, value, message in [("seed", 2**64 - 1, "seed"), ("max_turns", 0, "max_turns"),
                                ("max_turns", 33, "max_turns"), ("env_id", "", "env_id")]:
        with pytest.raises(ValueError, match=message):
            EpisodeSpec.from_proto(rollout_pb2.EpisodeSpec(**{**ok, key: value}))


def test_bound_observation_cuts_deterministically_and_is_idempotent():
    text = "".join(chr(0x41 + i % 26) for i in range(3 * MAX_OBSERVATION_CHARS))
    cut = bound_observation(text)
    assert len(cut) == MAX_OBSERVATION_CHARS and cut.endswith("[… cut]")
    assert cut == bound_observation(text) == bound_observation(cut)
    assert text.startswith(cut[:-len("\n[… cut]")])
    assert bound_observation("short") == "short"
    assert bound_observation("x" * MAX_OBSERVATION_CHARS) == "x" * MAX_OBSERVATION_CHARS
