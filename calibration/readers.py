"""Readers: a records DataFrame (:func:`microbench.records.load_dataframe`) -> one tidy frame of
measured points per benchmark, every raw sample kept.

One reader per benchmark, as Extra-P has one per input format; each picks the "measurement"
records of its benchmark and returns one row per measured point with ``median_s``,
``n_samples`` and ``samples`` (a float64 array of the raw samples). When several records hold
the same point (runs appended to one directory), their samples are pooled: they measure the
same quantity, and the bootstrap then sees all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError

__all__ = ["collective_points", "copy_points", "is_points_frame"]

POINT_COLUMNS = ("median_s", "n_samples", "samples")


def is_points_frame(df: pd.DataFrame) -> bool:
    """True for a frame this module made (rather than raw records)."""
    return all(c in df.columns for c in POINT_COLUMNS)


def _measurements(df: pd.DataFrame, benchmark: str, needed: Sequence[str], hint: str) -> Any:
    """The "measurement" rows of ``benchmark``; UserError when there are none."""
    if "benchmark" not in df.columns:
        rows = df.iloc[0:0]
    else:
        rows = df[df["benchmark"] == benchmark]
        if "type" in rows.columns:
            rows = rows[rows["type"] == "measurement"]
    if rows.empty:
        raise UserError(f"no {benchmark!r} measurements in these records ({hint})")
    missing = [c for c in needed if c not in rows.columns]
    if missing:
        raise UserError(f"{benchmark!r} records lack the fields {', '.join(missing)}")
    for column in needed:  # present in some records, left out (or null) in another
        lacking = rows[column].isna()
        if lacking.any():
            source = rows["source"][lacking].iloc[0] if "source" in rows.columns else "records"
            raise UserError(
                f"{benchmark!r} records lack {column} in {source} ({int(lacking.sum())} of "
                f"{len(rows)}); re-run the benchmark"
            )
    return rows


def _pool(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per distinct ``keys``: samples concatenated, median and count recomputed."""
    out = []
    for key, group in rows.groupby(keys, sort=True, dropna=False):
        samples = np.concatenate([np.asarray(s, dtype=float).ravel() for s in group["samples"]])
        if samples.size == 0 or not np.all(np.isfinite(samples)):
            raise UserError(f"a point {dict(zip(keys, key, strict=True))} has no finite samples")
        row = dict(zip(keys, key, strict=True))
        row.update(
            median_s=float(np.median(samples)),
            n_samples=int(samples.size),
            samples=samples,
            sources=",".join(sorted({str(s) for s in group.get("source", [])})),
        )
        out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------- collectives


def collective_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, ranks, ranks_per_node, bytes) of ``python -m microbench collectives``.

    Columns: ``op``, ``ranks``, ``ranks_per_node``, ``bytes`` (the op's ``bytes`` as
    microbench defines it: each rank's block for allgather and reduce_scatter), ``total_bytes``,
    ``oversubscribed`` (more ranks on a node than the cores its metadata says it has: the
    timings then show time-sharing of cores, not communication), ``median_s``, ``n_samples``,
    ``samples``, ``sources``. A record without ``ranks_per_node`` is taken as one node
    (``ranks_per_node = ranks``). Sorted by op, ranks, bytes.
    """
    if is_points_frame(df):
        return df
    rows = _measurements(
        df,
        "collectives",
        ("params.op", "params.bytes", "params.ranks", "samples"),
        "run `python -m microbench collectives` under mpiexec, or `pdlsim bench`",
    )
    frame = pd.DataFrame(
        {
            "op": rows["params.op"].astype(str),
            "ranks": rows["params.ranks"].astype(int),
            "bytes": rows["params.bytes"].astype(int),
            "samples": rows["samples"],
            "source": rows["source"] if "source" in rows.columns else "",
        }
    )
    per_node = rows.get("params.ranks_per_node")
    if per_node is None:
        per_node = pd.Series(np.nan, index=rows.index)
    per_node = pd.to_numeric(per_node, errors="coerce")
    frame["ranks_per_node"] = per_node.fillna(frame["ranks"]).astype(int)
    total = rows.get("params.total_bytes")
    frame["total_bytes"] = frame["bytes"] if total is None else total.fillna(frame["bytes"])
    frame["oversubscribed"] = frame["ranks_per_node"] > _cores(rows)
    keys = ["op", "ranks", "ranks_per_node", "bytes", "total_bytes", "oversubscribed"]
    points = _pool(frame, keys)
    points["total_bytes"] = points["total_bytes"].astype(int)
    points["oversubscribed"] = points["oversubscribed"].astype(bool)
    columns = [*keys, *POINT_COLUMNS, "sources"]
    return points[columns].sort_values(["op", "ranks", "bytes"], ignore_index=True)


def _cores(rows: pd.DataFrame) -> pd.Series:
    """Cores a node offers its ranks, from the machine metadata (inf when unknown)."""
    cores = pd.Series(np.inf, index=rows.index)
    for column in ("machine.logical_cores", "machine.cores_available"):  # the latter wins
        if column in rows.columns:
            known = pd.to_numeric(rows[column], errors="coerce")
            cores = known.where(known > 0, cores)
    return cores


# ---------------------------------------------------------------------------- host <-> device


def copy_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (direction, pinned, bytes) of ``python -m microbench copies``.

    Columns: ``direction`` ("h2d"/"d2h"), ``pinned`` (bool), ``bytes``, ``median_s``,
    ``n_samples``, ``samples``, ``sources``. Copies of several GPUs are pooled (calibration
    models one kind of device).
    """
    if is_points_frame(df):
        return df
    rows = _measurements(
        df,
        "copies",
        ("params.direction", "params.pinned", "params.bytes", "samples"),
        "run `python -m microbench copies` on a machine with a GPU",
    )
    frame = pd.DataFrame(
        {
            "direction": rows["params.direction"].astype(str),
            "pinned": rows["params.pinned"].astype(bool),
            "bytes": rows["params.bytes"].astype(int),
            "samples": rows["samples"],
            "source": rows["source"] if "source" in rows.columns else "",
        }
    )
    points = _pool(frame, ["direction", "pinned", "bytes"])
    points["pinned"] = points["pinned"].astype(bool)
    columns = ["direction", "pinned", "bytes", *POINT_COLUMNS, "sources"]
    return points[columns].sort_values(["direction", "pinned", "bytes"], ignore_index=True)
