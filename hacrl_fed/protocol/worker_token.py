"""The secret a site's worker and its clients share: every call to the worker's local gRPC API carries it.

The worker listens on loopback or a unix socket only, but any local process (another user's included) can
reach a loopback port. So each call carries the site's token as the gRPC metadata :data:`TOKEN_METADATA`,
and the worker refuses a call without it (``UNAUTHENTICATED``, :mod:`hacrl_fed.worker.service`).

The token lives in a file only its owner can read (mode 0600; a file others can read is refused), by default
``<output_dir>/<agent>/worker.token`` (:data:`TOKEN_FILE`). ``hacrl-fed client`` writes a fresh one each time
it starts its worker; ``hacrl-fed worker`` started by hand reads the file ``--token-file`` names, or writes a
new one there, and ``hacrl-fed client --worker-address`` reads the same file (``--worker-token-file``). The
per-message ClientApp reads the file its node config names (``worker-token-file``): the secret itself is
never on a command line.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from pathlib import Path

from hacrl_fed.atomic import atomic_write_text, read_bounded

__all__ = ["TOKEN_FILE", "TOKEN_METADATA", "TokenFileError", "ensure_token", "read_token", "write_token"]

TOKEN_METADATA = "x-hacrl-worker-token"
"""gRPC metadata key of the token (lower case, as gRPC requires)."""
TOKEN_FILE = "worker.token"
"""The token file's name in a site's directory (``<output_dir>/<agent>/``)."""
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,256}")
_MAX_BYTES = 1024


class TokenFileError(ValueError):
    """The token file is missing, unreadable, readable by others or holds no token; the message names it."""


def write_token(path: str | Path) -> str:
    """Write a new random token to ``path`` (mode 0600, atomically; the folder is created 0700 when missing) and
    return it. Raises OSError naming the path."""
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    atomic_write_text(p, token + "\n", mode=0o600)
    return token


def read_token(path: str | Path) -> str:
    """The token in ``path``. Raises :class:`TokenFileError` naming the file when it is missing, not a regular
    file, readable or writable by group or others, or holds no token (32–256 characters of ``A-Z a-z 0-9 _ -``)."""
    p = Path(path)
    try:
        st = os.stat(p)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            raise TokenFileError(f"{p}: the worker token file is accessible to other users (mode "
                                 f"{stat.S_IMODE(st.st_mode):03o}); `chmod 600 {p}`")
        text = read_bounded(p, _MAX_BYTES).decode("ascii").strip()
    except FileNotFoundError:
        raise TokenFileError(f"{p}: no worker token file (the worker writes it when it starts)") from None
    except OSError as err:
        raise TokenFileError(f"{p}: unreadable worker token file ({err.strerror})") from None
    except UnicodeDecodeError:
        text = ""
    if not _TOKEN.fullmatch(text):
        raise TokenFileError(f"{p}: holds no worker token (32 to 256 characters of A-Z, a-z, 0-9, '_', '-')")
    return text


def ensure_token(path: str | Path) -> str:
    """The token in ``path`` (:func:`read_token`), or a new one written there when the file does not exist.
    Raises :class:`TokenFileError` / OSError naming the path."""
    try:
        return read_token(path)
    except TokenFileError:
        if os.path.lexists(path):
            raise
    try:
        return write_token(path)
    except OSError as err:
        raise OSError(err.errno or errno.EIO, f"cannot write the worker token file: {err.strerror}", str(path)) from None
