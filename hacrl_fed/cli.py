"""The ``hacrl-fed`` command line (typer).

Each command validates its config before importing anything heavy, so ``--help`` and config
errors are fast. Bad input ends with a one-line error and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    name="hacrl-fed",
    help="Collaborative RL between organizations that never share their models (HACPO on Flower).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
keys_app = typer.Typer(help="Identities (Ed25519 signing keys, roster entries) and TLS certificates.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error to stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _one_line(err: Exception) -> str:
    """An exception as one line; OSError as ``PATH: reason``."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return " ".join(str(err).split())


@keys_app.command("gen")
def keys_gen(
    name: str = typer.Option(..., "--name", help="Agent name (roster name and key id)."),
    out: Path = typer.Option(..., "--out", help="Directory for the key files (created with mode 0700)."),
    roster: Path | None = typer.Option(None, "--roster", help="Roster TOML to add/replace this agent's entry in."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing key files."),
) -> None:
    """Write NAME.ed25519.key/.pub (batch signing) and NAME.node.key/.pub (SuperNode auth, EC P-384 OpenSSH)."""
    from hacrl_fed.federation.keys import KeyFileError, Roster, RosterError, generate_identity, update_roster

    try:
        if roster is not None and roster.exists():
            Roster.load(roster)  # a broken roster fails before any key is written
        ident = generate_identity(name, out, force=force)
        if roster is not None:
            update_roster(roster, ident.name, ident.ed25519, ident.node_public)
    except (KeyFileError, RosterError, ValueError, OSError) as err:
        fail(_one_line(err))
    for path in (ident.signing_key, ident.signing_pub, ident.node_key, ident.node_pub):
        typer.echo(f"wrote {path}", err=True)
    if roster is not None:
        typer.echo(f"updated {roster}", err=True)
    typer.echo(ident.roster_entry(), nl=False)


@keys_app.command("certs")
def keys_certs(
    out: Path = typer.Option(..., "--out", help="Directory for ca.crt, ca.key, server.pem, server.key."),
    san: list[str] = typer.Option(..., "--san", help="Subject alternative name (IP or DNS); repeat for more."),
    days: int = typer.Option(365, "--days", help="Validity in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write a private CA and a SuperLink TLS server certificate signed by it."""
    from hacrl_fed.federation.certs import generate_tls
    from hacrl_fed.federation.keys import KeyFileError

    try:
        files = generate_tls(out, san, days=days, force=force)
    except (KeyFileError, ValueError, OSError) as err:
        fail(_one_line(err))
    for path in (files.ca_cert, files.ca_key, files.server_cert, files.server_key):
        typer.echo(f"wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    app()
