"""The ``hacrl-fed`` command line (typer).

Each command validates its config before importing anything heavy, so ``--help`` and config
errors are fast. Bad input ends with a one-line error and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

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


if __name__ == "__main__":  # pragma: no cover
    app()
