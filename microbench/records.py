"""Records: JSON Lines files of raw measurements and training timings, with machine metadata.

Format (schema ``pdlsim.records``, version 1). Line 1 is the header::

    {"type": "header", "schema": "pdlsim.records", "schema_version": 1,
     "created_utc": "2025-01-31T12:00:00.000000Z", "machine": {...}, "run": {...}}

``machine`` comes from :func:`microbench.machine.machine_metadata`; ``run`` describes the run
(command, settings) in any shape. Every later line is one record: a JSON object with a non-empty
string ``"type"`` ("measurement", "train_step", ...) and whatever fields it has, nested objects
included. A "measurement" record, as :meth:`microbench.measurement.Measurement.to_record` writes
it, holds ``benchmark``, ``name``, ``params``, ``unit``, ``samples`` (every raw value),
``warmup_discarded``, ``stop_reason`` and a ``summary``; the writer forces no shape on other types.
A benchmark's run (``RecordWriter(..., sweep=True)``) brackets its records with a
``sweep_start`` and a ``sweep_end`` record, so that a run stopped part-way is refused, not
fitted.

Decisions:

- Non-finite floats. JSON has no NaN or infinity. By default the writer refuses them with a
  ValueError naming the field (a NaN timing is a bug to see, not to store). A writer made with
  ``nonfinite="null"`` stores them as null instead, which loads as missing (NaN in a numeric
  DataFrame column); use it for values that may legitimately diverge, such as a training loss.
  The reader also accepts the ``NaN``/``Infinity`` tokens that other JSON writers emit.
- Crash safety. A record is one ``write`` of one line, flushed at once (``fsync`` on close only,
  as it costs milliseconds); ``write_many`` writes several lines in one go. A process killed
  mid-write leaves at most a truncated last line, which :func:`read_records` skips with a
  warning; anything wrong elsewhere is an error.
- One writer per file. MPI ranks write their own files into one run directory
  (``rank0000.jsonl``, ...) and :func:`load_dataframe` reads the directory as one frame. A
  benchmark whose samples are already reduced over ranks (the collectives) writes from rank 0.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .errors import UserError
from .fileio import encode_text, loads
from .machine import identity_difference, machine_identity, utc_now
from .records_read import (
    SCHEMA,
    SCHEMA_VERSION,
    SWEEP_END,
    SWEEP_START,
    RecordsError,
    TruncatedRecordWarning,
    decoded_line,
    is_records_file,
    load_dataframe,
    parse_header,
    read_numbered,
    read_records,
    stopped_sweep_points,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "SWEEP_END",
    "SWEEP_START",
    "RecordWriter",
    "RecordsAppendError",
    "RecordsError",
    "RecordsExistError",
    "TruncatedRecordWarning",
    "append_problem",
    "is_records_file",
    "load_dataframe",
    "read_records",
    "stopped_sweep_points",
]


class RecordsExistError(FileExistsError, UserError):
    """A new records file whose path is taken (by an earlier run, or another run started into
    the same directory at once): one line, never an overwrite."""


class RecordsAppendError(RecordsError, UserError):
    """An existing file that records cannot be appended to (no header of this schema and
    version): one line for the user, with the fix, rather than a traceback."""

    def __init__(self, path: str | os.PathLike[str], line: int, problem: str) -> None:
        super().__init__(path, line, problem)
        self.args = (f"cannot append to {self}; move that file aside or give another --out",)


# ---------------------------------------------------------------------------- writing


def _jsonable(value: Any, where: str, nonfinite: str) -> Any:
    """``value`` as plain JSON types: numpy scalars and arrays converted, non-finite checked."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if nonfinite == "null":
            return None
        raise ValueError(
            f"non-finite value {value!r} at {where or 'record'}: JSON has no NaN or infinity "
            "(make the RecordWriter with nonfinite='null' to store it as null)"
        )
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return _jsonable(float(value), where, nonfinite)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "biu" or (value.dtype.kind == "f" and np.isfinite(value).all()):
            return value.tolist()
        return _jsonable(value.tolist(), where, nonfinite)
    elif isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, (bool, np.bool_)) or not isinstance(key, (str, int, np.integer)):
                raise TypeError(f"{where or 'record'}: key {key!r} is not a string")
            key = key if isinstance(key, str) else str(int(key))
            out[key] = _jsonable(item, f"{where}.{key}" if where else key, nonfinite)
        return out
    elif isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{where}[{i}]", nonfinite) for i, item in enumerate(value)]
    elif isinstance(value, os.PathLike):
        return str(value)
    raise TypeError(f"{where or 'record'}: cannot store a {type(value).__name__} in a record")


def _encode(record: Mapping[str, Any], nonfinite: str) -> str:
    plain = _jsonable(record, "", nonfinite)
    return json.dumps(plain, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _checked(record: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(record, Mapping):
        raise TypeError(f"a record is a dict, got {type(record).__name__}")
    kind = record.get("type")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a record needs a non-empty string 'type', got {kind!r}")
    if kind == "header":
        raise ValueError("type 'header' is reserved for the first line of a file")
    return record


class RecordWriter:
    """Append records to a JSON Lines file, one flushed line each; see the module docstring.

    ``RecordWriter(path, machine, run)`` creates ``path`` (and its parent directories) and
    writes the header; it refuses an existing file unless ``append=True``, which checks the
    existing header and keeps it (then ``machine`` and ``run`` are not written). A cut-off last
    line left by a killed writer is removed before appending. A line the disk refuses (full) is
    cut off again, so the file holds whole records only, and a new file whose header cannot be
    written is removed. With ``sweep=True`` (a benchmark's run) the writer marks the start of
    its records and, closing without an error, their end, so that a run stopped part-way is
    known for one (:data:`SWEEP_START`, :data:`SWEEP_END`). Safe to share between threads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        machine: Mapping[str, Any],
        run: Mapping[str, Any] | None = None,
        *,
        append: bool = False,
        nonfinite: Literal["raise", "null"] = "raise",
        sweep: bool = False,
    ) -> None:
        if nonfinite not in ("raise", "null"):
            raise ValueError(f"nonfinite must be 'raise' or 'null', got {nonfinite!r}")
        self.path = Path(path)
        self.nonfinite = nonfinite
        self._lock = threading.Lock()
        self._bare = False
        self._sweep = sweep
        header = {
            "type": "header",
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "created_utc": utc_now(),
            "machine": dict(machine),
            "run": dict(run or {}),
        }
        line = _encode(header, nonfinite)  # before touching the disk: a bad header leaves no file
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append and self.path.exists() and self.path.stat().st_size > 0:
            self.header = self._open_for_append(machine)
            self._start()
            return
        try:
            self._file = open(self.path, "wb" if append else "xb", buffering=0)
        except FileExistsError:
            raise RecordsExistError(
                f"{self.path} exists (another run may be writing there); refusing to overwrite "
                "it: give a new output directory (or pass append=True to add to it)"
            ) from None
        self.header = json.loads(line)
        try:
            self._write_line(line)
        except OSError:  # a full disk: leave no empty records file behind
            self._file.close()
            self.path.unlink(missing_ok=True)
            raise
        self._bare = True  # this writer made the file, and it holds the header alone
        self._start()

    def _start(self) -> None:
        if self._sweep:
            self.write_mark(SWEEP_START)

    def _open_for_append(self, machine: Mapping[str, Any]) -> dict[str, Any]:
        header, _ = _appendable(self.path)
        _repair_tail(self.path)
        old_host, new_host = header["machine"].get("hostname"), machine.get("hostname")
        if old_host and new_host and old_host != new_host:
            warnings.warn(
                f"{self.path}: appending records from host {new_host!r} to a file whose header "
                f"describes host {old_host!r}",
                stacklevel=3,
            )
        self._file = open(self.path, "ab", buffering=0)
        return header

    def _write_line(self, line: str) -> None:
        with self._lock:
            if self._file.closed:
                raise ValueError(f"{self.path}: the writer is closed")
            fd = self._file.fileno()
            size = os.fstat(fd).st_size
            data = memoryview(encode_text(line + "\n"))
            try:
                while data:  # unbuffered: what was written is in the file, or cut off below
                    data = data[os.write(fd, data) :]
            except OSError as exc:  # a full disk: cut the torn line, keep every whole record
                os.ftruncate(fd, size)
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (a mapping with a string ``"type"``) and flush it to the OS."""
        self.write_many((record,))

    def write_mark(self, kind: str, **fields: Any) -> None:
        """Append a mark (:data:`SWEEP_START` or :data:`SWEEP_END`, with ``fields``): not a
        measurement, so a file this writer made that holds the header and marks alone is still
        removed by ``close(failed=True)``, and a retry into the directory needs no append."""
        if kind not in (SWEEP_START, SWEEP_END):
            raise ValueError(f"unknown mark {kind!r}")
        bare = self._bare
        self.write({"type": kind, **fields})
        self._bare = bare

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append several records with one write and one flush (each checked as :meth:`write`
        checks it, all before any is written): for a loop that must not pay a system call
        per record, such as a training loop between two steps it times."""
        lines = [_encode(_checked(record), self.nonfinite) for record in records]
        if lines:
            self._write_line("\n".join(lines))
            self._bare = False

    def close(self, failed: bool = False) -> None:
        """Flush, fsync and close; calling it again does nothing. ``failed``: the run stopped
        on an error before its first record, so a file this writer made holds a header alone:
        it is removed, and the retry into the same directory needs no ``--append`` (a file that
        holds records, or was appended to, always stays)."""
        if self._sweep and not failed and not self._file.closed:
            self.write_mark(SWEEP_END)
        with self._lock:
            if self._file.closed:
                return
            try:
                os.fsync(self._file.fileno())
            finally:
                self._file.close()
            if failed and self._bare:
                self.path.unlink(missing_ok=True)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.close(failed=exc_type is not None)


# Record types a training run writes (pdlsim.train): a benchmark's measurements appended
# among them would be read as the training run's, and the benchmark's never found.
_TRAINING_TYPES = ("train_step", "train_epoch", "checkpoint")


def append_problem(path: str | os.PathLike[str], command: str | None = None) -> str | None:
    """Why records cannot be appended to the existing file ``path`` (its first line is no
    header of this schema and version, it cannot be read, its header says another ``command``
    wrote it or holds a training run's records, or it describes another machine than this
    one), or None when they can: asked before a benchmark runs, so that its records are not
    lost at the end, and one line for the user (a :class:`RecordsError` escaped as a
    traceback). An empty file is no problem: the writer starts it afresh."""
    try:
        if Path(path).stat().st_size == 0:
            return None
        header, kinds = _appendable(Path(path))
    except RecordsAppendError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot append to {path} ({exc.strerror}); give another --out"
    run = header.get("run")
    wrote = run.get("command") if isinstance(run, dict) else None
    if command is not None and isinstance(wrote, str) and wrote != command:
        return (f"{path} holds the records of '{wrote}', not of '{command}'; give another "
                "--out, or append to that command's own file")  # fmt: skip
    training = next((kind for kind in _TRAINING_TYPES if kind in kinds), None)
    if command is not None and training is not None:
        return (f"{path} holds a training run's records ({training}), not those of "
                f"'{command}'; give another --out")  # fmt: skip
    other = identity_difference(header["machine"], machine_identity())
    if other is not None:
        return (
            f"{path} holds the records of another machine ({other}), and records of two "
            "machines cannot be calibrated together; give another --out"
        )
    return None


def _appendable(path: Path) -> tuple[dict[str, Any], set[str]]:
    """The header of the existing records file ``path``, which records are to be appended to,
    and the types of its records; :class:`RecordsAppendError` when its first line is no header
    of this schema and version (read up to 1 MiB: a header is a few KiB), or a line after it is
    damaged: records appended to it would be refused by every reader with it, and the run lost
    (:func:`_repair_tail` removes a bad last line)."""
    with open(path, "rb") as f:
        first = f.readline(1 << 20)
    try:
        parse_header(path, decoded_line(path, 1, first))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncatedRecordWarning)
            header, numbered = read_numbered(path)
    except RecordsError as exc:
        raise RecordsAppendError(exc.path, exc.line, exc.problem) from None
    return header, {record.get("type") for _, record in numbered}


def _repair_tail(path: Path) -> None:
    """Make the last line whole before appending: terminate it if it is a whole JSON record,
    else cut it off, terminated or not (the reader skips a bad last line; once records follow
    it, it is a bad line in the middle and the whole file is refused)."""
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(end - 1)
        terminated = f.read(1) == b"\n"
        start, pos = 0, end - terminated
        while pos > 0:  # search backwards for the newline before the last line
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            newline = f.read(step)[: end - terminated - pos].rfind(b"\n")
            if newline >= 0:
                start = pos + newline + 1
                break
        f.seek(start)
        last = f.read()
        try:
            loads(last.decode("utf-8")) if last.strip() else None
            if not terminated:
                f.seek(end)
                f.write(b"\n")
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            f.truncate(start)
            warnings.warn(
                f"{path}: removed a truncated last line (byte {start}) before appending",
                TruncatedRecordWarning,
                stacklevel=4,
            )
