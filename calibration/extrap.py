"""Export the communication measurements for Extra-P, to cross-check our fits with it.

Extra-P (https://github.com/extra-p/extrap) reads JSON Lines: one JSON object per line, one
measured value each, as its file-format documentation specifies (``docs/file-formats.md``,
section "JSON Lines format"; reader ``extrap/fileio/file_reader/jsonlines_file_reader.py``)::

    {"params": {"p": 4, "n": 65536}, "metric": "time", "callpath": "allreduce", "value": 2.3e-05}

``params`` (required) maps each parameter to its value; Extra-P takes the parameter list and its
order from the first line, so every line carries the same keys in the same order. ``value``
(required) is one number (a list is allowed too; we write one raw sample per line, so Extra-P
sees every repetition). ``callpath`` and ``metric`` are optional; we set the collective's name
and "time" (seconds). Our parameters: ``p`` = ranks, ``n`` = microbench's ``bytes`` (each rank's
block for allgather and reduce_scatter).

Extra-P's experiment validation (``extrap/fileio/io_helper.py``, ``validate_experiment``) wants
every callpath measured at every coordinate, so only the (p, n) points that all exported
collectives share are written, with a warning naming how many were left out; the barrier, which
has no message size, is left out unless asked for. Open the file with ``extrap --jsonlines``
(or File > Open in the GUI).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from microbench.fileio import atomic_write_text

from .readers import collective_points
from .stats import FitError

__all__ = ["PARAMETERS", "export_extrap"]

PARAMETERS = ("p", "n")
METRIC = "time"


def export_extrap(
    df: pd.DataFrame, path: str | os.PathLike[str], ops: Iterable[str] | None = None
) -> int:
    """Write the collectives of ``df`` (records or collective points) as Extra-P JSON Lines.

    ``ops``: the collectives to export (default: all measured but the barrier). Returns the
    number of lines written.
    """
    points = collective_points(df)
    present = list(dict.fromkeys(points["op"]))
    chosen = [op for op in present if op != "barrier"] if ops is None else list(ops)
    missing = [op for op in chosen if op not in present]
    if missing or not chosen:
        raise FitError(f"Extra-P export: no measurements of {', '.join(missing) or 'any op'}")
    points = points[points["op"].isin(chosen)]
    grids = [set(zip(g["ranks"], g["bytes"], strict=True)) for _, g in points.groupby("op")]
    common = set.intersection(*grids)
    if not common:
        raise FitError("Extra-P export: the collectives share no (ranks, bytes) point")
    keep = [(r, b) in common for r, b in zip(points["ranks"], points["bytes"], strict=True)]
    dropped = len(points) - sum(keep)
    if dropped:
        warnings.warn(
            f"Extra-P export: left out {dropped} points that not every collective has "
            "(Extra-P needs each callpath at every coordinate)",
            stacklevel=2,
        )
    lines = []
    for row in points[keep].itertuples(index=False):
        params = {"p": int(row.ranks), "n": int(row.bytes)}
        for value in row.samples:
            record = {"params": params, "metric": METRIC, "callpath": row.op, "value": float(value)}
            lines.append(json.dumps(record, allow_nan=False))
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return len(lines)
