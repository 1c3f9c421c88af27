"""Synthetic communication measurements with known parameters, for the calibration tests.

Each point's raw samples are the true time times lognormal noise, so its median scatters
around the truth as a real measurement's does; records go through the real writer and loader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe

SIZES = tuple(int(s) for s in 2 ** np.arange(3, 27))  # 8 B .. 64 MiB


def noisy_samples(true_s: float, rng: np.random.Generator, noise: float, count: int) -> np.ndarray:
    return true_s * rng.lognormal(0.0, noise, count)


def points_frame(
    op: str,
    groups: Iterable[tuple[int, int]],
    truth: Callable[[int, int, np.ndarray], np.ndarray],
    sizes: Iterable[int] = SIZES,
    seed: int = 0,
    noise: float = 0.03,
    count: int = 20,
) -> pd.DataFrame:
    """A :func:`calibration.readers.collective_points`-shaped frame.

    ``groups``: ``(ranks, ranks_per_node)`` pairs; ``truth(p, q, sizes)`` -> seconds.
    """
    rng = np.random.default_rng(seed)
    sizes = np.asarray(list(sizes), dtype=float)
    rows = []
    for p, q in groups:
        for n, t in zip(sizes, truth(p, q, sizes), strict=True):
            samples = noisy_samples(float(t), rng, noise, count)
            rows.append(
                {
                    "op": op,
                    "ranks": p,
                    "ranks_per_node": q,
                    "bytes": int(n),
                    "total_bytes": int(n) * (p if op in ("allgather", "reduce_scatter") else 1),
                    "median_s": float(np.median(samples)),
                    "n_samples": count,
                    "samples": samples,
                    "sources": "synthetic",
                }
            )
    return pd.DataFrame(rows)


def write_records(
    path: Path, benchmark: str, points: pd.DataFrame, params_of, machine: dict | None = None
) -> pd.DataFrame:
    """Write one "measurement" record per row through the real writer; load them back."""
    writer = RecordWriter(path, machine or {"hostname": "synthetic"}, {"command": "test"})
    for row in points.itertuples(index=False):
        params = params_of(row)
        name = params.pop("name")
        writer.write(Measurement(row.samples, benchmark, name, params).to_record())
    writer.close()
    return load_dataframe(path)


def collective_params(row) -> dict:
    return {
        "name": row.op,
        "op": row.op,
        "bytes": row.bytes,
        "total_bytes": row.total_bytes,
        "ranks": row.ranks,
        "ranks_per_node": row.ranks_per_node,
        "algorithm": None,
    }
