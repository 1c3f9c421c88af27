"""Writing files so that a crash never leaves half of one behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename.

    Readers see either the old file or the whole new one, never a torn write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it private; give it a normal file's mode
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as :func:`atomic_write_text` does, and make the rename durable.

    For files that a later run must find whole after a crash or a power cut (checkpoints): the
    data is fsynced before the rename and the directory after it, so the new name survives too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_problem(path: str | Path, kind: str = "dir") -> str | None:
    """Why ``path`` cannot be written as a directory (``kind`` "dir") or a file ("file"), or
    None when it can: checked before a long run, so that its results are not lost at the end.

    The nearest existing directory is probed by creating and removing a temporary file in it,
    because permission bits do not tell (root passes every check; /proc, read-only mounts and
    full disks refuse anyway). A directory that does not exist yet is created later, as usual.
    """
    path = Path(path)
    if kind not in ("dir", "file"):
        raise ValueError(f"kind must be 'dir' or 'file', got {kind!r}")
    if kind == "dir" and path.exists() and not path.is_dir():
        return f"{path} is a file; give a directory"
    if kind == "file" and path.is_dir():
        return f"{path} is a directory; give a file name"
    start = path if kind == "dir" else path.parent
    existing = next((p for p in (start, *start.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{path}: {existing} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".pdlsim-write-probe-")
    except OSError as exc:
        return f"{path}: cannot write in {existing} ({exc.strerror}); give a writable place"
    os.close(fd)
    os.unlink(probe)
    return None


def check_writable(path: str | Path, kind: str, flag: str, purpose: str = "") -> None:
    """:func:`write_problem` as a :class:`UserError` naming ``flag`` (and what the place is
    ``purpose``-d for, e.g. "for the run's records"): a command's check before its work."""
    problem = write_problem(path, kind)
    if problem is not None:
        raise UserError(f"{flag} {problem}{' ' + purpose if purpose else ''}")
