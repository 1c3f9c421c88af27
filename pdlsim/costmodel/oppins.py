"""Each layer's time pinned to the compute benchmark's measurement of its own op.

The roofline of an op class (``conv2d:forward``...) is fitted over every layer, batch and model
measured, so one op can sit far from it, by as much as a factor of two, and its forward and
backward need not sit on the same side. The whole-step correction
(:mod:`pdlsim.costmodel.stepscale`) brings the step's total back to the measured step but keeps the
roofline's split between forward and backward, which is what overlap, pipelines and forward-only
runs depend on: with that split wrong, a forward pass is predicted far off (evidence:
docs/evidence.md, "Compute").

So, for a workload the profile measured, each op of the compute benchmark's table (a layer, or
a layer with the relu and pooling fused into it: ``conv2d3+relu4+maxpool2d5``; ``loss``; the
whole ``update``) pins its layers: the layers' roofline times are multiplied by measured op /
the sum of their roofline times, interpolated linearly in log(batch) between measured batches
and held beyond them, at the thread count (else the nearest measured one below, else the
smallest), as the step rows are. Layers of an op the table lacks, other workloads and other
devices keep the roofline. The whole-step ratio then applies on top, to pinned ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from microbench.workload import LOSS_KINDS
from pdlsim.costmodel.stepscale import threads_row

__all__ = ["OpPins"]

Roofline = Callable[[str, str], float]  # (layer name, phase) -> roofline seconds


@dataclass(frozen=True)
class _Row:
    device: str
    model: str
    op: str
    phase: str  # the table's: forward, backward, loss, update
    threads: int
    batch: int
    time_s: float


@dataclass(frozen=True)
class OpPins:
    rows: tuple[_Row, ...] = ()

    @classmethod
    def from_table(cls, table: Iterable[Any]) -> OpPins:
        """From a compute model's op table (:class:`calibration.optable.OpTime` entries)."""
        rows = tuple(
            _Row(r.device, r.model, r.op, r.phase, int(r.threads), int(r.batch), float(r.time_s))
            for r in table
            if r.model and r.phase in ("forward", "backward", "loss", "update") and r.time_s > 0
        )
        return cls(rows)

    @cached_property
    def _ops(self) -> dict[tuple[str, str, str], dict[str, tuple[str, ...]]]:
        """Each (device, model, table phase)'s ops and their member layers, in table order."""
        index: dict[tuple[str, str, str], dict[str, tuple[str, ...]]] = {}
        for row in self.rows:
            ops = index.setdefault((row.device, row.model, row.phase), {})
            ops.setdefault(row.op, tuple(row.op.split("+")))
        return index

    def op_of(self, device: str, model: str | None, layer: str, kind: str, phase: str):
        """``(op, table phase, its layers)`` that measured ``layer``'s ``phase``; None if none."""
        if phase == "update":
            wanted, table_phase = None, "update"
        else:
            table_phase = "loss" if kind in LOSS_KINDS else phase
            wanted = layer
        for op, members in self._ops.get((device, model, table_phase), {}).items():
            if wanted is None or wanted in members:
                return op, table_phase, members
        return None

    def factor(
        self,
        device: str,
        model: str,
        op: str,
        table_phase: str,
        batch: int,
        threads: int,
        roofline_s: Callable[[int, int], float],
    ) -> float:
        """Measured op / its layers' roofline sum (``roofline_s(batch, threads)``), at
        ``batch`` and ``threads`` (module docstring)."""
        rows = [
            r
            for r in self.rows
            if (r.device, r.model, r.op, r.phase) == (device, model, op, table_phase)
        ]
        at = threads_row(sorted({r.threads for r in rows}), threads)
        rows = sorted((r for r in rows if r.threads == at), key=lambda r: r.batch)
        ratios = []
        for r in rows:
            predicted = roofline_s(r.batch, r.threads)
            ratios.append(r.time_s / predicted if predicted > 0 else 1.0)
        return float(np.interp(np.log(batch), np.log([r.batch for r in rows]), ratios))
