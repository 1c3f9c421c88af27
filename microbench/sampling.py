"""The sampling discipline every benchmark shares: warm-up, synchronised samples, a stopping rule.

After Hoefler & Belli, "Scientific benchmarking of parallel computing systems" (SC'15):

- ``policy.warmup`` repetitions run first and are discarded (first-touch page faults, lazy
  connection set-up, caches, frequency ramp-up).
- With a communicator, all ranks pass a Barrier before each sample, and the sample is the MAX
  over ranks of each rank's time: a collective is over when its slowest rank is done. The max is
  taken by one small Allreduce after the timed region, which carries the elapsed time of the
  point as well, so every rank takes the stop decision from the same numbers and the ranks stay
  in lockstep (no rank waits in a Barrier that the others have left).
- Sampling stops at the first of these, checked after each sample once ``min_samples`` are in:

  ``"ci_target"``: the FULL width of the median's distribution-free confidence interval at
  ``policy.confidence``, over the median, is at most ``target_rel_ci`` (0.05: the interval spans
  5% of the median, about +-2.5%; see :func:`microbench.measurement.relative_ci_width`);
  ``"max_samples"``: ``max_samples`` samples are in;
  ``"time_cap"``: the point has run for ``time_cap_s`` seconds, warm-up included.

  ``min_samples`` is a floor even past the time cap, so a record never has fewer. At 95% the
  interval needs at least 6 samples to exist, so the target cannot be met before that.

The callable passed to :func:`measure` performs ONE repetition and returns the seconds it took
on this rank, so that a benchmark can time exactly the part that matters (the ping-pong times
rank 0's round trip and returns 0 on the other ranks); :func:`timed` makes one from a plain
callable. Everything outside the returned interval (checking results, the reduction, the stop
decision) costs run time but is not in the samples.

:func:`time_loop` is the other classic method (IMB, mpi4py's bench): a loop of N repetitions
timed as a whole, the time being the max over ranks of the per-repetition average. It hides
the timer's overhead and resolution for very short operations but keeps no distribution; it is
what ``benchmarks/compare_allreduce.py`` uses to compare with a C benchmark timed the same way.

mpi4py is imported only when a communicator is passed (importing ``mpi4py.MPI`` initialises MPI).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np

from .measurement import Measurement, relative_ci_width

__all__ = [
    "Point",
    "STOP_REASONS",
    "SamplingPolicy",
    "StopReason",
    "measure",
    "report_point",
    "time_loop",
    "timed",
    "timer_overhead",
]


@dataclass(frozen=True)
class Point:
    """One thing to time: ``fn()`` performs one repetition; ``cleanup()`` runs once after the
    point is measured (to undo what repeating ``fn`` changed)."""

    name: str
    params: dict[str, Any]
    fn: Callable[[], object]
    cleanup: Callable[[], None] | None = None


StopReason = Literal["ci_target", "max_samples", "time_cap"]
STOP_REASONS: tuple[StopReason, ...] = ("ci_target", "max_samples", "time_cap")

Clock = Callable[[], float]


@dataclass(frozen=True)
class SamplingPolicy:
    """How many repetitions one point gets; see the module docstring for the rule."""

    warmup: int
    min_samples: int
    max_samples: int
    target_rel_ci: float = 0.05
    time_cap_s: float = 1.0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        if self.max_samples < self.min_samples:
            raise ValueError(
                f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})"
            )
        if not self.target_rel_ci > 0:
            raise ValueError(f"target_rel_ci must be > 0, got {self.target_rel_ci}")
        if not self.time_cap_s > 0:
            raise ValueError(f"time_cap_s must be > 0, got {self.time_cap_s}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {self.confidence}")

    def fewer(self, factor: int) -> SamplingPolicy:
        """This policy with ``factor`` times fewer warm-up repetitions and a lower sample ceiling.

        For expensive points (huge messages), as OSU and mpi4py's bench cut their repetition
        counts for large messages. ``min_samples``, the target and the time cap are kept; at
        least one warm-up repetition remains if there was any.
        """
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        warmup = max(1, self.warmup // factor) if self.warmup else 0
        return replace(
            self, warmup=warmup, max_samples=max(self.min_samples, self.max_samples // factor)
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed(
    fn: Callable[[], object],
    clock: Clock = time.perf_counter,
    before: Callable[[], object] | None = None,
) -> Callable[[], float]:
    """A repetition for :func:`measure` that calls ``fn()`` and returns the seconds it took;
    ``before()``, if given, runs first, untimed."""

    def repetition() -> float:
        if before is not None:
            before()
        start = clock()
        fn()
        return clock() - start

    return repetition


def measure(
    repetition: Callable[[], float],
    policy: SamplingPolicy,
    comm: Any = None,
    *,
    clock: Clock = time.perf_counter,
    benchmark: str | None = None,
    name: str | None = None,
    params: dict[str, Any] | None = None,
    unit: str = "s",
) -> Measurement:
    """Sample ``repetition`` under ``policy``; the Measurement's ``stop_reason`` says why it ended.

    ``repetition()`` performs one repetition and returns its elapsed seconds on this rank.
    ``comm`` (an mpi4py communicator, optional): collective over it, every rank must call with
    the same policy; the samples are the max over ranks and every rank returns the same
    Measurement. A repetition that raises must raise on every rank alike (decide collectively,
    as :mod:`microbench.collectives` does for its result checks), or the others hang in the
    next Barrier. ``clock`` measures the point's elapsed time for the time cap (the max over
    ranks is used; inject a fake clock in tests). ``benchmark``, ``name``, ``params`` and
    ``unit`` label the Measurement.
    """
    reduce_max = _max_reducer(comm)
    barrier = comm.Barrier if comm is not None else None
    start = clock()
    for _ in range(policy.warmup):
        if barrier is not None:
            barrier()
        repetition()
    samples: list[float] = []
    ordered: list[float] = []  # kept sorted, so the stopping rule costs O(n) per sample
    reason: StopReason | None = None
    while reason is None:
        if barrier is not None:
            barrier()
        local = repetition()
        value, elapsed_s = reduce_max(float(local), clock() - start)
        samples.append(value)
        bisect.insort(ordered, value)
        n = len(samples)
        if n < policy.min_samples:
            continue
        if relative_ci_width(ordered, policy.confidence) <= policy.target_rel_ci:
            reason = "ci_target"
        elif n >= policy.max_samples:
            reason = "max_samples"
        elif elapsed_s >= policy.time_cap_s:
            reason = "time_cap"
    return Measurement(
        samples,
        benchmark=benchmark,
        name=name,
        params=dict(params or {}),
        unit=unit,
        warmup_discarded=policy.warmup,
        stop_reason=reason,
    )


def median_s(
    fn: Callable[[], object],
    policy: SamplingPolicy,
    before: Callable[[], object] | None = None,
) -> float:
    """Median seconds of ``fn()`` sampled on this rank under ``policy`` (``before()`` untimed
    ahead of each repetition): :func:`measure` of :func:`timed`, for probes and benchmarks
    that keep only the median."""
    return measure(timed(fn, before=before), policy).median


def _max_reducer(comm: Any) -> Callable[[float, float], tuple[float, float]]:
    """``(sample, elapsed) -> (max over ranks of each)``, by one Allreduce of two doubles."""
    if comm is None:
        return lambda value, elapsed: (value, elapsed)
    from mpi4py import MPI

    send = np.zeros(2, dtype=np.float64)
    recv = np.zeros(2, dtype=np.float64)

    def reduce_max(value: float, elapsed: float) -> tuple[float, float]:
        send[0], send[1] = value, elapsed
        comm.Allreduce(send, recv, op=MPI.MAX)
        return float(recv[0]), float(recv[1])

    return reduce_max


def time_loop(
    calls: Callable[[], object] | Sequence[Callable[[], object]],
    repetitions: int,
    comm: Any = None,
    *,
    clock: Clock = time.perf_counter,
) -> float:
    """Seconds per repetition of a loop timed as a whole, max over ranks (the IMB method).

    A Barrier, then ``repetitions`` calls between two clock reads; each rank's average per
    call is reduced with MAX, so every rank returns the same figure. ``calls`` is one callable,
    or several taken in turn (IMB's ``-off_cache``: rotating through buffers that do not fit in
    the cache together). No warm-up: run the loop once untimed first when it matters.
    """
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    rotation = [calls] if callable(calls) else list(calls)
    if not rotation:
        raise ValueError("calls is an empty sequence")
    schedule = (rotation * (repetitions // len(rotation) + 1))[:repetitions]
    if comm is not None:
        comm.Barrier()
    start = clock()
    for call in schedule:
        call()
    per_call_s = (clock() - start) / repetitions
    return _max_reducer(comm)(per_call_s, 0.0)[0]


def timer_overhead(clock: Clock = time.perf_counter, samples: int = 10_000) -> Measurement:
    """What an empty timed region reads: ``b - a`` for ``samples`` back-to-back ``a = clock();
    b = clock()`` pairs, in seconds.

    Every sample a benchmark takes includes this once (plus the clock's resolution as noise),
    so it bounds the shortest operation a per-sample timing can resolve; the jitter benchmark
    records it next to its samples. Use ``clock=MPI.Wtime`` to measure MPI's timer.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    deltas = [0.0] * samples
    for i in range(samples):
        a = clock()
        b = clock()
        deltas[i] = b - a
    label = getattr(clock, "__qualname__", None) or repr(clock)
    return Measurement(
        deltas,
        benchmark="timer",
        name="overhead",
        params={"clock": label, "resolution_s": _resolution_s(clock)},
    )


def _resolution_s(clock: Clock) -> float | None:
    """The clock's advertised resolution: ``time.get_clock_info`` or ``MPI.Wtick``."""
    for name in ("perf_counter", "monotonic", "time", "process_time", "thread_time"):
        if clock is getattr(time, name):
            return float(time.get_clock_info(name).resolution)
    if getattr(clock, "__qualname__", "") == "Wtime":
        try:
            from mpi4py import MPI

            return float(MPI.Wtick())
        except Exception:
            return None
    return None


def report_point(
    m: Measurement, writer: Any, progress: Any, label: str, **record_extra: Any
) -> None:
    """Write a finished point's record at once (an interrupted run keeps it) and print its
    progress line: ``label``, then the median with its 95% interval, n and the stop reason."""
    from .sizes import format_time

    if writer is not None:
        writer.write(m.to_record(**record_extra))
    if progress is not None:
        ci = m.median_ci()
        progress.write(
            f"{label}  median {format_time(m.median):>9}  95% CI [{format_time(ci.low)}, "
            f"{format_time(ci.high)}]  n={m.n:<4} {m.stop_reason}\n"
        )
        progress.flush()
