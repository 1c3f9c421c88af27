"""The measured op table: every op, phase, batch and thread count that was timed, kept as data.

Calculon keeps efficiency-by-size tables in its system files; pdlsim keeps what was measured
the same way, so that an op that was measured is predicted by its own median, not by a curve
through it. Each entry holds the op's FLOPs and bytes (what the curve needs to extrapolate from
it) and the distribution-free 95% confidence interval of its median.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from microbench.measurement import Measurement

__all__ = ["NON_OP_PHASES", "OpTime", "inconsistent_steps", "op_class", "read_op_table"]

# Rows of the op table that are not one layer op: the whole step (forward + backward + update
# back to back), the forward-only step and the mini-batch gather before them. Curves and
# op-level scaling skip them.
NON_OP_PHASES = frozenset({"step", "inference", "data"})


def op_class(kind: str, phase: str) -> str:
    """The efficiency class of an op: its lead layer kind and phase, e.g. ``conv2d:forward``."""
    return f"{kind}:{phase}"


@dataclass(frozen=True)
class OpTime:
    """One measured op: median seconds with its confidence interval, and the raw samples."""

    device: str
    threads: int
    model: str
    op: str
    phase: str
    kind: str
    batch: int
    flops: float
    bytes: float
    time_s: float
    low_s: float
    high_s: float
    samples: tuple[float, ...] = ()

    @property
    def op_class(self) -> str:
        return op_class(self.kind, self.phase)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("samples")
        low, high = out.pop("low_s"), out.pop("high_s")
        out["time_s_interval"] = {"low": low, "high": high, "confidence": 0.95}
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> OpTime:
        interval = doc["time_s_interval"]
        return cls(
            str(doc["device"]),
            int(doc["threads"]),
            str(doc["model"]),
            str(doc["op"]),
            str(doc["phase"]),
            str(doc["kind"]),
            int(doc["batch"]),
            float(doc["flops"]),
            float(doc["bytes"]),
            float(doc["time_s"]),
            float(interval["low"]),
            float(interval["high"]),
        )


def _param(row: pd.Series, name: str, default: Any) -> Any:
    value = row.get(f"params.{name}", default)
    return default if value is None or (isinstance(value, float) and np.isnan(value)) else value


def read_op_table(rows: pd.DataFrame) -> list[OpTime]:
    """Entries from "compute" records named "op" (a DataFrame from ``load_dataframe``)."""
    table = []
    for _, row in rows.iterrows():
        m = Measurement(row["samples"])
        ci = m.median_ci()
        table.append(
            OpTime(
                device=str(_param(row, "device", "cpu")),
                threads=int(_param(row, "threads", 1)),
                model=str(_param(row, "model", "")),
                op=str(_param(row, "op", "")),
                phase=str(_param(row, "phase", "")),
                kind=str(_param(row, "kind", _param(row, "op", ""))),
                batch=int(_param(row, "batch", 1)),
                flops=float(_param(row, "flops", 0.0)),
                bytes=float(_param(row, "bytes", 0.0)),
                time_s=m.median,
                low_s=min(ci.low, m.median),
                high_s=max(ci.high, m.median),
                samples=tuple(m.samples.tolist()),
            )
        )
    return table


def inconsistent_steps(table: list[OpTime], low: float = 0.5, high: float = 2.0) -> list[str]:
    """One line per whole-step row whose time is outside [low, high] x the sum of its measured
    ops (same model, batch, threads, device): a step or an op timed while something else ran
    (on a shared machine, another job; with threads, one spinning BLAS pool). The whole-step
    correction of the simulator trusts those rows, so calibration says which look wrong."""
    ops: dict[tuple[str, str, int, int], float] = {}
    for e in table:
        if e.phase not in NON_OP_PHASES:
            key = (e.device, e.model, e.batch, e.threads)
            ops[key] = ops.get(key, 0.0) + e.time_s
    lines = []
    for e in table:
        total = ops.get((e.device, e.model, e.batch, e.threads))
        if e.phase != "step" or not total:
            continue
        ratio = e.time_s / total
        if not low <= ratio <= high:
            lines.append(
                f"the {e.model} step at batch {e.batch}, {e.threads} thread(s) on the {e.device} "
                f"took {ratio:.1f}x the sum of its ops ({e.time_s * 1e3:.3g} ms against "
                f"{total * 1e3:.3g} ms): was the machine busy? calibrate again when it is quiet"
            )
    return lines
