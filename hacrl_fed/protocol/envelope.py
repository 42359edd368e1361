"""Signed rollout envelopes: Ed25519 over the exact serialized RolloutBatch (ARCHITECTURE.md §3, §6).

A producing site serializes its :class:`RolloutBatch` once, signs those exact bytes and ships them
in a :class:`SignedEnvelope` ``{payload, signature, key_id}``. A consumer (a peer site or the
coordinator) opens it with :func:`open_envelope`, which checks in this order and raises a distinct
:class:`EnvelopeError` subclass at the first failure:

1. payload size ≤ ``max_bytes``                        → :class:`PayloadTooLargeError`
2. ``key_id`` is listed in the consumer's own roster    → :class:`UnknownKeyError`
3. Ed25519 signature over the payload bytes            → :class:`BadSignatureError`
4. only now parse the payload (protobuf, UTF-8 text)   → :class:`MalformedPayloadError`
5. ``batch.agent_id == key_id`` (== expected agent)     → :class:`AgentKeyMismatchError`
6. ``batch.run_id == run_id``                           → :class:`WrongRunError`
7. ``batch.step == step`` (or one of ``other_steps``)  → :class:`StaleStepError`

Run id, step and agent id live inside the signed bytes, so a batch cannot be replayed into another
run or step, nor passed off as another agent's. Verifying before parsing means no parser ever sees
unauthenticated bytes and no re-serialization canonicality question arises. The signed message is
``SIGNING_CONTEXT + payload`` (domain separation: a signature made for another purpose with the same
key never verifies as a rollout batch). Content checks (finite numbers, reward range, counts) are
the validator's job, not this module's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from hacrl_fed.v1.rollout_pb2 import RolloutBatch, SignedEnvelope

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "SIGNING_CONTEXT",
    "AgentKeyMismatchError",
    "BadSignatureError",
    "EnvelopeError",
    "MalformedPayloadError",
    "PayloadTooLargeError",
    "StaleStepError",
    "UnknownKeyError",
    "WrongRunError",
    "open_envelope",
    "sign_batch",
    "sign_payload",
    "verify_payload",
]

SIGNING_CONTEXT = b"hacrl-fed/v1/RolloutBatch\x00"
"""Prefix of every signed message (domain separation); the payload itself is shipped unchanged."""
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
"""Default payload cap, bytes (``RunConfig.max_batch_bytes``)."""
_ENVELOPE_OVERHEAD_BYTES = 4096
"""Allowance for signature, key id and protobuf framing when a whole envelope arrives as bytes."""
_SIGNATURE_BYTES = 64


class EnvelopeError(ValueError):
    """An envelope was rejected. ``key_id`` is the claimed signer (may be forged or empty)."""

    def __init__(self, message: str, *, key_id: str = "") -> None:
        super().__init__(message)
        self.key_id = key_id


class PayloadTooLargeError(EnvelopeError):
    """The payload (or the whole envelope) exceeds the configured size cap."""


class UnknownKeyError(EnvelopeError):
    """The envelope's key id is not in the consumer's roster."""


class BadSignatureError(EnvelopeError):
    """The signature does not verify: tampered payload, wrong key, or malformed signature."""


class MalformedPayloadError(EnvelopeError):
    """The (authentic) bytes are not a valid RolloutBatch/SignedEnvelope, e.g. invalid UTF-8 text."""


class AgentKeyMismatchError(EnvelopeError):
    """``batch.agent_id`` differs from the signing key id, or the key id from the expected agent."""


class WrongRunError(EnvelopeError):
    """The batch belongs to another run."""


class StaleStepError(EnvelopeError):
    """The batch belongs to another (earlier or later) step."""


def _show(text: str, limit: int = 80) -> str:
    """repr of an untrusted string, shortened for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def sign_payload(payload: bytes, key: Ed25519PrivateKey) -> bytes:
    """Ed25519 signature (64 bytes) over ``SIGNING_CONTEXT + payload``."""
    return key.sign(SIGNING_CONTEXT + payload)


def verify_payload(payload: bytes, signature: bytes, public_key: Ed25519PublicKey) -> bool:
    """True iff ``signature`` is a valid :func:`sign_payload` signature of ``payload`` by ``public_key``."""
    if len(signature) != _SIGNATURE_BYTES:
        return False
    try:
        public_key.verify(signature, SIGNING_CONTEXT + payload)
    except InvalidSignature:
        return False
    return True


def sign_batch(batch: RolloutBatch, key: Ed25519PrivateKey, key_id: str | None = None) -> SignedEnvelope:
    """Serialize ``batch`` (deterministic) and sign those exact bytes.

    ``key_id`` is the signer's roster name and defaults to ``batch.agent_id``. Raises ValueError if
    it differs from ``batch.agent_id`` (every consumer would reject such an envelope).
    """
    key_id = batch.agent_id if key_id is None else key_id
    if key_id != batch.agent_id:
        raise ValueError(f"key_id {key_id!r} must equal batch.agent_id {batch.agent_id!r}")
    payload = batch.SerializeToString(deterministic=True)
    return SignedEnvelope(payload=payload, signature=sign_payload(payload, key), key_id=key_id)


def _as_envelope(envelope: SignedEnvelope | bytes, max_bytes: int) -> SignedEnvelope:
    if isinstance(envelope, SignedEnvelope):
        return envelope
    if not isinstance(envelope, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected SignedEnvelope or bytes, got {type(envelope).__name__}")
    data = bytes(envelope)
    if len(data) > max_bytes + _ENVELOPE_OVERHEAD_BYTES:
        raise PayloadTooLargeError(f"envelope of {len(data)} bytes exceeds the cap of {max_bytes} bytes")
    try:
        return SignedEnvelope.FromString(data)
    except DecodeError:
        raise MalformedPayloadError("bytes are not a valid SignedEnvelope") from None


def open_envelope(
    envelope: SignedEnvelope | bytes,
    roster: Mapping[str, Ed25519PublicKey],
    *,
    run_id: str,
    step: int,
    agent_id: str | None = None,
    max_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    other_steps: Collection[int] = (),
) -> RolloutBatch:
    """Verify, then parse and check a signed RolloutBatch (checks in the order of the module docstring).

    ``roster`` maps agent names to Ed25519 public keys (a :class:`~hacrl_fed.protocol.keys.Roster`
    or a plain dict). ``agent_id`` is the agent the caller expects this envelope from (None: any
    roster agent). ``max_bytes`` caps the serialized RolloutBatch. ``other_steps``: further steps a
    batch may answer besides ``step`` (an asynchronous train order's peer plans, docs/async.md; empty:
    ``step`` only). Returns the parsed batch. Raises the :class:`EnvelopeError` subclass of the first
    failed check; TypeError for a wrong argument type.
    """
    env = _as_envelope(envelope, max_bytes)
    key_id, payload = env.key_id, env.payload
    who = f"batch signed by {_show(key_id)}"
    if len(payload) > max_bytes:
        raise PayloadTooLargeError(f"{who}: payload of {len(payload)} bytes exceeds the cap of {max_bytes} bytes",
                                   key_id=key_id)
    public_key = roster.get(key_id)
    if public_key is None:
        raise UnknownKeyError(f"{who}: key id is not in the roster", key_id=key_id)
    if not verify_payload(payload, env.signature, public_key):
        raise BadSignatureError(f"{who}: Ed25519 signature does not verify against the roster key "
                                f"(tampered payload or signed by another key)", key_id=key_id)
    try:
        batch = RolloutBatch.FromString(payload)
    except DecodeError:
        raise MalformedPayloadError(f"{who}: payload is not a valid RolloutBatch "
                                    f"(malformed protobuf or invalid UTF-8 in a text field)", key_id=key_id) from None
    if batch.agent_id != key_id:
        raise AgentKeyMismatchError(f"{who}: payload claims agent {_show(batch.agent_id)}", key_id=key_id)
    if agent_id is not None and key_id != agent_id:
        raise AgentKeyMismatchError(f"{who}: expected a batch from {_show(agent_id)}", key_id=key_id)
    if batch.run_id != run_id:
        raise WrongRunError(f"{who}: batch is for run {_show(batch.run_id)}, expected {_show(run_id)}", key_id=key_id)
    if batch.step != step and batch.step not in other_steps:
        kind = "stale" if batch.step < step else "from a future step"
        expected = f"step {step}" + (f" or a peer plan's step ({_steps(other_steps)})" if other_steps else "")
        raise StaleStepError(f"{who}: batch is for step {batch.step}, expected {expected} ({kind})", key_id=key_id)
    return batch


def _steps(steps: Collection[int], limit: int = 8) -> str:
    """Sorted steps for an error message, at most ``limit`` shown."""
    shown = sorted(steps)
    return ", ".join(map(str, shown[:limit])) + (f" … {len(shown) - limit} more" if len(shown) > limit else "")
