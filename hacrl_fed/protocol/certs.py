"""TLS material for the coordinator's SuperLink (ARCHITECTURE.md §6, flower-notes.md §4).

:func:`generate_tls` writes a private CA and a server certificate signed by it::

    ca.crt      CA certificate (give it to every site: ``--root-certificates ca.crt``)
    ca.key      CA private key, mode 0600 (keep offline)
    server.pem  server certificate (``flower-superlink --ssl-certfile``)
    server.key  server private key, mode 0600 (``--ssl-keyfile``)

Keys are ECDSA P-256 (PEM PKCS#8), signatures SHA-256. The CA carries a critical
``basicConstraints CA:TRUE, pathlen:0`` and ``keyUsage keyCertSign, cRLSign``; the leaf carries
``CA:FALSE``, ``keyUsage digitalSignature``, ``extendedKeyUsage serverAuth``, subject/authority key
identifiers and the subject alternative names (IP addresses as IP SANs, the rest as DNS SANs), as
strict verifiers (Python ≥ 3.13 ``VERIFY_X509_STRICT``, httpx, grpc) demand.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hacrl_fed.protocol.keys import KeyFileError, write_private_file, write_public_file

__all__ = ["TlsFiles", "generate_tls", "parse_san"]

_DNS_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_DNS_NAME = re.compile(rf"^(\*\.)?{_DNS_LABEL}(\.{_DNS_LABEL})*\.?$")
_CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class TlsFiles:
    """Paths written by :func:`generate_tls`."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def parse_san(value: str) -> x509.GeneralName:
    """``"127.0.0.1"``/``"::1"`` → IPAddress SAN; a host name → DNSName SAN. Raises ValueError."""
    text = value.strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) > 253 or not _DNS_NAME.match(text) or text.replace(".", "").isdigit():
        raise ValueError(f"invalid SAN {value!r}: expected an IP address or a DNS name such as coord.example.org")
    return x509.DNSName(text.rstrip(".").lower())


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hacrl-fed"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
    ])


def _ca(days: int, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("hacrl-fed CA")
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(sans: list[x509.GeneralName], ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
          days: int, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(str(sans[0].value))).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def generate_tls(out_dir: str | Path, sans: list[str], *, days: int = 365, force: bool = False) -> TlsFiles:
    """Write a CA and a SuperLink server certificate for ``sans`` (valid ``days`` days) into ``out_dir``.

    Raises ValueError (no SAN, invalid SAN, days < 1), KeyFileError (files exist and not ``force``),
    OSError when writing fails.
    """
    if not sans:
        raise ValueError("at least one --san is needed (the address sites use to reach the SuperLink)")
    if days < 1:
        raise ValueError(f"--days must be at least 1, got {days}")
    names = list(dict.fromkeys(parse_san(s) for s in sans))  # de-duplicated, order kept
    d = Path(out_dir)
    files = TlsFiles(d / "ca.crt", d / "ca.key", d / "server.pem", d / "server.key")
    existing = [str(p) for p in vars(files).values() if p.exists()]
    if existing and not force:
        raise KeyFileError(f"refusing to overwrite existing files ({', '.join(existing)}); pass --force")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, ca_cert = _ca(days, now)
    key, cert = _leaf(names, ca_key, ca_cert, days, now)
    pem = serialization.Encoding.PEM
    pkcs8 = (pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_private_file(files.ca_key, ca_key.private_bytes(*pkcs8))
    write_public_file(files.ca_cert, ca_cert.public_bytes(pem))
    write_private_file(files.server_key, key.private_bytes(*pkcs8))
    write_public_file(files.server_cert, cert.public_bytes(pem))
    return files
