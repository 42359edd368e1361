"""Weak Ed25519 roster keys (small-order points) are refused at load, with the file and the agent named."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedutil import make_plan
from hacrl_fed.protocol.envelope import open_envelope
from hacrl_fed.protocol.keys import KeyFileError, Roster, RosterError, load_verify_key, roster_entry_toml
from hacrl_fed.v1 import rollout_pb2 as pb
from hostile import honest_batch

SMALL_ORDER = [
    "00" * 32,                                                              # (sqrt(-1), 0), order 4
    "01" + "00" * 31,                                                       # the identity, order 1
    "ec" + "ff" * 30 + "7f",                                                # (0, -1), order 2
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",     # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",     # its negation
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",     # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",     # its negation
    "0000000000000000000000000000000000000000000000000000000000000080",     # (-sqrt(-1), 0), order 4
]
"""The 8 points of order dividing 8, canonically encoded (the constants libsodium blocks)."""
NON_CANONICAL = ["ed" + "ff" * 30 + "7f", "ee" + "ff" * 30 + "7f", "01" + "00" * 30 + "80", "ff" * 32]
"""y ≥ p (0 and 1 encoded again), the identity with the sign bit set, all ones."""


def _b64(hexstr: str) -> str:
    return base64.b64encode(bytes.fromhex(hexstr)).decode()


def _roster_file(tmp_path, ed25519: str):
    good = Ed25519PrivateKey.generate().public_key()
    raw = good.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    path = tmp_path / "roster.toml"
    path.write_text(roster_entry_toml("alice", base64.b64encode(raw).decode()) + "\n"
                    + roster_entry_toml("mallory", ed25519), encoding="utf-8")
    return path


def test_a_constant_signature_verifies_for_the_identity_key():
    """Why weak keys matter: with the identity as an agent's key, one fixed signature opens any batch."""
    forged = pb.SignedEnvelope(payload=honest_batch(make_plan(), "mallory").SerializeToString(deterministic=True),
                               signature=bytes.fromhex("01" + "00" * 63), key_id="mallory")
    identity = Ed25519PublicKey.from_public_bytes(bytes.fromhex(SMALL_ORDER[1]))
    batch = open_envelope(forged, {"mallory": identity}, run_id="run-test", step=1)  # a plain dict: no check
    assert batch.agent_id == "mallory"


@pytest.mark.parametrize("hexstr", SMALL_ORDER)
def test_roster_refuses_every_small_order_key(tmp_path, hexstr):
    path = _roster_file(tmp_path, _b64(hexstr))
    with pytest.raises(RosterError) as err:
        Roster.load(path)
    message = str(err.value)
    assert f"{path}: agents.mallory.ed25519: refused weak key: a small-order Ed25519 point" in message
    assert "\n" not in message


@pytest.mark.parametrize("hexstr", NON_CANONICAL)
def test_roster_refuses_non_canonical_and_off_curve_encodings(tmp_path, hexstr):
    with pytest.raises(RosterError, match="agents.mallory.ed25519: refused weak key"):
        Roster.load(_roster_file(tmp_path, _b64(hexstr)))


def test_roster_refuses_a_key_with_a_small_order_component(tmp_path):
    """An honest point plus an order-8 point: on the curve, not small-order, outside the prime-order subgroup."""
    from hacrl_fed.protocol import weak_keys as w
    from hacrl_fed.protocol.weak_keys import weak_key_problem

    honest = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                    serialization.PublicFormat.Raw)
    mixed = w._add(w._decode(honest), w._decode(bytes.fromhex(SMALL_ORDER[3])))
    z = pow(mixed[2], w._P - 2, w._P)
    x, y = mixed[0] * z % w._P, mixed[1] * z % w._P
    raw = (y | (x & 1) << 255).to_bytes(32, "little")
    assert weak_key_problem(raw) and "small-order component" in weak_key_problem(raw)
    with pytest.raises(RosterError, match="small-order component"):
        Roster.load(_roster_file(tmp_path, base64.b64encode(raw).decode()))


def test_generated_keys_are_never_refused():
    from hacrl_fed.protocol.weak_keys import weak_key_problem

    for _ in range(50):
        raw = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                     serialization.PublicFormat.Raw)
        assert weak_key_problem(raw) is None


def test_public_key_files_with_weak_keys_are_refused(tmp_path):
    weak = Ed25519PublicKey.from_public_bytes(bytes.fromhex(SMALL_ORDER[1]))
    pem = tmp_path / "weak.pub"
    pem.write_bytes(weak.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    raw64 = tmp_path / "weak.b64"
    raw64.write_text(_b64(SMALL_ORDER[0]))
    for path in (pem, raw64):
        with pytest.raises((KeyFileError, ValueError), match="weak"):
            load_verify_key(path)


def test_server_and_client_commands_stop_on_a_weak_roster_key(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hacrl_fed.cli import app

    roster = _roster_file(tmp_path, _b64(SMALL_ORDER[0]))  # min_agents 3 > 2 agents: never starts a run
    server = tmp_path / "server.toml"
    server.write_text(f'roster = "{roster}"\n[superlink]\ninsecure = true\nnode_auth = false\n'
                      f'[run]\nmin_agents = 3\noutput_dir = "{tmp_path / "runs"}"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (["server", "--config", str(server)],
                 ["client", "--model", "tiny-llama-bpe", "--name", "alice", "--insecure"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "agents.mallory.ed25519: refused weak key" in lines[0], result.stderr
    assert not (tmp_path / "runs").exists()
