"""Reading records files (:mod:`microbench.records` describes the format and writes them).

A records file is written as UTF-8 JSON Lines, a header first: a line that is not UTF-8 or not
JSON is damage, named by file and line, except the last line, which a writer killed mid-write
may have cut off (skipped with a :class:`TruncatedRecordWarning`).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fileio import json_problem, loads

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "pdlsim.records"
SCHEMA_VERSION = 1
# A benchmark that times a planned grid writes a record of this type before its first point
# and one of the other after its last, so that a sweep stopped part-way (interrupted, killed)
# is known for one and not fitted as if its grid were whole.
SWEEP_START = "sweep_start"
SWEEP_END = "sweep_end"
MARKS = (SWEEP_START, SWEEP_END)
_TAIL_BYTES = 4096  # read from a file's end to find its last line when that is a mark

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "SWEEP_END",
    "SWEEP_START",
    "RecordsError",
    "TruncatedRecordWarning",
    "decoded_line",
    "is_records_file",
    "load_dataframe",
    "parse_header",
    "read_numbered",
    "read_records",
    "stopped_sweep_points",
]


class RecordsError(ValueError):
    """A records file that cannot be read: one line saying ``file:line: problem``."""

    def __init__(self, path: str | os.PathLike[str], line: int, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}:{line}: {problem}")


class TruncatedRecordWarning(UserWarning):
    """The last line of a records file was cut off (a process killed mid-write) and skipped."""


def parse_header(path: Path, text: str) -> dict[str, Any]:
    if not text.strip():
        raise RecordsError(path, 1, f"empty line where the {SCHEMA} header should be")
    try:
        header = loads(text)
    except json.JSONDecodeError as exc:  # an editor's byte-order mark is named, with the fix
        bom = exc.msg.startswith("Unexpected UTF-8 BOM")
        problem = json_problem(exc) if bom else f"no {SCHEMA} header (line 1 is not JSON)"
        raise RecordsError(path, 1, problem) from None
    if not isinstance(header, dict) or header.get("type") != "header":
        raise RecordsError(path, 1, f"no {SCHEMA} header (line 1 is not a header object)")
    if header.get("schema") != SCHEMA:
        raise RecordsError(
            path, 1, f"foreign header: schema {header.get('schema')!r}, not {SCHEMA!r}"
        )
    version = header.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise RecordsError(
            path, 1, f"unknown schema_version {version!r} (this reader knows {SCHEMA_VERSION})"
        )
    for key in ("machine", "run"):
        if not isinstance(header.get(key), dict):
            raise RecordsError(path, 1, f"header field {key!r} must be an object")
    return header


def read_records(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read one records file: ``(header, records)``, records in file order, without the marks
    that bracket a benchmark's run (framing, like the header: :func:`read_numbered` keeps them).

    A last line that is not valid JSON (a writer killed mid-line) is skipped with a
    :class:`TruncatedRecordWarning`; any other bad line, a missing or foreign header and an
    unknown schema version raise :class:`RecordsError`. Blank lines are ignored.
    """
    header, numbered = read_numbered(Path(path))
    return header, [record for _, record in numbered if record["type"] not in MARKS]


def read_numbered(path: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """:func:`read_records`, each record with its line number (for errors that name it)."""
    header: dict[str, Any] | None = None
    records: list[tuple[int, dict[str, Any]]] = []
    pending: tuple[int, str] | None = None  # a bad line: fatal unless nothing follows it
    with open(path, "rb") as f:  # decoded line by line: a byte that is not UTF-8 is damage
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                header = parse_header(path, decoded_line(path, 1, raw))
                continue
            if not raw.strip():
                continue
            if pending is not None:
                raise RecordsError(path, *pending)
            try:
                record = loads(decoded_line(path, lineno, raw))
            except RecordsError as e:  # not UTF-8: damage, fatal unless nothing follows it
                pending = (lineno, e.problem)
                continue
            except json.JSONDecodeError as e:
                pending = (lineno, f"corrupt line: invalid JSON ({e.msg}, column {e.colno})")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("type"), str):
                raise RecordsError(path, lineno, "record is not a JSON object with a string 'type'")
            if record["type"] == "header":
                raise RecordsError(path, lineno, "a second header (were files concatenated?)")
            records.append((lineno, record))
    if header is None:
        raise RecordsError(path, 1, f"empty file: no {SCHEMA} header")
    if pending is not None:
        warnings.warn(
            f"{path}:{pending[0]}: skipped a truncated last line (a writer killed mid-write?)",
            TruncatedRecordWarning,
            stacklevel=2,
        )
    return header, records


def decoded_line(path: Path, lineno: int, raw: bytes) -> str:
    """Line ``lineno`` of ``path`` as text; a :class:`RecordsError` where it is not UTF-8: the
    writer writes UTF-8 only, so another byte is damage (replaced, it hid in a value)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        byte = raw[e.start : e.start + 1]
        raise RecordsError(path, lineno, f"corrupt line: not UTF-8 text (byte {byte!r}, column "
                           f"{e.start + 1})") from None  # fmt: skip


def _natural_key(path: Path) -> list[Any]:
    """Sort key that puts rank2.jsonl before rank10.jsonl (and ranks2/ before ranks10/)."""
    return [int(part) if part.isdecimal() else part for part in re.split(r"(\d+)", path.as_posix())]


_RECORD_START = re.compile(rb'\s*\{\s*"type"\s*:')  # how every records line begins


def is_records_file(path: Path) -> bool:
    """Whether a file found in a directory is a records file; other JSON Lines files (an
    Extra-P export, say) are skipped with a warning instead of failing the whole load, and so
    is anything that is not a regular file (opening a FIFO would wait for a writer forever).

    A records file whose header was damaged (cut off mid-line, or its first line lost, so that
    a record comes first) is no "other" file: skipping it would drop a benchmark's records from
    a calibration with no more than a note. Its first line still shows what it is (a ``"type"``
    field, or the schema's name), and it is refused with a :class:`RecordsError` naming the
    file and line 1."""
    if not path.is_file():
        warnings.warn(f"{path}: not a regular file, skipped", stacklevel=3)
        return False
    with path.open("rb") as handle:
        first = handle.readline(1 << 20)  # a header is a few KiB
    if not first.strip():  # named as such: "not a records file" hid an emptied one
        warnings.warn(f"{path}: an empty file (no {SCHEMA} header), skipped", stacklevel=3)
        return False
    try:
        header = loads(first)
    except ValueError:
        header = None
    if isinstance(header, dict) and header.get("schema") == SCHEMA:
        return True
    if isinstance(header, dict) and isinstance(header.get("type"), str):
        kind = header["type"]
        problem = "a header of another schema" if kind == "header" else f"a {kind!r} record"
        raise RecordsError(path, 1, f"no {SCHEMA} header (line 1 is {problem}: the header "
                           "was lost or replaced)")  # fmt: skip
    if header is None and (SCHEMA.encode() in first or _RECORD_START.match(first)):
        raise RecordsError(path, 1, f"damaged {SCHEMA} header (line 1 is cut off or not "
                           "JSON)")  # fmt: skip
    warnings.warn(f"{path}: not a {SCHEMA} file, skipped", stacklevel=3)
    return False


def load_dataframe(path_or_dir: str | os.PathLike[str], type: str | None = None) -> pd.DataFrame:
    """Load one records file, or every ``*.jsonl`` under a directory, into one DataFrame.

    One row per record (only those of ``type`` when given), nested fields flattened with dots
    (``params.nbytes``), raw ``samples`` kept as list cells, plus a ``source`` column (the file's
    path relative to the directory, e.g. ``ranks2/collectives.jsonl``) and the header's machine
    metadata as ``machine.*`` columns, and ``source_line``, the record's line in its file (for
    errors that name it). ``source``, ``source_line`` and
    ``machine.*`` are the loader's: a record's own fields of those names are replaced. Files
    are read in natural order (rank2 before rank10).
    """
    import pandas as pd  # here, not at the top: the benchmarks themselves do not need pandas

    path = Path(path_or_dir)
    if path.is_dir():
        root = path
        found = sorted(path.rglob("*.jsonl"), key=_natural_key)
        files = [f for f in found if is_records_file(f)]
        if not files and found:  # each was skipped with a warning; say why in the error too
            raise FileNotFoundError(
                f"{path}: none of its {len(found)} *.jsonl files holds {SCHEMA} records (each "
                f"was skipped, e.g. {found[0]}); give a run directory of pdlsim bench"
            )
        if not files:
            raise FileNotFoundError(f"{path}: no *.jsonl records files under this directory")
    elif path.exists():
        root, files = path.parent, [path]
    else:
        raise FileNotFoundError(f"{path}: no such file or directory")
    frames = []
    for file in files:
        header, numbered = read_numbered(file)
        numbered = [(n, r) for n, r in numbered if r["type"] not in MARKS]
        if type is not None:
            numbered = [(n, r) for n, r in numbered if r["type"] == type]
        if not numbered:
            continue
        frame = pd.json_normalize([r for _, r in numbered], sep=".")
        machine = pd.json_normalize([header["machine"]], sep=".").add_prefix("machine.")
        machine = machine.iloc[[0] * len(frame)].reset_index(drop=True)
        ours = ("source", "source_line")
        frame = frame.drop(columns=[c for c in frame.columns if c in machine or c in ours])
        frame.insert(len(frame.columns), "source", file.relative_to(root).as_posix())
        frame.insert(len(frame.columns), "source_line", [n for n, _ in numbered])
        frames.append(pd.concat([frame, machine], axis=1))
    if not frames:
        return pd.DataFrame(columns=["type", "source"])
    return pd.concat(frames, ignore_index=True, sort=False)


def stopped_sweep_points(path: str | os.PathLike[str]) -> int | None:
    """The measurements of a sweep in ``path`` that stopped part-way: its records begin with a
    :data:`SWEEP_START` mark and the last start has no :data:`SWEEP_END` after it. None for a
    file whose last sweep ended, or that has no marks. Reads the file's first record and last
    line only, unless the sweep stopped."""
    with open(path, "rb") as f:
        f.readline()  # the header
        first = f.readline()
        if _type(first) != SWEEP_START:
            return None
        end = f.seek(0, os.SEEK_END)
        f.seek(max(0, end - _TAIL_BYTES))  # an end mark is a short last line
        tail = f.read().rstrip().rsplit(b"\n", 1)[-1]
    if _type(tail) == SWEEP_END:
        return None
    _, numbered = read_numbered(Path(path))
    kinds = [record["type"] for _, record in numbered]
    last = len(kinds) - 1 - kinds[::-1].index(SWEEP_START)
    return sum(kind == "measurement" for kind in kinds[last:])


def _type(raw: bytes) -> str | None:
    try:
        record = json.loads(raw)
    except ValueError:  # a line cut off: no mark
        return None
    return record.get("type") if isinstance(record, dict) else None
