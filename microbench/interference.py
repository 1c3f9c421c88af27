"""Interference: how much of an allreduce hides behind computation, and what each costs the other.

Data-parallel training overlaps gradient allreduces with backward; what that hides depends on
MPI progressing while the CPU computes and on the two sharing cores and memory. Two methods,
each timing the allreduce alone (``comm_alone``), the computation alone (``compute_alone``) and
both together (``both``):

``nbc`` (IMB-NBC): ``Iallreduce``, the computation, ``Wait``. Without an asynchronous progress
thread MPICH progresses it only inside MPI calls. ``comm_alone`` is the blocking ``Allreduce``
(the figure the cost model uses; IMB-NBC's own reference is Iallreduce + Wait alone).

``thread``: a communication thread (MPI_THREAD_MULTIPLE) runs the blocking ``Allreduce`` while
the main thread computes, as frameworks overlap gradient buckets; mpi4py and numpy's BLAS both
release the GIL. ``comm_alone`` is the same hand-off with no computation, so its cost is in both.

The computation is a loop of float32 GEMMs (:class:`microbench.overlap.GemmLoop`) calibrated to
the requested time on the slowest rank: it releases the GIL (the network's numba loops do not,
so a Python thread could not even start the allreduce beside them) and it repeats exactly.

The three are measured in interleaved rounds, not one after another, since a shared machine's
load drifts within seconds. Each round times the three, each after a Barrier, in an order that
rotates from round to round; :func:`microbench.sampling.measure` drives the rounds (warm-up,
max over ranks, the stopping rule applied to ``both``); the other two are the max over ranks
per round. ``both`` records also keep, per sample (max over ranks), the computation's own time
inside it (``compute_samples``) and the communication thread's own timing of its Allreduce
(``comm_samples``, also on the thread method's ``comm_alone``; null for nbc); ``comm_alone``
and ``compute_alone`` take the stop reason of ``both``. The derived figures go in one "summary"
record per point (:meth:`microbench.overlap.Point.summary_record`):

- ``overlap_pct`` = 100 * max(0, min(1, (t_comm + t_cpu - t_both) / min(t_comm, t_cpu))), with
  ``overlap_uncertainty_pct``: how far the medians' confidence intervals let it move
- ``overlap_paired_pct`` and its ``overlap_paired_ci_pct``: the same from the rounds, paired
  (sample i of the three records comes from round i), which cancels the drift they share
- ``compute_slowdown`` = compute time inside ``both`` / ``compute_alone``
- ``comm_slowdown`` = the thread's Allreduce inside ``both`` / the same alone (None for nbc,
  where the collective's own duration is not observable)

At one rank the "allreduce" is MPI's local copy from send to receive buffer; it runs all the
same (the figures describe that copy and the hand-off), and calibration must not read network
overlap from them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .cli import BenchmarkError
from .measurement import Measurement
from .overlap import CommThread, GemmLoop, Point, calibrate_gemm_loop, overlap_pct
from .records import RecordWriter
from .sampling import SamplingPolicy, measure, timed
from .sizes import format_bytes

__all__ = ["METHODS", "Point", "measure_point", "overlap_pct", "run_interference"]

METHODS = ("nbc", "thread")
NAMES = ("comm_alone", "compute_alone", "both")
ELEMENT_BYTES = 4  # float32
DEFAULT_BYTES = (1 << 20, 16 << 20)
DEFAULT_COMPUTE_S = (0.005, 0.020)
FULL_POLICY = SamplingPolicy(warmup=5, min_samples=20, max_samples=500, time_cap_s=3.0)
QUICK_POLICY = SamplingPolicy(warmup=2, min_samples=8, max_samples=50, time_cap_s=0.3)

Clock = Callable[[], float]


def _max_per_sample(values: list[float], warmup: int, comm: Any) -> np.ndarray:
    """Side timings of the samples (warm-up dropped), max over ranks per sample; collective."""
    from mpi4py import MPI

    local = np.ascontiguousarray(values[warmup:], dtype=np.float64)
    out = np.empty_like(local)
    comm.Allreduce(local, out, op=MPI.MAX)
    return out


def measure_point(
    method: str,
    comm: Any,
    send: np.ndarray,
    recv: np.ndarray,
    gemm: GemmLoop,
    policy: SamplingPolicy,
    params: dict[str, Any],
    *,
    clock: Clock = time.perf_counter,
) -> Point:
    """Measure ``comm_alone``, ``compute_alone`` and ``both`` for ``method`` in interleaved
    rounds (see the module docstring); collective."""
    from mpi4py import MPI

    allreduce = functools.partial(comm.Allreduce, send, recv, MPI.SUM)
    alone_s: dict[str, list[float]] = {"comm_alone": [], "compute_alone": []}
    compute_s: list[float] = []  # inside "both"
    comm_s: list[float] = []  # the thread's own timing, inside "both"
    thread_alone_s: list[float] = []  # the thread's own timing, in "comm_alone"
    with contextlib.ExitStack() as stack:
        if method == "nbc":
            comm_alone = timed(allreduce, clock)

            def both() -> float:
                start = clock()
                request = comm.Iallreduce(send, recv, MPI.SUM)
                begin = clock()
                gemm()
                compute_s.append(clock() - begin)
                request.Wait()
                return clock() - start

        elif method == "thread":
            thread = stack.enter_context(CommThread(allreduce, clock))

            def comm_alone() -> float:
                start = clock()
                thread.start()
                thread_alone_s.append(thread.wait())
                return clock() - start

            def both() -> float:
                start = clock()
                thread.start()
                begin = clock()
                gemm()
                compute_s.append(clock() - begin)
                comm_s.append(thread.wait())
                return clock() - start

        else:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        parts = {"comm_alone": comm_alone, "compute_alone": timed(gemm, clock), "both": both}
        rounds = itertools.count()

        def one_round() -> float:
            k = next(rounds) % len(NAMES)
            both_s = 0.0
            for i, name in enumerate(NAMES[k:] + NAMES[:k]):
                if i:
                    comm.Barrier()  # measure() passed one before the first
                elapsed = parts[name]()
                if name == "both":
                    both_s = elapsed
                else:
                    alone_s[name].append(elapsed)
            return both_s

        label = {"benchmark": "interference", "name": "both", "params": params}
        together = measure(one_round, policy, comm, clock=clock, **label)

    def per_sample(values: list[float]) -> np.ndarray:
        return _max_per_sample(values, policy.warmup, comm)

    def alone(name: str) -> Measurement:
        return Measurement(
            per_sample(alone_s[name]),
            benchmark="interference",
            name=name,
            params=params,
            warmup_discarded=policy.warmup,
            stop_reason=together.stop_reason,
        )

    thread_method = method == "thread"
    return Point(
        alone("comm_alone"),
        alone("compute_alone"),
        together,
        per_sample(compute_s),
        per_sample(comm_s) if thread_method else None,
        per_sample(thread_alone_s) if thread_method else None,
        gemm.describe(),
    )


def _check_sum(recv: np.ndarray, comm: Any, nbytes: int) -> None:
    """Every rank's receive buffer must hold the sum of (rank + 1); collective."""
    from mpi4py import MPI

    ranks = comm.Get_size()
    if not comm.allreduce(bool(np.all(recv == ranks * (ranks + 1) / 2)), op=MPI.LAND):
        raise BenchmarkError(
            f"allreduce of {format_bytes(nbytes)} returned wrong data on at least one of "
            f"{ranks} ranks"
        )


def run_interference(
    comm: Any,
    methods: Iterable[str],
    sizes: Sequence[int],
    compute_targets_s: Sequence[float],
    policy: SamplingPolicy,
    base_params: dict[str, Any],
    writer: RecordWriter | None = None,
    progress: Callable[[Point], object] | None = None,
    skip_thread: str | None = None,
) -> list[Point]:
    """Every method at every size and compute target; collective over ``comm``.

    Per compute target the GEMM loop is calibrated once; per size the buffers are allocated
    once and every method is measured in turn. ``base_params``: ranks, ranks_per_node,
    threads. ``writer`` (rank 0's) gets each point's records as soon as it is measured, and
    ``progress`` (if given) each point.
    ``skip_thread``: why the thread method cannot run (a "skipped" record), or None.
    """
    methods = tuple(methods)
    points: list[Point] = []
    rank = comm.Get_rank()
    for target_s in compute_targets_s:
        gemm = calibrate_gemm_loop(target_s, comm)
        for nbytes in sizes:
            send = np.full(nbytes // ELEMENT_BYTES, rank + 1, dtype=np.float32)
            recv = np.full(nbytes // ELEMENT_BYTES, -1.0, dtype=np.float32)
            for method in methods:
                params = {
                    "method": method,
                    "op": "allreduce",
                    "bytes": nbytes,
                    **base_params,
                    "compute_s_target": target_s,
                }
                if method == "thread" and skip_thread is not None:
                    skipped = {"type": "skipped", "benchmark": "interference", "name": "both"}
                    if writer is not None:
                        writer.write({**skipped, "params": params, "reason": skip_thread})
                    continue
                point = measure_point(method, comm, send, recv, gemm, policy, params)
                points.append(point)
                if writer is not None:
                    for record in point.records(policy=policy.to_dict(), clock="perf_counter"):
                        writer.write(record)
                if progress is not None:
                    progress(point)
            _check_sum(recv, comm, nbytes)
    return points
