"""Writing files so that a crash never leaves half of one behind, and reading JSON strictly.

Every output goes through :func:`atomic_write_text` or :func:`atomic_write_bytes`: a temporary
file beside the target, then a rename, so a full disk or a kill leaves the old file (or none),
never a torn or empty one. Only regular files and new names are written: renaming onto a FIFO
or a device would replace it with a plain file, which is never what a user pointing an output
at one meant. A link to a regular file is written through (the file it leads to is replaced,
the link kept), as a shell's ``>`` writes it; :func:`write_problem` refuses a read-only file
up front rather than rename over it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is ("a FIFO", "a directory", ...) when it exists and is not a regular
    file (a link is followed), else None: also when it cannot be looked at (a loop of links,
    a name too long), which the open that follows then reports as the OSError it is."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    return next((kind for test, kind in _KINDS if test(mode)), None)


BROKEN_LINK = (
    "is a link to nowhere (or a loop of links), not a file to replace; remove the link, or give "
    "another name"
)


def broken_link(path: Path) -> bool:
    """Whether ``path`` is a link that leads to no file: to a name that does not exist, or
    round a loop. Written over, it would be replaced by a plain file and the link lost, with
    nothing where it pointed; a shell's ``>`` onto a loop fails, so a write here does too."""
    try:
        return path.is_symlink() and not path.exists()
    except (OSError, ValueError):  # a name too long, a NUL: the write reports it
        return False


def written_path(path: str | Path) -> Path:
    """Where writing ``path`` puts the data: the file a link leads to when ``path`` is a link
    to a regular file (as ``>`` and an editor write through it; a rename onto the link would
    replace the link with a plain file and leave its target stale), else ``path`` itself."""
    path = Path(path)
    try:
        if path.is_symlink() and path.is_file():
            return Path(os.path.realpath(path))
    except (OSError, ValueError):  # a name too long, a NUL: the write reports it
        pass
    return path


def _staged(path: Path, data: bytes) -> str:
    """A temporary file beside ``path`` holding ``data``, flushed to disk: what a rename then
    puts in place whole. Nothing is left behind when it fails."""
    kind = special_kind(path)
    if kind is not None:
        raise UserError(
            f"{path} is {kind}, not a regular file; move it aside, or give another name"
        )
    if broken_link(path):
        raise UserError(f"{path} {BROKEN_LINK}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it private; give it a normal file's mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # a failed write names no file: name the one being written
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the block with Ctrl-C, SIGTERM and SIGHUP held back, then act on any that came.

    A signal's exception raised between a temporary file's creation and its name being noted
    (the return from the call that made it) would leave the temporary file behind; one raised
    between two renames of files that belong together would leave half a set. Held back, the
    signal acts once the files are all in place (or all cleaned up), as it would have a moment
    later. Only the main thread can set handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous: dict[int, Any] = {}
    for sig in _DEFERRED:
        handler = signal.getsignal(sig)
        if handler not in (signal.SIG_IGN, None):  # None: a handler not set from Python
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(pending):
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def _atomic_write(path: str | Path, data: bytes, durable: bool) -> None:
    atomic_write_all({Path(path): data}, durable)


def atomic_write_all(files: Mapping[Path, bytes], durable: bool = False) -> None:
    """Write several files that belong together (a table and its plot) all or none: each is
    staged in full beside its place first, and only when every one is on disk are they renamed
    into place, so a full disk halfway leaves the old set whole, not a new table beside an old
    plot. ``durable``: the directories are fsynced after the renames too."""
    staged: list[tuple[str, Path]] = []
    with signals_deferred():
        try:
            for path, data in files.items():
                target = written_path(path)  # through a link, not over it
                staged.append((_staged(target, data), target))
            for tmp, path in staged:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise
    if durable:
        for folder in {path.parent for _, path in staged}:
            directory = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)


def encode_text(text: str) -> bytes:
    """``text`` as UTF-8, where a file name that is not UTF-8 (``\\xff.json``, or any
    non-ASCII name under a C locale) came in from the command line as lone surrogates: those
    are written as ``\\udcff`` escapes, which JSON reads back as the same string, instead of
    failing mid-write."""
    return text.encode("utf-8", "backslashreplace")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename.

    Readers see either the old file or the whole new one, never a torn write; an existing
    ``path`` that is not a regular file is refused (:class:`UserError`) and left as it is.
    """
    _atomic_write(path, encode_text(text), durable=False)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as :func:`atomic_write_text` does, and make the rename durable.

    For files that a later run must find whole after a crash or a power cut (checkpoints): the
    data is fsynced before the rename and the directory after it, so the new name survives too.
    """
    _atomic_write(path, data, durable=True)


class DuplicateKeyError(ValueError):
    """A JSON object that names ``key`` twice (Python's reader would keep the last silently)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"duplicate key {key!r}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise DuplicateKeyError(key)
        doc[key] = value
    return doc


MAX_INT_DIGITS = 18  # a whole number in a document: up to 10**18, past any count or size


class _LongInt(Exception):
    def __init__(self, digits: str) -> None:
        self.digits = digits


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInt(digits)
    return int(digits)


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``, but arrays or objects nested past the interpreter's recursion limit, and
    whole numbers of more than :data:`MAX_INT_DIGITS` digits, are a
    :class:`json.JSONDecodeError` like any other text that is no document pdlsim reads (a
    ``RecursionError`` would escape every reader's handling of bad JSON, and a 300-digit count
    would be carried into every message and product that quotes it)."""
    try:
        return json.loads(text, parse_int=_parse_int, **kwargs)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", _shown(text), 0) from None
    except _LongInt as exc:
        shown = _shown(text)
        raise json.JSONDecodeError(
            f"a whole number of {len(exc.digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})",
            shown,
            max(shown.find(exc.digits), 0),
        ) from None


def _shown(text: str | bytes) -> str:
    return text if isinstance(text, str) else text.decode("utf-8", "replace")


def loads_strict(text: str) -> Any:
    """:func:`loads`, but an object with a key twice raises :class:`DuplicateKeyError`: a
    hand-edited file whose second value silently wins is a mistake to report, not guess at."""
    return loads(text, object_pairs_hook=_unique_keys)


TRAILING_SLASH = "ends in '/' but is a file, not a directory; drop the trailing slash"


def json_problem(exc: ValueError) -> str:
    """What a JSON reader's failure means to the person who wrote the file, with the fix: a
    byte-order mark or bytes that are not UTF-8 (a file saved by an editor in another encoding)
    are named as such, rather than in the decoder's terms ("decode using utf-8-sig")."""
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset "
            f"{exc.start}); save it as UTF-8"
        )
    if isinstance(exc, json.JSONDecodeError):
        if exc.msg.startswith("Unexpected UTF-8 BOM"):
            return "starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 without one"
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    return str(exc)


def read_json(path: str | Path, source: str) -> Any:
    """The JSON document in the regular file ``path``, read as :func:`loads_strict` does; any
    problem (missing, not a regular file, unreadable, not JSON, a key given twice) is one
    :class:`UserError` line starting with ``source``. A name ending in ``/`` must be a
    directory, as the system has it (Path would drop the slash and read the file)."""
    text = os.fspath(path)
    path = Path(path)
    kind = special_kind(path)
    if kind is None and not path.exists():
        broken = path.is_symlink()  # a link to nowhere, or a loop of links
        problem = "is a link that leads to no file" if broken else "no such file"
        raise UserError(f"{source}: {problem}; give a JSON file")
    if kind is not None:
        raise UserError(f"{source}: is {kind}; give a JSON file")
    if text.endswith(os.sep):
        raise UserError(f"{source}: {TRAILING_SLASH}")
    try:
        return loads_strict(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise UserError(
            f"{source}: the key '{exc.key}' is given twice in one object; keep one"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: {json_problem(exc)}") from None
    except OSError as exc:
        raise UserError(f"{source}: cannot read it ({exc}); give a readable JSON file") from None


def write_problem(path: str | Path, kind: str = "dir") -> str | None:
    """Why ``path`` cannot be written as a directory (``kind`` "dir") or a file ("file"), or
    None when it can: checked before a long run, so that its results are not lost at the end.

    The nearest existing directory is probed by creating and removing a temporary file in it,
    because permission bits do not tell (root passes every check; /proc, read-only mounts and
    full disks refuse anyway). A directory that does not exist yet is created later, as usual.
    """
    if kind not in ("dir", "file"):
        raise ValueError(f"kind must be 'dir' or 'file', got {kind!r}")
    if not str(path):
        return "is empty; give a name"
    shown = path = Path(path)
    if kind == "file":
        path = written_path(path)  # a link to a file: the file it leads to is what is written
        if path.is_file() and not os.access(path, os.W_OK):
            return f"{shown} is read-only; make it writable (chmod u+w) or give another name"
    if kind == "dir" and path.exists() and not path.is_dir():
        return f"{shown} is {special_kind(path) or 'a file'}; give a directory"
    if kind == "file" and path.is_dir():
        return f"{shown} is a directory; give a file name"
    special = special_kind(path) if kind == "file" else None
    if special is not None:
        return f"{shown} is {special}, not a regular file; give a new file name"
    if kind == "file" and broken_link(path):
        return f"{shown} {BROKEN_LINK}"
    for place in (path, *path.parents) if kind == "dir" else path.parents:
        if place.is_symlink() and not place.exists():  # mkdir there: EEXIST, or ELOOP
            return f"{shown}: {place} is a link to nowhere (or a loop), not a directory"
    start = path if kind == "dir" else path.parent
    existing = next((p for p in (start, *start.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{shown}: {existing} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".pdlsim-write-probe-")
    except OSError as exc:
        return f"{shown}: cannot write in {existing} ({exc.strerror}); give a writable place"
    os.close(fd)
    os.unlink(probe)
    return None


def check_writable(path: str | Path, kind: str, flag: str, purpose: str = "") -> None:
    """:func:`write_problem` as a :class:`UserError` naming ``flag`` (and what the place is
    ``purpose``-d for, e.g. "for the run's records"): a command's check before its work."""
    problem = write_problem(path, kind)
    if problem is not None:
        raise UserError(f"{flag} {problem}{' ' + purpose if purpose else ''}")


def check_folder_exists(path: str | Path, flag: str, what: str) -> None:
    """Refuse ``path`` (given as ``flag``) whose folder does not exist: only the last name may
    be new, so a mistyped folder above it is not created silently. ``what`` is what to give
    instead, in an existing folder ("a file", "--out")."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise UserError(
            f"{flag} {path}: the folder {folder} does not exist; create it, or give {what} in an "
            "existing folder"
        )


def new_run_dir(parent: str | Path, prefix: str = "") -> Path:
    """Create and return a fresh run directory ``parent/<prefix><UTC date-time>``, with ``-2``,
    ``-3``, ... added when that name is taken.

    ``mkdir`` without ``exist_ok`` either creates the directory or fails, atomically, so runs
    started in the same second never share (and so never corrupt) a folder. A place that
    cannot hold it is a :class:`UserError` pointing at ``--out``.
    """
    parent = Path(parent)
    name = prefix + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for k in itertools.count(1):
            path = parent / (name if k == 1 else f"{name}-{k}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise UserError(
            f"cannot create a run directory in {parent} ({exc.strerror}); give --out DIR"
        ) from None
    raise AssertionError("unreachable")  # itertools.count never ends


@contextlib.contextmanager
def removed_if_empty_on_failure(path: str | Path | None) -> Iterator[None]:
    """Run the block; if it fails and ``path`` (a run directory this command made) is still
    empty, remove it: a run refused before its first file leaves no folder behind. A folder
    holding anything stays (``rmdir`` removes only empty ones), so nothing written is lost."""
    try:
        yield
    except BaseException:
        if path is not None:
            with contextlib.suppress(OSError):
                Path(path).rmdir()
        raise
