"""Weak Ed25519 public keys: encodings no honest key generator produces, refused wherever a key is loaded.

An Ed25519 public key is a point A of the edwards25519 curve. An honest key is ``A = a·B`` for the base
point B, so it lies in the prime-order subgroup (order L = 2^252 + 27742317777372353535851937790883648493).
Keys outside it are dangerous: for a *small-order* point (order 1, 2, 4 or 8: all zeros, the identity
``01 00 … 00``, …) the verification equation ``[S]B = R + [k]A`` no longer depends on the message for
most ``k``, so a constant signature (R = identity, S = 0) verifies for every payload and anyone can forge
that agent's batches (OpenSSL, behind ``cryptography``, accepts such keys and signatures).

:func:`weak_key_problem` decodes the 32 bytes as RFC 8032 §5.1.3 does and checks, by multiplying the
point: [8]·A = identity (a small-order point, the 8 known ones among them) and [L]·A = identity
(no small-order component either). Non-canonical encodings (y ≥ p) and values that are not a curve
point are refused as well. Pure integer arithmetic: ~2 ms per key, run once per roster entry at load.
"""

from __future__ import annotations

__all__ = ["weak_key_problem"]

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = (-121665 * pow(121666, _P - 2, _P)) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_IDENTITY = (0, 1, 1, 0)

Point = tuple[int, int, int, int]
"""Extended homogeneous coordinates (X, Y, Z, T) with x = X/Z, y = Y/Z, xy = T/Z."""


def _decode(raw: bytes) -> Point | None:
    """RFC 8032 §5.1.3 point decoding; None for a non-canonical encoding or a value off the curve."""
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= _P:
        return None
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        if (v * x * x + u) % _P:
            return None
        x = x * _SQRT_M1 % _P
    if x == 0 and sign:
        return None
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


def _add(p: Point, q: Point) -> Point:
    """Point addition on edwards25519 (RFC 8032 §5.1.4, complete formula)."""
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _multiply(scalar: int, p: Point) -> Point:
    out = _IDENTITY
    while scalar:
        if scalar & 1:
            out = _add(out, p)
        p = _add(p, p)
        scalar >>= 1
    return out


def _is_identity(p: Point) -> bool:
    return p[0] % _P == 0 and (p[1] - p[2]) % _P == 0


def weak_key_problem(raw: bytes) -> str | None:
    """Why the raw 32-byte Ed25519 public key ``raw`` must not be trusted, or None for a sound key.

    The reasons: wrong length, not a canonical curve point, a small-order point (order ≤ 8: constant
    signatures verify for it), or a point with a small-order component (outside the prime-order
    subgroup every honest key lies in).
    """
    if len(raw) != 32:
        return f"an Ed25519 public key is 32 bytes, got {len(raw)}"
    point = _decode(raw)
    if point is None:
        return "not a canonical Ed25519 curve point"
    if _is_identity(_multiply(8, point)):
        return ("a small-order Ed25519 point (order ≤ 8, e.g. all zeros or the identity): a constant "
                "signature verifies for it, so anyone could sign as this agent")
    if not _is_identity(_multiply(_L, point)):
        return "an Ed25519 point with a small-order component (outside the prime-order subgroup of honest keys)"
    return None
