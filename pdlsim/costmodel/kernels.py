"""A CPU rank's compute, priced call by call from the machine's kernel model.

A step of a workload is the kernel calls :func:`microbench.kernels.calls.step_calls` lists;
:class:`KernelCompute` prices each from the profile's kernel tables
(:class:`calibration.kernels.KernelModel`) and charges it to the layer and phase the simulator
asks about (``compute_time(layer, phase, ...)``):

* a call of a layer's forward or backward to that layer (a fused relu or max-pool is its lead
  layer's), the loss to the loss layer's forward, the mini-batch gather to the first layer's
  forward (what a training loop does before it), the one SGD update over all parameters to
  each layer with parameters in proportion to its parameter count;
* with the **interplay** term, each call takes its table time (a kernel alone) times the
  factor by which kernels run slower inside a step, measured at the thread count;
* with the **glue** term, each op call pays the Python between kernels, and the step its own.

Both come from the step benchmark (:mod:`calibration.step_terms`). The prediction band draws
the model's own error (:meth:`KernelCompute.drawn`): the whole step moves by one normal draw of
the step terms' sigma at the step's glue share (:meth:`calibration.step_terms.StepTerms.sigma`:
the spreads of the benchmark's networks each predicted as a workload never seen is, tables
priced, step terms fitted without it), at the thread count, widened by
the error of the tables' law beyond their grids for the calls priced there
(:meth:`calibration.kernels.KernelModel.beyond_sigma`, weighted by each call's share of the
step's table time: one law, so the calls' errors add up rather than average out). A step
inside every table's grid keeps the step terms' sigma; one far beyond gets a band that says so.

The interplay and the glue are :data:`TERMS`, switchable; nothing here is fitted to any step
of any workload, so a workload, batch or thread count never measured is priced like one that
was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from calibration.kernels import KernelModel
from microbench.kernels.calls import KernelCall, op_calls, step_calls
from microbench.workload import LayerInfo, Workload, sliced_dense

__all__ = ["TERMS", "KernelCompute", "sliced_layers"]

TERMS = ("glue", "interplay")  # the kernel model's switchable terms


def sliced_layers(workload: Workload, ranks: int) -> tuple[LayerInfo, ...]:
    """The layers one rank computes in a layer-wise split over ``ranks``: every dense layer
    cut to the busiest rank's ``ceil(units / ranks)`` output neurons, the rest whole."""
    if ranks <= 1:
        return workload.layers
    return tuple(
        sliced_dense(info, math.ceil(info.output_shape[0] / ranks))
        if info.kind == "dense"
        else info
        for info in workload.layers
    )


@dataclass(frozen=True, eq=False)
class KernelCompute:
    """Per-layer compute seconds of one CPU rank from ``model`` (module docstring); ``terms``
    the terms switched on."""

    model: KernelModel
    terms: frozenset[str] = frozenset(TERMS)
    z: float = 0.0  # the band's draw of the model's error, in sigmas
    optimizer: str = "sgd"  # the update's kernel: sgd, momentum (a velocity), adam or adamw
    _cache: dict[tuple, dict[tuple[int, str], float]] = field(default_factory=dict, repr=False)
    # each step's calls, their table seconds and its log sigma beyond the tables' grids,
    # shared by every draw (they move none of them)
    _prices: dict[tuple, tuple[list, list[float], float]] = field(default_factory=dict, repr=False)
    # a small number for each layer sequence asked about (by identity; equal shapes, equal
    # numbers): the simulator asks once per layer and phase, and a key holding the shapes
    # themselves would be built and hashed over every layer each time (quadratic in depth)
    _shapes: dict[int, tuple[Sequence[LayerInfo], int]] = field(default_factory=dict, repr=False)
    _numbers: dict[tuple, int] = field(default_factory=dict, repr=False)

    def drawn(self, rng: Any, stratum: tuple[int, int] | None = None) -> KernelCompute:
        """This model with one draw of its error (module docstring).

        ``stratum`` (i, K): a Latin hypercube over the K samples of a band, the draw from
        stratum ``perm(i)`` of a permutation fixed by K (independent of the machine's drift,
        drawn from stratum i), so that K draws cover the error evenly: a plain draw's median
        over K samples moves by about 1.25 sigma / sqrt(K) from one seed to the next, and the
        band's P50 is then the typical step, not a noisy sample of it."""
        if stratum is None:
            z = float(rng.standard_normal())
        else:
            i, k = stratum
            j = int(np.random.default_rng(k).permutation(k)[i])
            z = float(special.ndtri((j + rng.random()) / k))
        return KernelCompute(
            self.model, self.terms, z, self.optimizer,
            _prices=self._prices, _shapes=self._shapes, _numbers=self._numbers,
        )  # fmt: skip

    def _sigma(self, calls: Sequence[Any], seconds: Sequence[float], sigma: float) -> float:
        """The step's log sigma: the step terms' own; for a profile from before the step
        benchmark, its GEMM and loop tables' neighbour spreads weighted by the step's shares of
        each family (the spread of the per-family draws that profile's band was made of)."""
        spread = self.model.legacy_spread_
        if not spread or not sum(seconds):
            return sigma
        gemm = sum(t for c, t in zip(calls, seconds, strict=True) if c.kernel.startswith("gemm_"))
        share = gemm / sum(seconds)
        return math.hypot(share * spread.get("gemm", 0.0), (1 - share) * spread.get("loops", 0.0))

    def __post_init__(self) -> None:
        unknown = set(self.terms) - set(TERMS)
        if unknown:
            raise ValueError(f"unknown kernel-model terms {sorted(unknown)}; known: {TERMS}")

    def step_table(
        self,
        workload: Workload,
        layers: Sequence[LayerInfo],
        batch: int,
        threads: int,
        training: bool = True,
    ) -> dict[tuple[int, str], float]:
        """Seconds per (layer index, phase) of one step of ``workload`` computing ``layers``
        (its own, or a rank's slices), at ``batch`` and ``threads``."""
        known = self._shapes.get(id(layers))
        if known is None or known[0] is not layers:
            shapes = tuple((x.index, x.kind, x.input_shape, x.output_shape) for x in layers)
            number = self._numbers.setdefault(shapes, len(self._numbers))
            known = self._shapes[id(layers)] = (layers, number)
        step = (workload.name, workload.input_shape, known[1], batch, threads, training)
        key = (*step, self.z)
        if key in self._cache:
            return self._cache[key]
        if step not in self._prices:
            calls = step_calls(
                workload, batch, threads, training, layers=layers, optimizer=self.optimizer
            )
            seconds = [self.model.call_s(c, threads) for c in calls]
            beyond = [self.model.beyond_sigma(c, threads) for c in calls]
            share = float(np.dot(seconds, beyond) / sum(seconds)) if sum(seconds) else 0.0
            self._prices[step] = (calls, seconds, share)
        calls, alone, beyond_sigma = self._prices[step]
        terms = self.model.step_terms(threads)
        ops = op_calls(workload, training, layers)
        own = self._sigma(calls, alone, terms.sigma(sum(alone), len(ops)))
        sigma = math.hypot(own, beyond_sigma)
        error = float(np.exp(self.z * sigma))
        inside = error * (terms.factor if "interplay" in self.terms else 1.0)
        seconds = [t * inside for t in alone]
        first = min(info.index for info in layers if info.kind != "flatten")
        loss = layers[-1].index
        parametric = [info for info in layers if info.param_count > 0]
        params = sum(info.param_count for info in parametric)
        table: dict[tuple[int, str], float] = {}

        def charge(layer: int, phase: str, s: float) -> None:
            if phase == "update":
                for info in parametric:
                    slot = (info.index, "update")
                    table[slot] = table.get(slot, 0.0) + s * info.param_count / params
                return
            slot = {"data": (first, "forward"), "loss": (loss, "forward")}.get(
                phase, (layer, phase)
            )
            table[slot] = table.get(slot, 0.0) + s

        for call, s in zip(calls, seconds, strict=True):
            charge(call.layer, call.phase, s)
        if "glue" in self.terms:
            for layer, phase in ops:
                charge(layer, phase, terms.per_op_s * error)
            charge(loss, "loss", terms.per_step_s * error)
        self._cache[key] = table
        return table

    def copy_s(self, rows: int, run: int, threads: int) -> float:
        """Seconds of one copy of ``rows`` runs of ``run`` floats into a slice of wider rows:
        the ``copy_runs`` table's price, moved by this draw of the kernels' error."""
        seconds = self.model.call_s(KernelCall("copy_runs", (rows, run), 0, "forward"), threads)
        return seconds * float(np.exp(self.z * self.model.step_terms(threads).sigma_kernels))

    def step_s(self, workload: Workload, batch: int, threads: int, training: bool = True) -> float:
        """One whole step's compute seconds (every layer and phase)."""
        return sum(self.step_table(workload, workload.layers, batch, threads, training).values())
