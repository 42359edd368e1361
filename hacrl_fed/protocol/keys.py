"""Site identities and the roster (ARCHITECTURE.md §6).

Every site holds two key pairs, written by :func:`generate_identity` (``hacrl-fed keys gen``):

* an **Ed25519 signing key** that signs the site's RolloutBatches (:mod:`hacrl_fed.protocol.envelope`);
  private key ``NAME.ed25519.key`` (PEM, PKCS#8, mode 0600), public key ``NAME.ed25519.pub`` (PEM);
* a **SuperNode node-auth key**, EC P-384 in OpenSSH format, because Flower's SuperNode
  authentication accepts only NIST EC keys (``flwr supernode register NAME.node.pub``); private key
  ``NAME.node.key`` (mode 0600), public key ``NAME.node.pub`` (``ecdsa-sha2-nistp384 AAAA… NAME``).

The **roster** is a TOML file distributed out of band, mapping agent names to public keys::

    [agents.alice]
    ed25519 = "<base64 of the raw 32-byte Ed25519 public key>"
    node_key = "ecdsa-sha2-nistp384 AAAA…"      # optional: SuperNode key to register
    role = "rollout_only"                        # optional: a site that contributes rollouts, never trains

Every consumer verifies a batch against its own copy of the roster, never against a key sent by
the coordinator. Weak Ed25519 keys (small-order points such as all zeros or the identity, for which a
constant signature verifies) are refused wherever a key is loaded (:mod:`hacrl_fed.protocol.weak_keys`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from hacrl_fed.atomic import atomic_write_bytes, read_bounded
from hacrl_fed.protocol.weak_keys import weak_key_problem

__all__ = [
    "AGENT_NAME_PATTERN",
    "Identity",
    "KeyFileError",
    "Roster",
    "RosterEntry",
    "RosterError",
    "generate_identity",
    "identity_paths",
    "load_signing_key",
    "load_verify_key",
    "public_key_b64",
    "roster_entry_toml",
    "update_roster",
    "validate_agent_name",
    "write_private_file",
    "write_public_file",
]

AGENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Agent names (roster keys, key ids): the same pattern as ``AgentConfig.name``."""

NIST_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
"""Curves Flower's SuperNode authentication accepts (P-192/P-224 are too weak to offer)."""


class KeyFileError(ValueError):
    """A key file is missing, unreadable, of the wrong type, or would be overwritten."""


ROLES = ("learner", "rollout_only")
"""Roster ``role`` values: a site that trains, or one that only contributes rollouts."""


class RosterError(ValueError):
    """A roster file or entry is invalid; the message names the file and the agent."""


def validate_agent_name(name: str) -> str:
    """Return ``name`` if it is a valid agent name. Raises ValueError otherwise."""
    if not isinstance(name, str) or not re.fullmatch(AGENT_NAME_PATTERN, name):
        raise ValueError(
            f"invalid agent name {name!r}: use 1-64 characters A-Z a-z 0-9 _ . -, starting with a letter or digit"
        )
    return name


# --------------------------------------------------------------------------- file writing


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    atomic_write_bytes(path, data, mode=mode)


def write_private_file(path: str | Path, data: bytes) -> None:
    """Atomically write secret material with mode 0600. Raises OSError."""
    _atomic_write(Path(path), data, 0o600)


def write_public_file(path: str | Path, data: bytes) -> None:
    """Atomically write public material with mode 0644. Raises OSError."""
    _atomic_write(Path(path), data, 0o644)


# --------------------------------------------------------------------------- identities


def public_key_b64(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Base64 (standard alphabet, padded) of the raw 32-byte Ed25519 public key: the roster form."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class Identity:
    """Paths and public keys of one generated site identity."""

    name: str
    signing_key: Path
    """Ed25519 private key, PEM PKCS#8, mode 0600."""
    signing_pub: Path
    """Ed25519 public key, PEM SubjectPublicKeyInfo."""
    node_key: Path
    """SuperNode EC P-384 private key, OpenSSH format, mode 0600 (``--auth-supernode-private-key``)."""
    node_pub: Path
    """SuperNode EC P-384 public key, OpenSSH format (``flwr supernode register``)."""
    ed25519: str
    """Roster form of the Ed25519 public key (base64 of the raw 32 bytes)."""
    node_public: str
    """Roster form of the node public key (``ecdsa-sha2-nistp384 AAAA…``, no comment)."""

    def roster_entry(self, role: str = "learner") -> str:
        """The TOML block for this identity with ``role`` (see :func:`roster_entry_toml`)."""
        return roster_entry_toml(self.name, self.ed25519, self.node_public, role)


def identity_paths(name: str, out_dir: str | Path) -> tuple[Path, Path, Path, Path]:
    """``(NAME.ed25519.key, NAME.ed25519.pub, NAME.node.key, NAME.node.pub)`` under ``out_dir``."""
    d = Path(out_dir)
    return (d / f"{name}.ed25519.key", d / f"{name}.ed25519.pub", d / f"{name}.node.key", d / f"{name}.node.pub")


def generate_identity(name: str, out_dir: str | Path, *, force: bool = False) -> Identity:
    """Generate an Ed25519 signing key and an EC P-384 node-auth key for agent ``name`` in ``out_dir``.

    ``out_dir`` is created (mode 0700) if missing. Raises ValueError for an invalid name,
    KeyFileError if any of the four files exists and ``force`` is false, OSError when writing fails.
    """
    validate_agent_name(name)
    paths = identity_paths(name, out_dir)
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise KeyFileError(f"refusing to overwrite existing key files ({', '.join(existing)}); pass --force")
    Path(out_dir).mkdir(parents=True, exist_ok=True, mode=0o700)

    signing = Ed25519PrivateKey.generate()
    node = ec.generate_private_key(ec.SECP384R1())
    node_public = node.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_private_file(paths[0], signing.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    write_public_file(paths[1], signing.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    write_private_file(paths[2], node.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    write_public_file(paths[3], node_public + f" {name}\n".encode())
    return Identity(name, *paths, ed25519=public_key_b64(signing), node_public=node_public.decode("ascii"))


MAX_KEY_FILE_BYTES = 64 << 10
"""Largest key file read (an Ed25519 or EC key file is well under 1 KiB)."""
MAX_ROSTER_BYTES = 4 << 20
"""Largest roster file read (thousands of agents)."""


def _read(path: str | Path, what: str) -> bytes:
    try:
        return read_bounded(path, MAX_KEY_FILE_BYTES)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such {what} file") from None
    except OSError as err:
        raise KeyFileError(f"{path}: cannot read {what}: {err.strerror}") from None


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an unencrypted Ed25519 private key (PEM PKCS#8, or OpenSSH). Raises KeyFileError."""
    data = _read(path, "signing key")
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise KeyFileError(f"{path}: not an unencrypted private key file ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: expected an Ed25519 private key, got {type(key).__name__}")
    return key


def load_verify_key(path: str | Path) -> Ed25519PublicKey:
    """Load an Ed25519 public key file (PEM, OpenSSH ``ssh-ed25519 …`` or roster base64). Raises KeyFileError."""
    data = _read(path, "public key").strip()
    try:
        if data.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        elif data.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data)
        else:
            key = _decode_ed25519(data.decode("ascii", errors="replace"))
    except (ValueError, UnsupportedAlgorithm) as err:
        raise KeyFileError(f"{path}: not a public key file ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path}: expected an Ed25519 public key, got {type(key).__name__}")
    weak = weak_key_problem(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    if weak:
        raise KeyFileError(f"{path}: refused weak public key: {weak}")
    return key


# --------------------------------------------------------------------------- roster


def _decode_ed25519(text: str) -> Ed25519PublicKey:
    """Roster base64 → key. Raises ValueError naming the problem (base64, length, a weak key)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this decodes to {len(raw)}")
    weak = weak_key_problem(raw)
    if weak:
        raise ValueError(f"refused weak key: {weak}; give the agent a real key (`hacrl-fed keys gen`)")
    return Ed25519PublicKey.from_public_bytes(raw)


def _decode_node_key(text: str) -> str:
    """Validate an OpenSSH EC public key on a NIST curve; return it without comment. Raises ValueError."""
    try:
        key = serialization.load_ssh_public_key(text.strip().encode("ascii"))
    except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm) as err:
        raise ValueError(f"not an OpenSSH public key ({err})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, NIST_CURVES):
        raise ValueError("Flower node authentication needs an EC key on a NIST curve (ecdsa-sha2-nistp384)")
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")


@dataclass(frozen=True)
class RosterEntry:
    """One agent of the roster."""

    name: str
    ed25519: Ed25519PublicKey
    node_key: str | None = None
    """OpenSSH EC public key for SuperNode registration, if the roster lists one."""
    role: str = "learner"
    """``learner`` (default: generates and trains) or ``rollout_only`` (a site behind an API endpoint that
    publishes rollouts and never receives a train order, docs/cross-vendor.md)."""

    @property
    def rollout_only(self) -> bool:
        return self.role == "rollout_only"


class Roster(Mapping[str, Ed25519PublicKey]):
    """Agent name → Ed25519 public key, loaded from a validated roster TOML.

    Behaves as a read-only mapping (``roster["alice"]``, ``"alice" in roster``, ``len(roster)``).
    """

    def __init__(self, entries: Mapping[str, RosterEntry], source: str = "roster") -> None:
        self.entries = dict(entries)
        self.source = source

    @classmethod
    def load(cls, path: str | Path) -> Roster:
        """Read and validate a roster file. Raises RosterError (missing file, not a regular file, larger than
        :data:`MAX_ROSTER_BYTES`, bad TOML, bad entry)."""
        p = Path(path)
        try:
            data = tomllib.loads(read_bounded(p, MAX_ROSTER_BYTES).decode("utf-8"))
        except FileNotFoundError:
            raise RosterError(f"{p}: no such roster file") from None
        except OSError as err:
            raise RosterError(f"{p}: cannot read roster: {err.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise RosterError(f"{p}: not valid TOML: {err}") from None
        except RecursionError:
            raise RosterError(f"{p}: not valid TOML: nested too deeply") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "roster") -> Roster:
        """Validate a parsed roster mapping. Raises RosterError naming ``source`` and the agent."""
        unknown = sorted(set(data) - {"agents"})
        if unknown:
            raise RosterError(f"{source}: unknown top-level key(s) {', '.join(unknown)} (expected only [agents.<name>])")
        agents = data.get("agents", {})
        if not isinstance(agents, Mapping):
            raise RosterError(f"{source}: agents must be a table of [agents.<name>] entries")
        entries: dict[str, RosterEntry] = {}
        seen: dict[str, str] = {}
        for name, body in agents.items():
            entry = _parse_entry(name, body, source)
            b64 = public_key_b64(entry.ed25519)
            if b64 in seen:
                raise RosterError(f"{source}: agents.{name}.ed25519: same key as agents.{seen[b64]}")
            seen[b64] = name
            entries[name] = entry
        return cls(entries, source)

    def __getitem__(self, agent: str) -> Ed25519PublicKey:
        return self.entries[agent].ed25519

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def public_key(self, agent: str) -> Ed25519PublicKey:
        """Ed25519 public key of ``agent``. Raises KeyError (with the roster source) if not listed."""
        if agent not in self.entries:
            raise KeyError(f"{self.source}: no agent {agent!r} in the roster")
        return self.entries[agent].ed25519

    def rollout_only(self, agent: str) -> bool:
        """The roster says ``agent`` is a rollout-only site (never sent a train order); False if not listed."""
        entry = self.entries.get(agent)
        return entry is not None and entry.rollout_only

    def node_key(self, agent: str) -> str | None:
        """OpenSSH node-auth public key of ``agent`` or None. Raises KeyError if not listed."""
        if agent not in self.entries:
            raise KeyError(f"{self.source}: no agent {agent!r} in the roster")
        return self.entries[agent].node_key


def _parse_entry(name: object, body: object, source: str) -> RosterEntry:
    where = f"{source}: agents.{name}"
    try:
        validate_agent_name(name)  # type: ignore[arg-type]
    except ValueError as err:
        raise RosterError(f"{where}: {err}") from None
    if not isinstance(body, Mapping):
        raise RosterError(f"{where}: expected a table with ed25519 = \"<base64>\"")
    unknown = sorted(set(body) - {"ed25519", "node_key", "role"})
    if unknown:
        raise RosterError(f"{where}: unknown key(s) {', '.join(unknown)} (expected ed25519, node_key, role)")
    if body.get("role", "learner") not in ROLES:
        raise RosterError(f"{where}.role: expected one of {', '.join(ROLES)}, got {str(body['role'])[:40]!r}")
    if "ed25519" not in body:
        raise RosterError(f"{where}.ed25519: required key is missing")
    for field in ("ed25519", "node_key"):
        if field in body and not isinstance(body[field], str):
            raise RosterError(f"{where}.{field}: expected a string, got {type(body[field]).__name__}")
    try:
        pub = _decode_ed25519(body["ed25519"])
    except ValueError as err:
        raise RosterError(f"{where}.ed25519: {err}") from None
    node_key = None
    if "node_key" in body:
        try:
            node_key = _decode_node_key(body["node_key"])
        except ValueError as err:
            raise RosterError(f"{where}.node_key: {err}") from None
    return RosterEntry(name, pub, node_key, body.get("role", "learner"))  # type: ignore[arg-type]


def roster_entry_toml(name: str, ed25519: str, node_key: str | None = None, role: str = "learner") -> str:
    """TOML block ``[agents."NAME"]`` with the given public keys (strings quoted TOML-safely) and, for a
    rollout-only site, ``role = "rollout_only"``."""
    lines = [f"[agents.{json.dumps(name)}]", f"ed25519 = {json.dumps(ed25519)}"]
    if node_key:
        lines.append(f"node_key = {json.dumps(node_key)}")
    if role != "learner":
        lines.append(f"role = {json.dumps(role)}")
    return "\n".join(lines) + "\n"


def update_roster(path: str | Path, name: str, ed25519: str, node_key: str | None = None,
                  role: str = "learner") -> Roster:
    """Add or replace agent ``name`` in the roster at ``path`` (created if missing), atomically.

    A new agent is appended to the existing text (comments are kept); replacing an existing agent
    rewrites the file from the validated entries. The result is validated before it is written.
    Raises RosterError (invalid existing roster or entry), OSError when writing fails.
    """
    p = Path(path)
    block = roster_entry_toml(name, ed25519, node_key, role)
    try:
        old_text = read_bounded(p, MAX_ROSTER_BYTES).decode("utf-8") if p.exists() else ""
    except (OSError, UnicodeDecodeError) as err:
        raise RosterError(f"{p}: cannot read roster: {getattr(err, 'strerror', None) or 'not UTF-8 text'}") from None
    old = Roster.load(p) if old_text.strip() else Roster({}, str(p))
    if name in old:
        parts = ["# hacrl-fed roster: agent name -> public keys (distribute out of band)\n"]
        for other, e in old.entries.items():
            if other != name:
                parts.append(roster_entry_toml(other, public_key_b64(e.ed25519), e.node_key, e.role))
        parts.append(block)
        new_text = "\n".join(parts)
    else:
        new_text = (old_text.rstrip("\n") + "\n\n" if old_text.strip() else "") + block
    roster = Roster.from_dict(tomllib.loads(new_text), source=str(p))
    mode = p.stat().st_mode & 0o777 if p.exists() else 0o644
    _atomic_write(p, new_text.encode("utf-8"), mode)
    return roster
