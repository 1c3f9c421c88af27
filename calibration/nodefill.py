"""The node-fill slowdown: how much slower one core's work runs with k cores of its node busy.

From the records of ``microbench nodefill`` (:mod:`microbench.nodefill`): for each kernel
(GEMM, stream, small calls), process count k and launch, the median over processes of each
process's median call time; over launches, their median (which cores a launch lands on is the
scheduler's draw); over k = 1, the kernel's slowdown ``s_kernel(k)``. The node's slowdown is
their geometric mean,

    S(k) = (s_gemm(k) * s_stream(k) * s_calls(k)) ** (1/3),

with the kernels' range ``[min, max]`` as its interval: a training step is some mix of the
three kinds of work, so its own slowdown lies between theirs, and where it lies within that
range is the part this benchmark cannot say. Between measured k, :meth:`NodeFill.slowdown`
interpolates in log k; above the largest, it holds the largest.

:class:`calibration.colocation.ColocationModel` carries its measured co-location factor from
the largest ranks per node the jitter benchmark ran to more by ``S(R) / S(R_max)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError

__all__ = ["NodeFill", "fit_node_fill"]

_PARAMS = ("params.kernel", "params.procs", "params.launch", "params.process")


@dataclass(frozen=True)
class NodeFill:
    """``levels`` (process counts) and, per level, the node's slowdown and its kernels' range;
    ``kernels``: each kernel's slowdown per level."""

    levels: tuple[int, ...]
    slowdowns: tuple[float, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]
    kernels: dict[str, tuple[float, ...]]

    def slowdown(self, k: int) -> tuple[float, float, float]:
        """``(S, low, high)`` at ``k`` busy cores: 1 at one core or fewer, interpolated in log k
        between measured levels, the largest level's above it."""
        if k <= 1:
            return 1.0, 1.0, 1.0
        x = np.log(np.asarray(self.levels, dtype=float))
        at = np.log(min(float(k), float(self.levels[-1])))
        return tuple(  # type: ignore[return-value]
            float(np.interp(at, x, np.asarray(v, dtype=float)))
            for v in (self.slowdowns, self.lows, self.highs)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": list(self.levels),
            "slowdown": list(self.slowdowns),
            "interval": {
                "low": list(self.lows),
                "high": list(self.highs),
                "of": "the kernels' range",
            },
            "kernels": {name: list(v) for name, v in self.kernels.items()},
            "law": "S(k) = geometric mean of the kernels' median slowdowns at k busy cores "
            "over one; log-k interpolation, held above the largest k",
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> NodeFill:
        return cls(
            tuple(int(v) for v in doc["levels"]),
            tuple(float(v) for v in doc["slowdown"]),
            tuple(float(v) for v in doc["interval"]["low"]),
            tuple(float(v) for v in doc["interval"]["high"]),
            {name: tuple(float(x) for x in v) for name, v in doc["kernels"].items()},
        )


def fit_node_fill(df: pd.DataFrame) -> NodeFill | None:
    """The node-fill slowdowns of the "nodefill" records in ``df``; None without them or
    without a one-process level to measure against."""
    rows = df[(df["type"] == "measurement") & (df["benchmark"] == "nodefill")]
    if rows.empty:
        return None
    for column in _PARAMS:  # their kinds are checked where the records are read
        absent = rows[column].isna() if column in rows else pd.Series(True, index=rows.index)
        if absent.any():
            first = int(absent.to_numpy().argmax())
            where = f"in {rows['source'].iloc[first]} " if "source" in rows else ""
            raise UserError(f"a nodefill record {where}has no '{column}'; re-run "
                            "'python -m microbench nodefill'")  # fmt: skip
    medians = rows.assign(
        median=[float(np.median(s)) for s in rows["samples"]],
        **{"params.procs": rows["params.procs"].astype(int)},
    )
    per_launch = medians.groupby(list(_PARAMS[:3]))["median"].median()  # over processes
    typical = per_launch.groupby(level=[0, 1]).median()  # over launches
    kernels: dict[str, tuple[float, ...]] = {}
    levels = sorted({int(k) for k in typical.index.get_level_values(1)})
    if levels[0] != 1 or len(levels) < 2:
        return None
    for kernel in sorted({str(n) for n in typical.index.get_level_values(0)}):
        times = typical.xs(kernel, level=0)
        if any(k not in times.index for k in levels):
            return None
        kernels[kernel] = tuple(float(times[k] / times[1]) for k in levels)
    table = np.array(list(kernels.values()))  # kernels x levels
    return NodeFill(
        tuple(levels),
        tuple(float(v) for v in np.exp(np.log(table).mean(axis=0))),
        tuple(float(v) for v in table.min(axis=0)),
        tuple(float(v) for v in table.max(axis=0)),
        kernels,
    )
