"""Atomic file writes (a temporary file in the target's folder, fsync, then ``os.replace``),
exclusive directory locks, bounded reads and the check that a path stays inside its directory.

A reader (or a restarted process) sees either the old file or the new one, never a half-written
one; a failed write leaves no temporary file behind. A :class:`DirLock` keeps a second process
out of a directory one process owns (a site's run directory, a worker's checkpoints).
:func:`read_bounded` reads a regular file of at most a given size (never a device, a FIFO or an
endless file); :func:`outside` says whether a path leads out of a directory (through a link).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import tempfile
from pathlib import Path

__all__ = ["DirLock", "LockedError", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "outside", "read_bounded"]

LOCK_FILE = ".lock"


class LockedError(RuntimeError):
    """Another live process holds the lock; the message names it (pid and command line)."""


class DirLock:
    """An exclusive lock on ``directory`` (created if missing) for this process's lifetime.

    ``<directory>/.lock`` is locked with ``flock`` (released by the kernel when the process dies, so a
    killed holder never leaves a stale lock) and holds the holder's pid and command line.
    ``what`` names the directory in the error. Raises :class:`LockedError` when another process holds it,
    OSError when the directory cannot be created.
    """

    def __init__(self, directory: str | Path, *, what: str = "") -> None:
        self.path = Path(directory) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(self._fd)
            self._fd = None
            raise LockedError(f"{what or self.path.parent} ({self.path.parent}) is in use by {holder}; stop it "
                              f"first, or use another directory") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} ({' '.join(sys.argv)[:300]})\n".encode(), 0)

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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


def read_bounded(path: str | Path, max_bytes: int) -> bytes:
    """The content of the regular file ``path``, at most ``max_bytes`` bytes.

    Raises OSError naming ``path``: FileNotFoundError when it is missing, ``EINVAL`` "not a regular file" for a
    directory, device or FIFO (opened without blocking, never read), ``EFBIG`` when it is larger than
    ``max_bytes`` (checked before reading, and again while reading a file that grows).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes ({st.st_size})", str(path))
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes (it grew while read)", str(path))
        return data
    finally:
        os.close(fd)


def outside(path: str | Path, root: str | Path) -> str | None:
    """Where ``path`` really leads (every link resolved, also for a path that does not exist yet) when that is
    outside the directory ``root`` (itself resolved); None when it stays inside."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return None if real == base or real.startswith(base.rstrip(os.sep) + os.sep) else real
