"""What ``pdlsim calibrate --from`` refuses in a run directory before fitting anything.

A records file checks only its header and that each line is a JSON object with a ``type``
(:mod:`microbench.records`); the fitters then read the measurement records' fields. A record
edited by hand or written by another tool could lack ``benchmark`` (a ``KeyError`` deep in
pandas), hold ``samples`` that are not a list of numbers (a numpy conversion error) or negative
times (fitted silently into a profile that predicts nonsense). And a directory that pools the
records of two different machines would fit one profile to both. Each is refused here with
one line naming the file, the record and what to fix. So is a value no measurement can have:
a count of ranks or threads of 0 or past any machine (a traceback deep in numpy, or a fit that
allocates petabytes), a time of more than a day, a timed operation whose median is 0 s (every
fitter divides by it: an infinite peak rate failed the profile's write with a traceback, or a
fit failed without naming the record), a collective no cost formula knows, or samples in a unit
other than the seconds the fitters read them as (:data:`_UNITS_OF`). And a
benchmark run stopped part-way (:func:`check_sweeps_ended`): its fits hold the points it
reached as if they were the whole grid (a third of a quick kernel sweep priced a residual CNN's
step at 0.6 ms against 115 ms from the whole).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.formulas import ALGORITHMS
from microbench.errors import UserError
from microbench.machine import IDENTITY_KEYS
from microbench.records import read_records, stopped_sweep_points

__all__ = [
    "MACHINE_IDENTITY",
    "check_measurements",
    "check_no_copies",
    "check_one_machine",
    "check_sweeps_ended",
]

# What must agree for records to describe one machine (microbench.machine.IDENTITY_KEYS, which
# an append onto another machine's records file is refused by), as columns of the frame.
MACHINE_IDENTITY = tuple(f"machine.{key}" for key in IDENTITY_KEYS)

_TEXT_FIELDS = ("benchmark", "name")

# The kind of each ``params`` field the fitters read (``astype(int)``, comparisons, groupings):
# a string, a null or a bool where a count belongs was a traceback deep in pandas or numpy, or
# a fit on nonsense. A field a record leaves out is not checked here (the fitter that needs it
# says so); fields not listed are not read.
_COUNTS = ("base_n", "batch", "bytes", "elements", "flops", "k", "launch", "m", "n", "op_calls",
           "process", "procs", "rank", "ranks", "ranks_per_node", "threads", "total_bytes",
           "wire_bytes")  # fmt: skip
_TEXTS = ("device", "direction", "dtype", "kernel", "layout", "method", "model", "moment", "op",
          "operation", "phase", "statistic", "variant", "workload_json")  # fmt: skip
_FLAGS = ("in_place", "oversubscribed", "pinned")
_NUMBERS = ("compute_s_target", "density", "resolution_s", "shift")

# What a count can physically be (inclusive); a count not named here: 0 to 2**53, where a
# float64 still holds every whole number. Processes past 2**24 (16.7 million, twice the
# largest machine's cores) or threads past 2**16 are no machine's, and a fitter allocates per
# rank; a message or buffer past a pebibyte is no benchmark's.
_PROCESSES = 1 << 24
_COUNT_RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("ranks", "procs", "ranks_per_node"), (1, _PROCESSES)),
    **dict.fromkeys(("rank", "process"), (0, _PROCESSES - 1)),
    "threads": (1, 1 << 16),
    "batch": (1, 1 << 31),
    **dict.fromkeys(("bytes", "total_bytes", "wire_bytes", "elements"), (0, 1 << 50)),
}
_COUNT_DEFAULT = (0, 1 << 53)
# Seconds no single timed sample of a benchmark lasts (the longest stage runs minutes).
MAX_SAMPLE_S = 86_400.0
# Benchmarks whose time may be 0 s: the clock's own overhead, which a clock coarser than its
# call reads as no time. Every other timed operation takes some: a median of 0 s is no
# measurement.
_ZERO_TIME_ALLOWED = ("timer",)
# The unit a record's samples are in: seconds, but for the watts and joules the power benchmark
# writes. The fitters read every other record's samples as seconds, so a unit of "ms" or "us"
# would be fitted a thousandfold off, and one no time check applies to.
_UNITS = ("s",)
_UNITS_OF: dict[str, tuple[str, ...]] = {"power": ("s", "W", "J")}
# Values a text field of a benchmark must take, where a fitter looks each one up.
_VOCABULARY: dict[tuple[str, str], tuple[str, ...]] = {
    ("collectives", "op"): tuple(ALGORITHMS),
    ("copies", "direction"): ("h2d", "d2h"),
}


def _record(frame: pd.DataFrame, row: int, where: str) -> str:
    """The ``row``-th record of ``frame`` as an error names it: its file and line, and its
    place among that file's measurement records."""
    if "source" in frame:
        source = f"{where}/{frame['source'].iloc[row]}"
        nth = int(frame.groupby("source", sort=False).cumcount().iloc[row]) + 1
    else:
        source, nth = where, row + 1
    line = frame["source_line"].iloc[row] if "source_line" in frame else None
    if line is not None and not _absent(line):
        source = f"{source}:{int(line)}"
    named = " ".join(str(frame[c].iloc[row]) for c in _TEXT_FIELDS if c in frame)
    return f"{source}: measurement record {nth} ({named or 'unnamed'})"


def _bad_sample(samples: Any, limit: float) -> str | None:
    """Why ``samples`` is no list of values from 0 to ``limit`` (None when it is one)."""
    if not isinstance(samples, list) or not samples:
        return f"'samples' must be a non-empty list of times, got {str(samples)[:40]}"
    for i, value in enumerate(samples):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return f"'samples[{i}]' holds {str(value)[:40]!r}, not a number"
        if not (math.isfinite(value) and value >= 0):
            return f"'samples[{i}]' holds {value}: times must be finite and >= 0"
        if value > limit:
            return (f"'samples[{i}]' holds {value:g} s: no timed sample lasts more than a day "
                    f"({limit:g} s)")  # fmt: skip
    return None


def _limits(frame: pd.DataFrame) -> pd.Series:
    """Per record, the largest sample it may hold: :data:`MAX_SAMPLE_S` for a time (unit "s",
    or no unit), none for the watts and joules of the power benchmark."""
    if "unit" not in frame:
        return pd.Series(MAX_SAMPLE_S, index=frame.index)
    seconds = frame["unit"].isna() | (frame["unit"] == "s")
    return seconds.map({True: MAX_SAMPLE_S, False: math.inf})


def check_measurements(frame: pd.DataFrame, where: str) -> None:
    """Every measurement record of ``frame`` (:func:`microbench.records.load_dataframe`) has a
    string ``benchmark`` and ``name``, ``params`` as an object and ``samples`` as a non-empty
    list of finite, non-negative numbers; a one-line :class:`UserError` for the first that
    does not."""
    nested = [c for c in frame if c.startswith("samples.")]  # an object json_normalize split
    if nested:
        row = int(np.flatnonzero(frame[nested].notna().any(axis=1).to_numpy())[0])
        raise UserError(f"{_record(frame, row, where)}: 'samples' must be a non-empty list of "
                        "times, got an object; re-run the benchmark")  # fmt: skip
    for column in (*_TEXT_FIELDS, "samples"):
        if column not in frame:
            raise UserError(
                f"{where}: measurement records without a '{column}' field; these are not "
                "pdlsim bench records, or were edited: re-run the benchmark"
            )
    for column in _TEXT_FIELDS:
        wrong = ~frame[column].map(lambda v: isinstance(v, str) and bool(v))
        if wrong.any():
            row = int(np.flatnonzero(wrong.to_numpy())[0])
            value = frame[column].iloc[row]
            missing = value is None or (isinstance(value, float) and math.isnan(value))
            got = "it has none" if missing else f"got {value!r}"
            raise UserError(
                f"{_record(frame, row, where)}: '{column}' must be a non-empty string, {got}; "
                "re-run the benchmark"
            )
    if "params" in frame:  # json_normalize flattens an object into params.*; what is left
        wrong = frame["params"].notna()  # is a params that was no object
        if wrong.any():
            row = int(np.flatnonzero(wrong.to_numpy())[0])
            raise UserError(f"{_record(frame, row, where)}: 'params' must be an object; re-run it")
    _check_params(frame, where)
    _check_vocabulary(frame, where)
    _check_units(frame, where)
    samples, limits = frame["samples"], _limits(frame)
    if not _all_times(samples, limits):
        for row, (value, limit) in enumerate(zip(samples, limits, strict=True)):
            problem = _bad_sample(value, limit)
            if problem is not None:
                raise UserError(f"{_record(frame, row, where)}: {problem}; re-run the benchmark")
    _check_no_zero_times(frame, where)


def _check_no_zero_times(frame: pd.DataFrame, where: str) -> None:
    """No timed record (unit "s", or none) but the clock's own (:data:`_ZERO_TIME_ALLOWED`)
    has a median of 0 s; its samples are known to be lists of numbers >= 0 here."""
    timed = _limits(frame) == MAX_SAMPLE_S
    timed &= ~frame["benchmark"].isin(_ZERO_TIME_ALLOWED)
    zero = timed & frame["samples"].map(lambda s: float(np.median(s)) == 0.0)
    if zero.any():
        row = int(np.flatnonzero(zero.to_numpy())[0])
        raise UserError(
            f"{_record(frame, row, where)}: 'samples' have a median of 0 s, but a timed "
            "operation takes some time (was it edited?); re-run the benchmark"
        )


def _absent(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_count(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0 and float(value).is_integer()


def _count_test(key: str) -> tuple[Any, str]:
    """The test of the count ``key`` (:data:`_COUNT_RANGES`) and how an error words it."""
    low, high = _COUNT_RANGES.get(key, _COUNT_DEFAULT)
    return (lambda v: _is_count(v) and low <= v <= high), f"a whole number from {low} to {high:,}"


_KINDS: dict[str, tuple[Any, str]] = {
    **{key: _count_test(key) for key in _COUNTS},
    **{key: (lambda v: isinstance(v, str) and bool(v), "a non-empty string") for key in _TEXTS},
    **{key: (lambda v: isinstance(v, (bool, np.bool_)), "true or false") for key in _FLAGS},
    **{key: (lambda v: _is_number(v) and math.isfinite(v), "a number") for key in _NUMBERS},
}


def _whole_column_fine(column: pd.Series, key: str) -> bool:
    """Whether every value of ``column`` is of ``key``'s kind or absent, decided on the whole
    column at once where its dtype allows (a calibration holds tens of thousands of records;
    testing each value takes about a second); False means: test each value."""
    kind = column.dtype.kind
    if key in _FLAGS:
        return kind == "b"
    if key in _TEXTS:
        if pd.api.types.infer_dtype(column, skipna=True) not in ("string", "empty"):
            return False
        return bool((column.dropna().str.len() > 0).all())
    low, high = _COUNT_RANGES.get(key, _COUNT_DEFAULT)
    if kind in "iu":
        return key in _NUMBERS or bool(((column >= low) & (column <= high)).all())
    if kind != "f":
        return False
    values = column.to_numpy()
    values = values[~np.isnan(values)]
    if not np.isfinite(values).all():
        return False
    whole = (values >= low) & (values <= high) & (values == np.floor(values))
    return key in _NUMBERS or bool(whole.all())


def _check_vocabulary(frame: pd.DataFrame, where: str) -> None:
    """Each text field of :data:`_VOCABULARY` holds one of its benchmark's known values."""
    for (benchmark, key), known in _VOCABULARY.items():
        column = f"params.{key}"
        if column not in frame:
            continue
        wrong = (frame["benchmark"] == benchmark) & frame[column].notna()
        wrong &= ~frame[column].isin(known)
        if wrong.any():
            row = int(np.flatnonzero(wrong.to_numpy())[0])
            raise UserError(
                f"{_record(frame, row, where)}: '{column}' must be one of {', '.join(known)}, "
                f"got {frame[column].iloc[row]!r}; re-run the benchmark"
            )


def _check_units(frame: pd.DataFrame, where: str) -> None:
    """Each record's ``unit``, where it has one, is its benchmark's (:data:`_UNITS_OF`, else
    :data:`_UNITS`): a one-line :class:`UserError` for the first that is not."""
    if "unit" not in frame:
        return
    known = frame["benchmark"].map(lambda b: _UNITS_OF.get(b, _UNITS))
    wrong = [not _absent(u) and u not in k for u, k in zip(frame["unit"], known, strict=True)]
    if any(wrong):
        row = wrong.index(True)
        units = " or ".join(map(repr, known.iloc[row]))
        raise UserError(
            f"{_record(frame, row, where)}: 'unit' must be {units} (samples in seconds), got "
            f"{frame['unit'].iloc[row]!r}; re-run the benchmark"
        )


def _check_params(frame: pd.DataFrame, where: str) -> None:
    """Each ``params`` field of :data:`_KINDS` that a record holds is of its kind; a one-line
    :class:`UserError` for the first record whose field is not."""
    for key, (test, kind) in _KINDS.items():
        column = f"params.{key}"
        if column not in frame or _whole_column_fine(frame[column], key):
            continue
        wrong = ~frame[column].map(lambda v, test=test: _absent(v) or test(v)).astype(bool)
        if wrong.any():
            row = int(np.flatnonzero(wrong.to_numpy())[0])
            value = frame[column].iloc[row]
            value = value.item() if isinstance(value, np.generic) else value
            raise UserError(
                f"{_record(frame, row, where)}: '{column}' must be {kind}, got {value!r}; "
                "re-run the benchmark"
            )


def _all_times(samples: pd.Series, limits: pd.Series) -> bool:
    """The quick check of every sample at once: all lists of finite numbers from 0 to their
    record's limit (numpy would read the string "1" as a number, and a bool as one)."""
    if not samples.map(lambda v: isinstance(v, list) and len(v) > 0).all():
        return False
    if not all(type(v) in (float, int) for v in itertools.chain.from_iterable(samples)):
        return False
    flat = np.fromiter(itertools.chain.from_iterable(samples), dtype=float)
    limit = np.repeat(limits.to_numpy(dtype=float), samples.map(len).to_numpy())
    return bool(np.all(np.isfinite(flat)) and np.all(flat >= 0) and np.all(flat <= limit))


def check_one_machine(frame: pd.DataFrame, where: str) -> None:
    """The records of ``frame`` come from one kind of machine (:data:`MACHINE_IDENTITY`); a
    one-line :class:`UserError` naming two files that disagree."""
    for key in MACHINE_IDENTITY:
        if key not in frame or "source" not in frame:
            continue
        per_file = frame[["source", key]].dropna().drop_duplicates()
        values = per_file[key].astype(str).unique()
        if len(values) > 1:
            first = per_file[per_file[key].astype(str) == values[0]]["source"].iloc[0]
            other = per_file[per_file[key].astype(str) == values[1]]["source"].iloc[0]
            raise UserError(
                f"{where}: records of two machines ({key[8:]} {values[0]!r} in {first}, "
                f"{values[1]!r} in {other}); calibrate each machine's records on their own"
            )


def check_sweeps_ended(files: Sequence[Path], root: Path) -> None:
    """Every benchmark run that marked its start in one of ``files`` (records files under
    ``root``) marked its end after it (:func:`microbench.records.stopped_sweep_points`); a
    one-line :class:`UserError` naming the file and how many points the stopped run reached.
    Files without marks (training runs, records from before the marks) are not checked."""
    for path in files:
        reached = stopped_sweep_points(path)
        if reached is not None:
            command = read_records(path)[0].get("run", {}).get("command") or "benchmark"
            raise UserError(
                f"{root}/{path.relative_to(root).as_posix()}: its benchmark run stopped after "
                f"{reached:,} points, before its end, and what it did not reach would be "
                f"priced from what it did; run {command} again into that folder with "
                "--append, or pdlsim bench into a new directory"
            )


def check_no_copies(files: Sequence[Path], root: Path) -> None:
    """No two of one run's records ``files`` hold the same bytes: a copy left beside its
    original ("compute (copy).jsonl") would count each of its samples twice, and the fits'
    intervals be narrower than the measurements allow. Each header carries its own creation
    time, so no two benchmark runs write the same file."""
    seen: dict[str, Path] = {}
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest in seen:
            raise UserError(
                f"{root}: {path.relative_to(root)} holds the same records as "
                f"{seen[digest].relative_to(root)} (a copy?), which would count each of their "
                "samples twice; move one of them out of the run"
            )  # fmt: skip
        seen[digest] = path
