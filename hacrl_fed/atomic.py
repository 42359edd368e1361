"""Atomic file writes: a temporary file in the target's folder, fsync, then ``os.replace``.

A reader (or a restarted process) sees either the old file or the new one, never a half-written
one; a failed write leaves no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir"]


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so a rename inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically (the parent folder must exist).

    ``mode`` (e.g. 0o600 for secrets) is set on the temporary file before any byte is written,
    so the content is never briefly readable by others. Returns the path. Raises OSError naming
    ``path`` (not the temporary file).
    """
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(p)) from None
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)
