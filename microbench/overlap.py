"""The pieces of the interference benchmark: IMB-NBC's overlap, what runs at once (a calibrated
GEMM loop, a communication thread) and the result of one point (:class:`Point`).

:class:`GemmLoop` is the computation: float32 GEMMs on small resident matrices, which numpy's
BLAS runs with the GIL released (so a Python communication thread really runs beside it) and
which repeat exactly. :class:`CommThread` is the data-parallel frameworks' pattern: a thread,
started once, that runs a blocking call each time the main thread asks and times it itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .measurement import Measurement
from .sampling import SamplingPolicy, measure, timed

__all__ = ["GEMM_N", "CommThread", "GemmLoop", "Point", "calibrate_gemm_loop", "overlap_pct"]

GEMM_N = 256  # 3 x 256 KiB: cache-resident, compute-bound, a fraction of a millisecond per GEMM
_CALIBRATION_GEMMS = 15

Clock = Callable[[], float]


@dataclass(frozen=True, eq=False)
class GemmLoop:
    """``reps`` products of two n x n float32 matrices into a preallocated result."""

    n: int
    reps: int
    gemm_s: float  # seconds per GEMM found by the calibration (max over ranks)
    a: np.ndarray = field(repr=False)
    b: np.ndarray = field(repr=False)
    c: np.ndarray = field(repr=False)

    def __call__(self) -> None:
        a, b, c = self.a, self.b, self.c
        for _ in range(self.reps):
            np.matmul(a, b, out=c)

    def describe(self) -> dict[str, Any]:
        return {
            "kernel": "gemm_float32",
            "gemm_n": self.n,
            "gemm_reps": self.reps,
            "gemm_s": self.gemm_s,
        }


def calibrate_gemm_loop(
    target_s: float, comm: Any = None, n: int = GEMM_N, *, clock: Clock = time.perf_counter
) -> GemmLoop:
    """A GEMM loop of about ``target_s`` seconds on the slowest rank; collective over ``comm``.

    All ranks time single GEMMs at the same time (so that the calibration sees the cores shared
    as the benchmark will), and the seconds per GEMM are the median over samples of the max
    over ranks (:func:`microbench.sampling.measure`), so every rank runs the same loop.
    """
    if not target_s > 0:
        raise ValueError(f"target must be > 0 s, got {target_s}")
    rng = np.random.default_rng(0)
    a, b = (rng.random((n, n), dtype=np.float32) for _ in range(2))
    c = np.empty((n, n), dtype=np.float32)
    one = GemmLoop(n, 1, 0.0, a, b, c)
    policy = SamplingPolicy(
        warmup=3, min_samples=_CALIBRATION_GEMMS, max_samples=_CALIBRATION_GEMMS
    )
    gemm_s = measure(timed(one, clock), policy, comm, clock=clock).median
    return GemmLoop(n, max(1, round(target_s / gemm_s)), gemm_s, a, b, c)


class CommThread:
    """A thread that runs ``call`` each time it is started and times it with its own clock.

    ``start()`` wakes it; ``wait()`` blocks until the call is done and returns its seconds
    (re-raising what the call raised). One call at a time. ``close()`` ends the thread.
    """

    def __init__(self, call: Callable[[], object], clock: Clock = time.perf_counter) -> None:
        self._call, self._clock = call, clock
        self._go, self._done = threading.Event(), threading.Event()
        self._closing = False
        self._elapsed_s = 0.0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="microbench-comm", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._closing:
                return
            try:
                start = self._clock()
                self._call()
                self._elapsed_s = self._clock() - start
            except BaseException as e:  # handed to the main thread by wait()
                self._error = e
            finally:
                self._done.set()

    def start(self) -> None:
        self._done.clear()
        self._go.set()

    def wait(self) -> float:
        self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._elapsed_s

    def close(self) -> None:
        self._closing = True
        self._go.set()
        self._thread.join()

    def __enter__(self) -> CommThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def overlap_pct(t_comm_s: float, t_cpu_s: float, t_both_s: float) -> float:
    """IMB-NBC's overlap: the share of the shorter of the two that was hidden, in [0, 100]."""
    if not (t_comm_s > 0 and t_cpu_s > 0 and t_both_s > 0):
        raise ValueError(f"times must be > 0, got {t_comm_s}, {t_cpu_s}, {t_both_s}")
    hidden = (t_comm_s + t_cpu_s - t_both_s) / min(t_comm_s, t_cpu_s)
    return 100.0 * max(0.0, min(1.0, hidden))


@dataclass(frozen=True)
class Point:
    """One method at one message size and compute target: three Measurements and side timings.

    ``compute_s`` and ``comm_s`` (arrays, max over ranks per sample of ``both``) are the
    computation's and the communication thread's own times inside ``both``;
    ``comm_alone_thread_s`` the thread's own times in ``comm_alone`` (None for nbc).
    """

    comm_alone: Measurement
    compute_alone: Measurement
    both: Measurement
    compute_s: np.ndarray
    comm_s: np.ndarray | None
    comm_alone_thread_s: np.ndarray | None
    compute: dict[str, Any]

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.both.params)

    @property
    def overlap_pct(self) -> float:
        return overlap_pct(self.comm_alone.median, self.compute_alone.median, self.both.median)

    @property
    def overlap_uncertainty_pct(self) -> float:
        """How far ``overlap_pct`` can move within the medians' 95% confidence intervals, in
        percentage points (before clamping): the three half-widths added, over the shorter of
        comm and compute. An overlap is only resolved where this is small: a short allreduce
        beside a long, noisy computation gives an overlap that is all noise."""
        parts = (self.comm_alone, self.compute_alone, self.both)
        half_widths_s = sum((m.median_ci().high - m.median_ci().low) / 2 for m in parts)
        return 100.0 * half_widths_s / min(self.comm_alone.median, self.compute_alone.median)

    def overlap_paired_pct(self, confidence: float = 0.95) -> tuple[float, float, float]:
        """Overlap from the rounds, paired: (median, CI low, CI high) of ``comm + compute -
        both`` per round (sample i of the three Measurements comes from round i), over the
        shorter median, in percent clamped to [0, 100]. Pairing cancels the load drift the
        three share, so this is often much tighter than :attr:`overlap_uncertainty_pct`."""
        hidden = Measurement(
            self.comm_alone.samples + self.compute_alone.samples - self.both.samples
        )
        ci = hidden.median_ci(confidence)
        shorter_s = min(self.comm_alone.median, self.compute_alone.median)

        def pct(seconds: float) -> float:
            return 100.0 * max(0.0, min(1.0, seconds / shorter_s))

        return pct(hidden.median), pct(ci.low), pct(ci.high)

    @property
    def compute_slowdown(self) -> float:
        return float(np.median(self.compute_s)) / self.compute_alone.median

    @property
    def comm_slowdown(self) -> float | None:
        if self.comm_s is None or self.comm_alone_thread_s is None:
            return None
        return float(np.median(self.comm_s)) / float(np.median(self.comm_alone_thread_s))

    def records(self, **extra: Any) -> list[dict[str, Any]]:
        """The three "measurement" records, then the "summary" record."""
        extra = {**extra, "compute": self.compute}
        return [
            self.comm_alone.to_record(**extra, comm_samples=self.comm_alone_thread_s),
            self.compute_alone.to_record(**extra),
            self.both.to_record(**extra, compute_samples=self.compute_s, comm_samples=self.comm_s),
            self.summary_record(),
        ]

    def summary_record(self) -> dict[str, Any]:
        paired, paired_low, paired_high = self.overlap_paired_pct()
        return {
            "type": "summary",
            "benchmark": "interference",
            "name": "overlap",
            "params": self.params,
            "t_comm_s": self.comm_alone.median,
            "t_cpu_s": self.compute_alone.median,
            "t_both_s": self.both.median,
            "overlap_pct": self.overlap_pct,
            "overlap_uncertainty_pct": self.overlap_uncertainty_pct,
            "overlap_paired_pct": paired,
            "overlap_paired_ci_pct": [paired_low, paired_high],
            "comm_slowdown": self.comm_slowdown,
            "compute_slowdown": self.compute_slowdown,
            "compute": self.compute,
        }
