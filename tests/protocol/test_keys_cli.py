"""Key tooling: `hacrl-fed keys gen|certs`, key files, the roster, and Flower's acceptance of both."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.verification import PolicyBuilder, Store
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.protocol.keys import (
    KeyFileError,
    Roster,
    RosterError,
    generate_identity,
    load_signing_key,
    load_verify_key,
    public_key_b64,
    update_roster,
)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def assert_one_line_error(result) -> None:
    """Non-zero exit, exactly one line on stderr starting with ``error:``, no traceback."""
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- keys gen


def test_keys_gen_role_marks_a_rollout_only_site_in_the_entry_and_the_roster(tmp_path: Path):
    roster_path = tmp_path / "roster.toml"
    invoke("keys", "gen", "--name", "alice", "--out", str(tmp_path / "a"), "--roster", str(roster_path))
    result = invoke("keys", "gen", "--name", "vendor-x", "--out", str(tmp_path / "v"), "--roster", str(roster_path),
                    "--role", "rollout_only")
    assert result.exit_code == 0, result.output
    assert Roster.from_dict(tomllib.loads(result.stdout)).rollout_only("vendor-x")
    roster = Roster.load(roster_path)
    assert roster.rollout_only("vendor-x") and not roster.rollout_only("alice")
    bad = invoke("keys", "gen", "--name", "bob", "--out", str(tmp_path / "b"), "--role", "trainer")
    assert_one_line_error(bad)
    assert "--role" in bad.stderr and not (tmp_path / "b").exists()


def test_keys_gen_writes_loadable_keys_with_private_modes(tmp_path: Path):
    out = tmp_path / "keys"
    result = invoke("keys", "gen", "--name", "alice", "--out", str(out))
    assert result.exit_code == 0, result.output
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == {"alice.ed25519.key", "alice.ed25519.pub", "alice.node.key", "alice.node.pub"}
    for name in ("alice.ed25519.key", "alice.node.key"):
        assert files[name].stat().st_mode & 0o777 == 0o600, name
    for name in ("alice.ed25519.pub", "alice.node.pub"):
        assert files[name].stat().st_mode & 0o077 != 0o077  # readable, not world-writable
        assert files[name].stat().st_mode & 0o002 == 0

    signing = load_signing_key(files["alice.ed25519.key"])
    assert files["alice.ed25519.key"].read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert public_key_b64(load_verify_key(files["alice.ed25519.pub"])) == public_key_b64(signing)

    node = serialization.load_ssh_private_key(files["alice.node.key"].read_bytes(), password=None)
    assert isinstance(node, ec.EllipticCurvePrivateKey) and node.curve.name == "secp384r1"
    node_pub = serialization.load_ssh_public_key(files["alice.node.pub"].read_bytes())
    assert node_pub == node.public_key()
    assert files["alice.node.pub"].read_text().startswith("ecdsa-sha2-nistp384 ")

    # stdout is exactly the roster entry, and it matches the key files
    roster = Roster.from_dict(tomllib.loads(result.stdout))
    assert list(roster) == ["alice"]
    assert public_key_b64(roster["alice"]) == public_key_b64(signing)
    assert serialization.load_ssh_public_key(roster.node_key("alice").encode()) == node.public_key()


def test_keys_gen_refuses_to_overwrite_without_force(tmp_path: Path):
    assert invoke("keys", "gen", "--name", "a", "--out", str(tmp_path)).exit_code == 0
    before = (tmp_path / "a.ed25519.key").read_bytes()
    result = invoke("keys", "gen", "--name", "a", "--out", str(tmp_path))
    assert_one_line_error(result)
    assert "--force" in result.stderr
    assert (tmp_path / "a.ed25519.key").read_bytes() == before
    assert invoke("keys", "gen", "--name", "a", "--out", str(tmp_path), "--force").exit_code == 0
    assert (tmp_path / "a.ed25519.key").read_bytes() != before
    assert (tmp_path / "a.ed25519.key").stat().st_mode & 0o777 == 0o600


def test_keys_gen_roster_append_and_replace(tmp_path: Path):
    roster_path = tmp_path / "roster.toml"
    roster_path.write_text("# sites of the demo federation\n")
    for name in ("alice", "bob"):
        assert invoke("keys", "gen", "--name", name, "--out", str(tmp_path / "k"), "--roster", str(roster_path)).exit_code == 0
    assert roster_path.read_text().startswith("# sites of the demo federation")  # appending keeps comments
    first = Roster.load(roster_path)
    assert sorted(first) == ["alice", "bob"]
    assert public_key_b64(first["bob"]) == public_key_b64(load_signing_key(tmp_path / "k" / "bob.ed25519.key"))

    args = ("keys", "gen", "--name", "alice", "--out", str(tmp_path / "k"), "--roster", str(roster_path), "--force")
    assert invoke(*args).exit_code == 0
    second = Roster.load(roster_path)
    assert sorted(second) == ["alice", "bob"]
    assert public_key_b64(second["alice"]) != public_key_b64(first["alice"])
    assert public_key_b64(second["alice"]) == public_key_b64(load_signing_key(tmp_path / "k" / "alice.ed25519.key"))
    assert public_key_b64(second["bob"]) == public_key_b64(first["bob"])
    assert second.node_key("bob") == first.node_key("bob")


def test_keys_gen_with_broken_roster_writes_nothing(tmp_path: Path):
    roster_path = tmp_path / "roster.toml"
    roster_path.write_text('[agents.x]\ned25519 = "not base64!"\n')
    result = invoke("keys", "gen", "--name", "a", "--out", str(tmp_path / "k"), "--roster", str(roster_path))
    assert_one_line_error(result)
    assert "agents.x.ed25519" in result.stderr and str(roster_path) in result.stderr
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("name", ["bad name", "-dash", "", "x" * 65, "a/b", "ünï"])
def test_keys_gen_invalid_name(tmp_path: Path, name: str):
    result = invoke("keys", "gen", "--name", name, "--out", str(tmp_path))
    assert_one_line_error(result)
    assert "invalid agent name" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_keys_gen_unwritable_out_dir(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("keys", "gen", "--name", "a", "--out", str(blocker / "sub"))
    assert_one_line_error(result)
    assert str(blocker) in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_keys_gen_permission_denied(tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    result = invoke("keys", "gen", "--name", "a", "--out", str(ro))
    assert_one_line_error(result)
    assert "Permission denied" in result.stderr


def test_cli_subprocess_error_has_no_traceback(tmp_path: Path):
    """The real entry point (not CliRunner): one-line error, exit code 2."""
    proc = subprocess.run([sys.executable, "-m", "hacrl_fed.cli", "keys", "certs", "--out", str(tmp_path),
                           "--san", "not a host"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("error: invalid SAN")
    assert "Traceback" not in proc.stderr + proc.stdout


# --------------------------------------------------------------------------- key files and roster


def test_load_signing_key_errors(tmp_path: Path):
    with pytest.raises(KeyFileError, match="no such"):
        load_signing_key(tmp_path / "missing.key")
    ident = generate_identity("a", tmp_path)
    with pytest.raises(KeyFileError, match="private key"):
        load_signing_key(ident.signing_pub)
    with pytest.raises(KeyFileError, match="Ed25519"):
        load_signing_key(ident.node_key)  # an EC key is not a signing key


def _roster_error(tmp_path: Path, text: str) -> str:
    p = tmp_path / "r.toml"
    p.write_text(text)
    with pytest.raises(RosterError) as e:
        Roster.load(p)
    assert str(p) in str(e.value)
    return str(e.value)


def test_roster_validation_names_file_and_agent(tmp_path: Path):
    key = public_key_b64(Ed25519PrivateKey.generate())
    assert "agents.bob.ed25519" in _roster_error(tmp_path, '[agents.bob]\ned25519 = "@@@"\n')
    msg = _roster_error(tmp_path, '[agents.bob]\ned25519 = "AAAA"\n')
    assert "agents.bob.ed25519" in msg and "32 bytes" in msg and "decodes to 3" in msg
    assert "colour" in _roster_error(tmp_path, f'[agents.bob]\ned25519 = "{key}"\ncolour = "red"\n')
    assert "peers" in _roster_error(tmp_path, f'[peers.bob]\ned25519 = "{key}"\n')
    assert "required" in _roster_error(tmp_path, '[agents.bob]\nnode_key = "x"\n')
    assert "expected a string" in _roster_error(tmp_path, "[agents.bob]\ned25519 = 5\n")
    assert "agents.bad name" in _roster_error(tmp_path, f'[agents."bad name"]\ned25519 = "{key}"\n')
    assert "same key as agents.a" in _roster_error(tmp_path, f'[agents.a]\ned25519 = "{key}"\n[agents.b]\ned25519 = "{key}"\n')
    assert "not valid TOML" in _roster_error(tmp_path, "[agents.bob\n")
    ssh_ed25519 = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    msg = _roster_error(tmp_path, f'[agents.bob]\ned25519 = "{key}"\nnode_key = "{ssh_ed25519}"\n')
    assert "agents.bob.node_key" in msg and "NIST" in msg
    with pytest.raises(RosterError, match="no such roster"):
        Roster.load(tmp_path / "absent.toml")


def test_roster_round_trip(tmp_path: Path):
    path = tmp_path / "roster.toml"
    idents = [generate_identity(n, tmp_path / "k") for n in ("a.site", "b_site", "C-3")]
    for ident in idents:
        update_roster(path, ident.name, ident.ed25519, ident.node_public if ident.name != "C-3" else None)
    roster = Roster.load(path)
    assert list(roster) == ["a.site", "b_site", "C-3"] and len(roster) == 3
    for ident in idents:
        assert public_key_b64(roster.public_key(ident.name)) == ident.ed25519
    assert roster.node_key("a.site") == idents[0].node_public and roster.node_key("C-3") is None
    with pytest.raises(KeyError, match="nobody"):
        roster.public_key("nobody")
    assert "nobody" not in roster and roster.get("nobody") is None
    # an invalid entry is refused and leaves the file untouched
    before = path.read_bytes()
    with pytest.raises(RosterError):
        update_roster(path, "d", "AAAA")
    assert path.read_bytes() == before


# --------------------------------------------------------------------------- certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    result = invoke("keys", "certs", "--out", str(out), "--san", "127.0.0.1", "--san", "coord.example.org",
                    "--days", "30")
    assert result.exit_code == 0, result.output
    return out


def test_certs_files_modes_and_sans(certs: Path):
    assert {p.name for p in certs.iterdir()} == {"ca.crt", "ca.key", "server.pem", "server.key"}
    for name in ("ca.key", "server.key"):
        assert (certs / name).stat().st_mode & 0o777 == 0o600
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["coord.example.org"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    assert 29 <= (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 31
    leaf.verify_directly_issued_by(ca)


@pytest.mark.parametrize("name", [x509.DNSName("coord.example.org"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
def test_certs_pass_strict_rfc5280_verification(certs: Path, name):
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(name)
    chain = verifier.verify(leaf, [])
    assert chain[-1] == ca


def test_certs_tls_handshake(certs: Path):
    """A real TLS handshake: the server presents server.pem, the client trusts only ca.crt."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(n: int) -> None:
        for _ in range(n):
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.recv(2) == b"ok"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # a name not in the SANs fails
        with pytest.raises(ssl.SSLCertVerificationError):
            client_ctx.wrap_socket(raw, server_hostname="other.example.org")
    thread.join(timeout=10)
    listener.close()


@pytest.mark.parametrize("args, needle", [
    (["--san", "bad_name!"], "invalid SAN"),
    (["--san", "999.1.1.1"], "invalid SAN"),
    (["--san", "-lead.example.org"], "invalid SAN"),
    (["--san", "127.0.0.1", "--days", "0"], "--days"),
])
def test_certs_bad_input(tmp_path: Path, args, needle):
    result = invoke("keys", "certs", "--out", str(tmp_path / "c"), *args)
    assert_one_line_error(result)
    assert needle in result.stderr
    assert not (tmp_path / "c").exists()


def test_certs_refuse_overwrite(certs: Path):
    before = (certs / "ca.key").read_bytes()
    assert_one_line_error(invoke("keys", "certs", "--out", str(certs), "--san", "127.0.0.1"))
    assert (certs / "ca.key").read_bytes() == before


# --------------------------------------------------------------------------- Flower


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("flower-superlink", path=str(Path(sys.executable).parent)) is None,
                    reason="flwr console scripts not installed next to this interpreter")
def test_flower_superlink_accepts_certs_and_node_key(tmp_path: Path):
    """flower-superlink runs TLS + SuperNode auth with our certs; `flwr supernode register` accepts our node key."""
    bindir = Path(sys.executable).parent
    assert invoke("keys", "certs", "--out", str(tmp_path / "tls"), "--san", "127.0.0.1").exit_code == 0
    assert invoke("keys", "gen", "--name", "org0", "--out", str(tmp_path / "keys")).exit_code == 0
    port = _free_port()
    home = tmp_path / "flwr"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "secure"\n\n[superlink.secure]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{tmp_path / "tls" / "ca.crt"}"\n')
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    tls = tmp_path / "tls"
    log = open(tmp_path / "superlink.log", "wb")
    link = subprocess.Popen(
        [str(bindir / "flower-superlink"), "--ssl-ca-certfile", str(tls / "ca.crt"), "--ssl-certfile",
         str(tls / "server.pem"), "--ssl-keyfile", str(tls / "server.key"), "--enable-supernode-auth",
         "--host", "127.0.0.1", "--port", str(port), "--database", str(tmp_path / "superlink.db"),
         "--disable-runtime-dependency-installation"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert link.poll() is None, (tmp_path / "superlink.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "SuperLink did not start listening"
                time.sleep(0.2)
        reg = subprocess.run([str(bindir / "flwr"), "supernode", "register", str(tmp_path / "keys" / "org0.node.pub"),
                              "secure", "--name", "org0", "--format", "json"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert reg.returncode == 0, reg.stdout + reg.stderr
        assert '"success": true' in reg.stdout
        listing = subprocess.run([str(bindir / "flwr"), "supernode", "list", "secure", "--format", "json"],
                                 env=env, capture_output=True, text=True, timeout=60)
        assert listing.returncode == 0 and '"registered"' in listing.stdout, listing.stdout + listing.stderr
    finally:
        link.terminate()
        try:
            link.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(link.pid, 9)
            link.wait(timeout=5)
        log.close()
