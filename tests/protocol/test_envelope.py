"""Signed envelopes: every rejection case of open_envelope, in its documented order."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_fed.protocol.envelope import (
    AgentKeyMismatchError,
    BadSignatureError,
    EnvelopeError,
    MalformedPayloadError,
    PayloadTooLargeError,
    StaleStepError,
    UnknownKeyError,
    WrongRunError,
    open_envelope,
    sign_batch,
    sign_payload,
)
from hacrl_fed.protocol.keys import Roster, generate_identity, load_signing_key, update_roster
from hacrl_fed.v1.rollout_pb2 import FinishReason, Rollout, RolloutBatch, SamplingParams, SignedEnvelope, Verdict

RUN, STEP = "run-1", 4


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Roster, dict[str, Ed25519PrivateKey]]:
    """Roster with alice and bob (written by the key tooling), and their private keys."""
    d: Path = tmp_path_factory.mktemp("keys")
    keys = {}
    for name in ("alice", "bob"):
        ident = generate_identity(name, d)
        update_roster(d / "roster.toml", name, ident.ed25519, ident.node_public)
        keys[name] = load_signing_key(ident.signing_key)
    return Roster.load(d / "roster.toml"), keys


def make_batch(agent: str = "alice", run_id: str = RUN, step: int = STEP, text: str = "so \\boxed{12}") -> RolloutBatch:
    rollouts = [
        Rollout(prompt_id=f"p{i}", sample_index=j, response_text=text, reward=float(j % 2),
                verdict=Verdict.CORRECT if j % 2 else Verdict.INCORRECT, behaviour_logprob_sum=-3.5 * (j + 1),
                behaviour_token_count=7 + j, finish_reason=FinishReason.STOP)
        for i in range(2) for j in range(2)
    ]
    return RolloutBatch(run_id=run_id, step=step, agent_id=agent, model_fingerprint="sha256:ab",
                        rollouts=rollouts, sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=32))


def open_(env, roster, **kw):
    kw = {"run_id": RUN, "step": STEP, **kw}
    return open_envelope(env, roster, **kw)


# --------------------------------------------------------------------------- accepted


def test_valid_envelope_opens_to_the_same_batch(site):
    roster, keys = site
    batch = make_batch()
    env = sign_batch(batch, keys["alice"], "alice")
    assert env.key_id == "alice" and len(env.signature) == 64
    assert open_(env, roster) == batch
    assert open_(env, roster, agent_id="alice") == batch
    # the envelope also travels as bytes
    assert open_(env.SerializeToString(), roster, agent_id="alice") == batch


def test_sign_batch_refuses_a_key_id_other_than_the_agent(site):
    _, keys = site
    with pytest.raises(ValueError, match="agent_id"):
        sign_batch(make_batch("alice"), keys["alice"], "bob")


# --------------------------------------------------------------------------- rejected


def test_unknown_key(site):
    roster, _ = site
    mallory = Ed25519PrivateKey.generate()
    env = sign_batch(make_batch("mallory"), mallory)
    with pytest.raises(UnknownKeyError, match="mallory") as e:
        open_(env, roster)
    assert e.value.key_id == "mallory"


def test_tampered_payload_is_a_bad_signature(site):
    roster, keys = site
    env = sign_batch(make_batch(), keys["alice"])
    forged = make_batch()
    forged.rollouts[0].reward = 1.0  # a coordinator raising a reward
    env.payload = forged.SerializeToString(deterministic=True)
    with pytest.raises(BadSignatureError, match="alice"):
        open_(env, roster)


def test_signature_by_another_key(site):
    roster, keys = site
    env = sign_batch(make_batch("alice"), keys["bob"], "alice")  # bob passes a batch off as alice's
    with pytest.raises(BadSignatureError):
        open_(env, roster)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 63, b"\x00" * 64, b"\x01" * 65])
def test_malformed_signature(site, signature):
    roster, keys = site
    env = sign_batch(make_batch(), keys["alice"])
    env.signature = signature
    with pytest.raises(BadSignatureError):
        open_(env, roster)


def test_signature_without_domain_prefix_is_rejected(site):
    roster, keys = site
    payload = make_batch().SerializeToString()
    env = SignedEnvelope(payload=payload, signature=keys["alice"].sign(payload), key_id="alice")
    with pytest.raises(BadSignatureError):
        open_(env, roster)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_flipped_byte_is_rejected(site, data):
    roster, keys = site
    env = sign_batch(make_batch(), keys["alice"])
    field = data.draw(st.sampled_from(["payload", "signature"]))
    raw = bytearray(getattr(env, field))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    setattr(env, field, bytes(raw))
    with pytest.raises(BadSignatureError):
        open_(env, roster)


def test_wrong_run(site):
    roster, keys = site
    env = sign_batch(make_batch(run_id="run-0"), keys["alice"])
    with pytest.raises(WrongRunError, match="run-0"):
        open_(env, roster)


@pytest.mark.parametrize("step, word", [(STEP - 1, "stale"), (STEP + 1, "future"), (0, "stale")])
def test_wrong_or_stale_step(site, step, word):
    roster, keys = site
    env = sign_batch(make_batch(step=step), keys["alice"])
    with pytest.raises(StaleStepError, match=word):
        open_(env, roster)


def test_other_steps_accept_a_peer_plans_batch_and_nothing_else(site):
    """Asynchronous train orders (docs/async.md): a batch may answer ``step`` or one of ``other_steps``."""
    roster, keys = site
    for step in (STEP - 2, STEP, STEP + 1):
        batch = open_(sign_batch(make_batch(step=step), keys["alice"]), roster, other_steps={STEP - 2, STEP + 1})
        assert batch.step == step
    with pytest.raises(StaleStepError, match=r"step 1, expected step 4 or a peer plan's step \(2, 5\) \(stale\)"):
        open_(sign_batch(make_batch(step=1), keys["alice"]), roster, other_steps={5, 2})
    with pytest.raises(StaleStepError, match=r"expected step 4 \(stale\)"):   # no other steps: as before
        open_(sign_batch(make_batch(step=2), keys["alice"]), roster)


def test_payload_agent_differs_from_key_id(site):
    roster, keys = site
    payload = make_batch("bob").SerializeToString()  # alice signs a batch claiming to be bob's
    env = SignedEnvelope(payload=payload, signature=sign_payload(payload, keys["alice"]), key_id="alice")
    with pytest.raises(AgentKeyMismatchError, match="bob"):
        open_(env, roster)


def test_key_id_differs_from_expected_agent(site):
    roster, keys = site
    env = sign_batch(make_batch("alice"), keys["alice"])  # valid, but the caller expects bob's batch
    with pytest.raises(AgentKeyMismatchError, match="bob"):
        open_(env, roster, agent_id="bob")


def test_oversized_payload_is_rejected_before_anything_else(site):
    roster, keys = site
    env = sign_batch(make_batch(text="x" * 5000), keys["alice"])
    cap = len(env.payload) - 1
    with pytest.raises(PayloadTooLargeError, match=str(cap)):
        open_(env, roster, max_bytes=cap)
    assert open_(env, roster, max_bytes=len(env.payload)).agent_id == "alice"  # exactly at the cap: fine
    # size is checked before the key and the signature
    junk = SignedEnvelope(payload=b"\xff" * (cap + 1), signature=b"", key_id="nobody")
    with pytest.raises(PayloadTooLargeError):
        open_(junk, roster, max_bytes=cap)
    with pytest.raises(PayloadTooLargeError):
        open_(b"\x00" * (cap + 10_000), roster, max_bytes=cap)


def test_signed_garbage_does_not_parse(site):
    roster, keys = site
    payload = b"\xff\xff\xff\xff"
    env = SignedEnvelope(payload=payload, signature=sign_payload(payload, keys["alice"]), key_id="alice")
    with pytest.raises(MalformedPayloadError):
        open_(env, roster)


def test_non_utf8_text_does_not_parse(site):
    roster, keys = site
    good = make_batch(text="MARKER").SerializeToString()
    payload = good.replace(b"MARKER", b"\xff\xfe\xfd\xfc\xfb\xfa")  # same length: framing stays valid
    assert payload != good
    env = SignedEnvelope(payload=payload, signature=sign_payload(payload, keys["alice"]), key_id="alice")
    with pytest.raises(MalformedPayloadError, match="UTF-8"):
        open_(env, roster)


def test_envelope_bytes_that_do_not_parse(site):
    roster, _ = site
    with pytest.raises(MalformedPayloadError):
        open_(b"\x0a\xff\xff\xff\xff\x0f", roster)
    with pytest.raises(TypeError):
        open_("not bytes", roster)


def test_check_order_signature_before_content(site):
    roster, keys = site
    # wrong run AND a bad signature: the signature failure wins (content of unauthenticated bytes is never read)
    env = sign_batch(make_batch(run_id="other"), keys["alice"])
    env.signature = sign_payload(env.payload, keys["bob"])
    with pytest.raises(BadSignatureError):
        open_(env, roster)


def test_every_rejection_is_an_envelope_error():
    for cls in (UnknownKeyError, BadSignatureError, WrongRunError, StaleStepError, AgentKeyMismatchError,
                PayloadTooLargeError, MalformedPayloadError):
        assert issubclass(cls, EnvelopeError) and issubclass(cls, ValueError)


def test_plain_mapping_roster(site):
    _, keys = site
    roster = {"alice": keys["alice"].public_key()}
    env = sign_batch(make_batch(), keys["alice"])
    assert open_(env, roster).agent_id == "alice"
    with pytest.raises(UnknownKeyError):
        open_(sign_batch(make_batch("bob"), keys["bob"]), roster)
