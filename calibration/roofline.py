"""The roofline with efficiency-by-size curves: time of one op from its FLOPs and bytes.

    t = max(f / (eff(f) * peak), b / (bw_eff * bw)) + overhead,  eff(f) = e_max f / (f + f_half)

``peak`` is the measured GEMM rate and ``bw`` the triad bandwidth: the machine's own roofs,
fixed, not fitted. What is fitted says how far real ops stay below them: ``e_max``, the best
fraction of GEMM peak a large op reaches; ``f_half``, the FLOPs at which it reaches half of that
(small kernels cannot fill the cores); ``bw_eff``, memory-bound ops' bandwidth over triad's
(above 1 when their operands live in cache, as small batches' do); ``overhead``, a fixed cost
per call (a call into numba, a kernel launch).

Kernels differ: a dense layer's GEMM reaches a far larger share of peak than an im2col
convolution or an exp-bound loss at the same FLOPs. So, as Calculon keeps efficiency tables per
operation, each op class (``"kind:phase"``, e.g. ``"conv2d:backward"``) gets its own curve
(e_max, f_half), while bw_eff and overhead, properties of the machine, are shared. A pooled
curve (one e_max and f_half over all ops, the shared parameters held) serves op classes never
measured. Note f / eff(f) = (f + f_half) / e_max: the compute branch is affine in f, so f_half
acts as that branch's fixed cost, told apart from ``overhead`` only by ops on the memory branch.

Fits are least squares on log time (relative error: microsecond and second ops count alike),
parameters in log space within wide bounds, from a few starting points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np
from scipy.optimize import least_squares

__all__ = ["SCALARS", "Roofline", "fit_roofline", "roofline_time"]

SCALARS = (
    "peak_flops_per_s",
    "bandwidth_bytes_per_s",
    "efficiency_max",
    "half_efficiency_flops",
    "bandwidth_efficiency",
    "overhead_s",
)
_LOG_EFF = (math.log(1e-5), math.log(1.5))  # an op may beat the GEMM reference somewhat
_LOG_BW_EFF = (math.log(1e-3), math.log(1e3))
_OVERHEAD_FRACTION = (1e-6, 1.0)  # of the fastest op; log time needs overhead > 0


def roofline_time(
    flops: Any,
    nbytes: Any,
    peak_flops_per_s: float,
    bandwidth_bytes_per_s: float,
    efficiency_max: Any,
    half_efficiency_flops: Any,
    bandwidth_efficiency: float,
    overhead_s: float,
) -> np.ndarray:
    """Seconds for ops of ``flops`` and ``nbytes`` (arrays broadcast, e_max and f_half too);
    an op without FLOPs pays no compute branch."""
    f = np.asarray(flops, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    compute = np.where(f > 0, (f + half_efficiency_flops) / (efficiency_max * peak_flops_per_s), 0)
    memory = b / (bandwidth_efficiency * bandwidth_bytes_per_s)
    return np.maximum(compute, memory) + overhead_s


@dataclass(frozen=True)
class Roofline:
    """Fitted roofline of one device at one thread count.

    ``classes``: op class -> ``(efficiency_max, half_efficiency_flops)``; an op of a class
    not listed uses the pooled ``efficiency_max`` and ``half_efficiency_flops``.
    """

    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    efficiency_max: float
    half_efficiency_flops: float
    bandwidth_efficiency: float
    overhead_s: float
    classes: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def curve(self, op_class: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(e_max, f_half) for each of ``size`` ops; ``op_class`` None, a label or one per op."""
        pooled = (self.efficiency_max, self.half_efficiency_flops)
        if op_class is None or isinstance(op_class, str):
            e, h = self.classes.get(op_class, pooled)
            return np.full(size, e), np.full(size, h)
        pairs = np.array([self.classes.get(c, pooled) for c in op_class], dtype=float)
        return pairs[:, 0], pairs[:, 1]

    def time_s(self, flops: Any, nbytes: Any, op_class: Any = None) -> np.ndarray:
        f = np.asarray(flops, dtype=float)
        e, h = self.curve(op_class, f.size)
        return roofline_time(
            f,
            nbytes,
            self.peak_flops_per_s,
            self.bandwidth_bytes_per_s,
            e.reshape(f.shape),
            h.reshape(f.shape),
            self.bandwidth_efficiency,
            self.overhead_s,
        )

    def efficiency(self, flops: Any, op_class: str | None = None) -> np.ndarray:
        """eff(f): the fraction of GEMM peak an op of ``flops`` reaches on the compute branch."""
        f = np.asarray(flops, dtype=float)
        e, h = self.classes.get(op_class, (self.efficiency_max, self.half_efficiency_flops))
        return e * f / (f + h)

    def vector(self) -> np.ndarray:
        """Every parameter as one vector (bootstrap rows): scalars, then (e, h) per class."""
        head = [getattr(self, k) for k in SCALARS]
        return np.array(head + [v for pair in self.classes.values() for v in pair], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: float(getattr(self, k)) for k in SCALARS}
        out["classes"] = {
            name: {"efficiency_max": float(e), "half_efficiency_flops": float(h)}
            for name, (e, h) in self.classes.items()
        }
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Roofline:
        classes = {
            name: (float(c["efficiency_max"]), float(c["half_efficiency_flops"]))
            for name, c in (doc.get("classes") or {}).items()
        }
        return cls(*(float(doc[k]) for k in SCALARS), classes)


def _least_squares(
    residuals: Any, jacobian: Any, starts: list[np.ndarray], lower: list, upper: list
) -> Any:
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)
    if len(starts) == 1 and callable(jacobian) and residuals(starts[0]).size >= len(lo):
        # A warm start (bootstrap and leave-out refits): Levenberg-Marquardt, several times
        # faster than the bounded trust region, on the parameters clipped to their bounds
        # (flat outside them), then back inside the bounds.
        def clipped_jacobian(x: np.ndarray) -> np.ndarray:
            inside = (x >= lo) & (x <= hi)
            return jacobian(np.clip(x, lo, hi)) * inside

        fit = least_squares(
            lambda x: residuals(np.clip(x, lo, hi)),
            np.clip(starts[0], lo, hi),
            clipped_jacobian,
            method="lm",
        )
        fit.x = np.clip(fit.x, lo, hi)
        return fit
    fits = [
        least_squares(residuals, np.clip(x0, lo, hi), jacobian, bounds=(lo, hi), x_scale="jac")
        for x0 in starts
    ]
    return min(fits, key=lambda r: r.cost)


def _log_time_model(
    f: np.ndarray,
    b: np.ndarray,
    t: np.ndarray,
    peak: float,
    bw: float,
    index: np.ndarray,
    k: int,
    t_min: float,
    shared: tuple[float, float] | None = None,
) -> tuple[Any, Any]:
    """Residuals log(t_pred) - log(t) and their analytic Jacobian, in the parameters
    x = [log e_max (k classes), log f_half (k), log bw_eff, overhead / t_min]; with ``shared``
    = (bw_eff, overhead) held, x = [log e_max, log f_half] only. ``index``: each op's class."""
    onehot = np.eye(k)[index]

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
        e, h = np.exp(x[:k])[index], np.exp(x[k : 2 * k])[index]
        if shared is not None:
            return e, h, *shared
        return e, h, math.exp(x[2 * k]), x[2 * k + 1] * t_min

    def branches(x: np.ndarray) -> tuple[np.ndarray, ...]:
        e, h, bw_eff, overhead = unpack(x)
        compute = np.where(f > 0, (f + h) / (e * peak), 0.0)
        memory = b / (bw_eff * bw)
        return e, h, compute, memory, np.maximum(compute, memory) + overhead

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(branches(x)[-1]) - np.log(t)

    def jacobian(x: np.ndarray) -> np.ndarray:
        """d log(t_pred) / dx: the branch that binds takes the derivative."""
        e, h, compute, memory, pred = branches(x)
        on_compute = (compute >= memory) & (f > 0)
        d_log_e = np.where(on_compute, -compute, 0.0)
        d_log_h = np.where(on_compute, h / (e * peak), 0.0)
        columns = [onehot * d_log_e[:, None], onehot * d_log_h[:, None]]
        if shared is None:
            columns += [np.where(on_compute, 0.0, -memory)[:, None], np.full((t.size, 1), t_min)]
        return np.hstack(columns) / pred[:, None]

    return residuals, jacobian


def fit_roofline(
    flops: Any,
    nbytes: Any,
    times: Any,
    peak_flops_per_s: float,
    bandwidth_bytes_per_s: float,
    classes: Any = None,
    start: Roofline | None = None,
) -> Roofline:
    """Fit the class curves, bw_eff and overhead to op ``times`` (seconds, > 0), then the pooled
    curve with bw_eff and overhead held. ``classes``: one label per op (None: one class, and
    the result lists none); a class whose ops have no FLOPs gets no curve. ``start``: a previous
    fit to start from (bootstrap refits), else a small grid of starting points.
    """
    f, b, t = (np.asarray(a, dtype=float) for a in (flops, nbytes, times))
    if t.size == 0 or np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("need positive, finite op times to fit a roofline")
    labels = np.array(["*"] * t.size if classes is None else list(classes), dtype=object)
    names = [c for c in dict.fromkeys(labels) if np.any(f[labels == c] > 0)] or ["*"]
    index = np.array([names.index(c) if c in names else 0 for c in labels])
    peak, bw, t_min, k = peak_flops_per_s, bandwidth_bytes_per_s, float(t.min()), len(names)
    log_half = (0.0, math.log(1e3 * max(float(f.max()), 1.0)))
    lower = [_LOG_EFF[0]] * k + [log_half[0]] * k + [_LOG_BW_EFF[0], _OVERHEAD_FRACTION[0]]
    upper = [_LOG_EFF[1]] * k + [log_half[1]] * k + [_LOG_BW_EFF[1], _OVERHEAD_FRACTION[1]]

    residuals, jacobian = _log_time_model(f, b, t, peak, bw, index, k, t_min)
    if start is not None:
        pooled = (start.efficiency_max, start.half_efficiency_flops)
        pairs = np.array([start.classes.get(c, pooled) for c in names], dtype=float)
        shared = [math.log(start.bandwidth_efficiency), start.overhead_s / t_min]
        starts = [np.log(np.maximum(pairs.T.ravel(), 1.0e-300)).tolist() + shared]
    else:
        rate = f / (t * peak)
        e0 = [math.log(float(np.clip(rate[index == i].max(), 1e-3, 1.0))) for i in range(k)]
        positive = f[f > 0]
        halves = np.quantile(positive, [0.1, 0.5]) if positive.size else np.array([1.0, 1e3])
        bw0 = float(np.clip((b / (t * bw)).max(), 1e-2, 1e2)) if b.max() > 0 else 1.0
        starts = [
            e0 + [math.log(max(h, 1.0))] * k + [math.log(w), o]
            for h, w, o in product(halves, {1.0, bw0}, (0.05, 0.5))
        ]
    best = _least_squares(residuals, jacobian, starts, lower, upper)
    e, h = np.exp(best.x[:k]), np.exp(best.x[k : 2 * k])
    bw_eff, overhead = math.exp(best.x[2 * k]), best.x[2 * k + 1] * t_min
    shared = (bw_eff, overhead)

    pooled_model = _log_time_model(f, b, t, peak, bw, np.zeros(t.size, int), 1, t_min, shared)
    x0 = [float(np.log(np.median(e[index]))), float(np.log(np.median(h[index])))]
    bounds = [_LOG_EFF[0], log_half[0]], [_LOG_EFF[1], log_half[1]]
    pooled = _least_squares(*pooled_model, [np.array(x0)], *bounds)
    pairs = [(float(a), float(c)) for a, c in zip(e, h, strict=True)]
    by_class = {} if classes is None else dict(zip(names, pairs, strict=True))
    e_pool, h_pool = np.exp(pooled.x)
    return Roofline(peak, bw, float(e_pool), float(h_pool), bw_eff, float(overhead), by_class)
