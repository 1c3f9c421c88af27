"""MPI collectives on float32 buffers: Allreduce, Bcast, Allgather, Reduce_scatter, Barrier and a
ping-pong, timed under :mod:`microbench.sampling`.

Buffer-based mpi4py calls only (``Allreduce``, not the pickling ``allreduce``). What ``bytes``
means per operation (``total_bytes`` is stored next to it):

============== =============================================== ==============================
op             ``bytes``                                        ``total_bytes``
============== =============================================== ==============================
allreduce      each rank's buffer (SUM, in place)               = bytes
bcast          the broadcast buffer (root 0)                    = bytes
allgather      each rank's contribution (one block)             ranks x bytes (the result)
reduce_scatter each rank's result block (Reduce_scatter_block)  ranks x bytes (each input)
pingpong       the message between ranks 0 and 1                = bytes
barrier        0                                                0
============== =============================================== ==============================

With this convention an allreduce of N bytes moves the same data as a reduce_scatter plus an
allgather of N/ranks bytes each, which is how the calibration composes algorithms. A ping-pong
sample is half of rank 0's round trip (ranks other than 0 and 1 wait in the barrier only).

The allreduce is timed in place (``MPI_IN_PLACE``), as training loops call it on their gradients
(``pdlsim train``, PyTorch DDP, Horovod); nccl-tests report both. Out of place, MPICH first
copies the input to the output, a cost that grows with the message (up to half the call again at
a few MiB) and that a trainer's in-place allreduce never pays: a model timed out of place would
carry it into every data-parallel prediction (evidence: docs/evidence.md, "Collectives
benchmark"). After the checked first call the buffer is zeroed, so the in-place sums that follow
stay 0 rather than doubling to inf.

Buffers are allocated once per size and written before timing (np.zeros could hand back pages
that fault on first touch inside the timed region). The result of the first repetition of each
point is checked on every rank (the Allreduce sum of the ranks' known values, and the like); a
wrong result on any rank raises :class:`CollectiveCheckError` on all of them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .cli import BenchmarkError
from .measurement import Measurement
from .memory import usable_memory_bytes
from .records import RecordWriter
from .sampling import SamplingPolicy, measure, report_point, timed
from .sizes import format_bytes, format_time, size_range

__all__ = [
    "DEFAULT_SIZES",
    "OPS",
    "QUICK_SIZES",
    "CollectiveCheckError",
    "CollectiveSummary",
    "Operation",
    "buffer_bytes_per_rank",
    "format_summary",
    "make_operation",
    "run_collectives",
    "summarize",
]

OPS = ("allreduce", "bcast", "allgather", "reduce_scatter", "barrier", "pingpong")
ELEMENT_BYTES = 4  # float32
DEFAULT_SIZES = tuple(size_range(8, 64 << 20, 2))
QUICK_SIZES = tuple(size_range(8, 1 << 20, 4))
FULL_POLICY = SamplingPolicy(warmup=10, min_samples=20, max_samples=1000, time_cap_s=1.0)
QUICK_POLICY = SamplingPolicy(warmup=3, min_samples=10, max_samples=100, time_cap_s=0.05)
# From here on, policy.fewer(LARGE_FACTOR): a millisecond a call and more on a 2-core VM. At
# 1 MiB (0.3-0.5 ms), --quick's largest size and the point its bandwidths rest on, a tenth of
# the samples left it 10, its interval 432-647 us about a 481 us median.
LARGE_MESSAGE_BYTES = 1 << 21
LARGE_FACTOR = 10
MEMORY_FRACTION = 0.5  # of the node's memory that the buffers of all its ranks may take


class CollectiveCheckError(BenchmarkError):
    """A collective returned wrong data on at least one rank (raised on every rank)."""


@dataclass(frozen=True)
class Operation:
    """One collective at one size, buffers allocated and filled.

    ``call()`` performs one repetition (untimed); ``repetition()`` performs one and returns its
    seconds on this rank, for :func:`microbench.sampling.measure`; ``check()`` says whether this
    rank's buffers hold the expected result after a call. ``buffers``: the arrays the call
    uses, send buffer first (one for bcast and the in-place allreduce, none for the barrier).
    """

    op: str
    bytes: int
    total_bytes: int
    call: Callable[[], object]
    repetition: Callable[[], float]
    check: Callable[[], bool]
    buffers: tuple[np.ndarray, ...] = ()
    after_check: Callable[[], object] | None = None  # once the checked call passed


def _filled(count: int, value: float) -> np.ndarray:
    return np.full(count, value, dtype=np.float32)  # np.full writes every page


def _holds(buffer: np.ndarray, expected: np.ndarray | float) -> bool:
    return bool(np.all(buffer == expected))


def _nothing_to_check() -> bool:
    return True


def make_operation(op: str, nbytes: int, comm: Any) -> Operation:
    """Allocate and fill the buffers of ``op`` at ``nbytes`` (see the module table)."""
    from mpi4py import MPI

    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if op != "barrier" and (nbytes < ELEMENT_BYTES or nbytes % ELEMENT_BYTES):
        raise ValueError(f"{op}: {nbytes} bytes is not a positive multiple of {ELEMENT_BYTES}")
    ranks, rank = comm.Get_size(), comm.Get_rank()
    count = nbytes // ELEMENT_BYTES
    total = nbytes
    rank_sum = ranks * (ranks + 1) / 2  # sum over ranks of (rank + 1), exact in float32
    buffers: tuple[np.ndarray, ...] = ()
    after_check = None
    if op == "allreduce":
        buf = _filled(count, rank + 1)
        call = functools.partial(comm.Allreduce, MPI.IN_PLACE, buf, MPI.SUM)
        check = functools.partial(_holds, buf, rank_sum)
        after_check = functools.partial(buf.fill, 0.0)  # zeros sum to zeros (module docstring)
        buffers = (buf,)
    elif op == "bcast":
        buf = _filled(count, 7.0 if rank == 0 else -1.0)
        call = functools.partial(comm.Bcast, buf, 0)
        check = functools.partial(_holds, buf, 7.0)
        buffers = (buf,)
    elif op == "allgather":
        total = ranks * nbytes
        send, recv = _filled(count, rank + 1), _filled(ranks * count, -1.0)
        expected = np.arange(1, ranks + 1, dtype=np.float32)[:, np.newaxis]  # block i: i + 1
        call = functools.partial(comm.Allgather, send, recv)
        check = functools.partial(_holds, recv.reshape(ranks, count), expected)
        buffers = (send, recv)
    elif op == "reduce_scatter":
        # Block i of rank r holds (r + 1)(i + 1): rank r receives (r + 1) * sum(rank + 1).
        total = ranks * nbytes
        blocks = np.arange(1, ranks + 1, dtype=np.float32) * (rank + 1)
        send, recv = np.repeat(blocks, count), _filled(count, -1.0)
        call = functools.partial(comm.Reduce_scatter_block, send, recv, MPI.SUM)
        check = functools.partial(_holds, recv, (rank + 1) * rank_sum)
        buffers = (send, recv)
    elif op == "barrier":
        total = nbytes = 0
        call = comm.Barrier
        check = _nothing_to_check
    else:
        return _pingpong(comm, count, nbytes)
    return Operation(op, nbytes, total, call, timed(call), check, buffers, after_check)


def _pingpong(comm: Any, count: int, nbytes: int) -> Operation:
    """Rank 0 sends to rank 1, which sends it back; a sample is half of rank 0's round trip."""
    rank = comm.Get_rank()
    send = _filled(count, 3.0 if rank == 0 else -1.0)
    recv = _filled(count, -1.0)
    clock = time.perf_counter

    def call() -> None:
        if rank == 0:
            comm.Send(send, 1, 17)
            comm.Recv(recv, 1, 17)
        elif rank == 1:
            comm.Recv(recv, 0, 17)
            comm.Send(recv, 0, 17)

    def repetition() -> float:
        if rank != 0:
            call()
            return 0.0  # the max over ranks is rank 0's time
        start = clock()
        call()
        return (clock() - start) / 2.0

    check = functools.partial(_holds, recv, 3.0) if rank < 2 else _nothing_to_check
    return Operation("pingpong", nbytes, nbytes, call, repetition, check, (send, recv))


def buffer_bytes_per_rank(op: str, nbytes: int, ranks: int) -> int:
    """Memory the buffers of ``op`` at ``nbytes`` take on one rank."""
    return {
        "allreduce": nbytes,
        "bcast": nbytes,
        "allgather": (ranks + 1) * nbytes,
        "reduce_scatter": (ranks + 1) * nbytes,
        "pingpong": 2 * nbytes,
        "barrier": 0,
    }[op]


def _checked_once(operation: Operation, comm: Any) -> Callable[[], float]:
    """The repetition, checking the result after the first call on every rank (collectively)."""
    from mpi4py import MPI

    pending = [True]

    def repetition() -> float:
        elapsed = operation.repetition()
        if pending[0]:
            pending[0] = False
            if not comm.allreduce(operation.check(), op=MPI.LAND):
                raise CollectiveCheckError(
                    f"{operation.op} at {format_bytes(operation.bytes)} returned wrong data on "
                    f"at least one of {comm.Get_size()} ranks"
                )
            if operation.after_check is not None:
                operation.after_check()
        return elapsed

    return repetition


def _memory_budget_bytes(comm: Any, machine: Mapping[str, Any]) -> float:
    """Per-rank buffer budget, the same on every rank (min over ranks); inf when unknown."""
    from mpi4py import MPI

    memory = usable_memory_bytes(machine)
    per_node = (machine.get("mpi") or {}).get("ranks_per_node") or 1
    budget = MEMORY_FRACTION * memory / per_node if memory is not None else float("inf")
    return comm.allreduce(budget, op=MPI.MIN)


def run_collectives(
    comm: Any,
    ops: Iterable[str],
    sizes: Iterable[int],
    policy: SamplingPolicy,
    machine: Mapping[str, Any],
    writer: RecordWriter | None = None,
    progress: TextIO | None = None,
) -> list[Measurement]:
    """Measure every op at every size (the barrier once), op by op, sizes ascending.

    Collective over ``comm``. ``machine``: this rank's :func:`microbench.machine.
    machine_metadata` (for ranks per node and the memory budget). ``writer`` (rank 0's):
    receives each point's record as soon as it is measured, so an interrupted run keeps every
    finished point; points skipped (ping-pong on one rank, buffers too large for the node's
    memory) get a ``"skipped"`` record saying why. ``progress``: one line per point.
    Returns the Measurements, the same on every rank.
    """
    ranks = comm.Get_size()
    ranks_per_node = (machine.get("mpi") or {}).get("ranks_per_node")
    budget = _memory_budget_bytes(comm, machine)
    sizes = tuple(sizes)
    results: list[Measurement] = []
    for op in ops:
        for nbytes in (0,) if op == "barrier" else sizes:
            params = {
                "op": op,
                "bytes": nbytes,
                "total_bytes": nbytes * ranks if op in ("allgather", "reduce_scatter") else nbytes,
                "ranks": ranks,
                "ranks_per_node": ranks_per_node,
                "algorithm": None,
                "in_place": op == "allreduce",
            }
            reason = None
            if op == "pingpong" and ranks < 2:
                reason = "needs at least 2 ranks"
            elif buffer_bytes_per_rank(op, nbytes, ranks) > budget:
                reason = (
                    f"buffers of {format_bytes(buffer_bytes_per_rank(op, nbytes, ranks))} per "
                    f"rank exceed {MEMORY_FRACTION:.0%} of the node's memory over its ranks"
                )
            if reason is not None:
                _report_skip(writer, progress, params, reason)
                continue
            operation = make_operation(op, nbytes, comm)
            point_policy = policy.fewer(LARGE_FACTOR) if nbytes >= LARGE_MESSAGE_BYTES else policy
            result = measure(
                _checked_once(operation, comm),
                point_policy,
                comm,
                benchmark="collectives",
                name=op,
                params=params,
            )
            del operation  # free this size's buffers before the next size allocates its own
            results.append(result)
            label = f"{result.name:<15}{format_bytes(result.params['bytes']):>10}"
            report_point(
                result, writer, progress, label, policy=point_policy.to_dict(), clock="perf_counter"
            )
    return results


def _report_skip(
    writer: RecordWriter | None, progress: TextIO | None, params: dict[str, Any], reason: str
) -> None:
    if writer is not None:
        record = {"type": "skipped", "benchmark": "collectives", "name": params["op"]}
        writer.write({**record, "params": params, "reason": reason})
    if progress is not None:
        size = format_bytes(params["bytes"])
        progress.write(f"{params['op']:<15}{size:>10}  skipped: {reason}\n")
        progress.flush()


# ---------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class CollectiveSummary:
    """Per collective and rank count: latency at the smallest size, bandwidth at the largest.

    ``bandwidth_bytes_per_s`` is nccl-tests' algorithm bandwidth, ``total_bytes / time`` (for
    the ping-pong: one way); ``bus_bandwidth_bytes_per_s`` scales it by nccl-tests' factor so
    that it compares with link speed: 2(p-1)/p for allreduce, (p-1)/p for allgather and
    reduce_scatter, 1 for bcast and the ping-pong. Both are None for the barrier, and the bus
    bandwidth is None for one rank, where no data crosses a link.
    """

    op: str
    ranks: int
    smallest_bytes: int
    latency_s: float
    largest_bytes: int
    largest_time_s: float
    bandwidth_bytes_per_s: float | None
    bus_bandwidth_bytes_per_s: float | None


_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda p: 2.0 * (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "bcast": lambda p: 1.0,
    "pingpong": lambda p: 1.0,
}


def summarize(records: Iterable[Mapping[str, Any]]) -> list[CollectiveSummary]:
    """Summaries of the collectives' "measurement" records (other records are ignored)."""
    points: dict[tuple[str, int], list[tuple[int, int, float]]] = {}
    for record in records:
        if record.get("type") != "measurement" or record.get("benchmark") != "collectives":
            continue
        params = record["params"]
        median = Measurement.from_record(record).median
        key = (params["op"], int(params["ranks"]))
        points.setdefault(key, []).append((params["bytes"], params["total_bytes"], median))
    summaries = []
    order = {op: i for i, op in enumerate(OPS)}
    for (op, ranks), values in sorted(points.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        values.sort()
        small, (large, large_total, large_time) = values[0], values[-1]
        bandwidth = bus = None
        moves_data = op != "barrier" and not (op == "bcast" and ranks == 1)  # 1-rank bcast: no-op
        if moves_data and large_time > 0:
            bandwidth = large_total / large_time
            bus = bandwidth * _BUS_FACTOR[op](ranks) if ranks > 1 else None
        summaries.append(
            CollectiveSummary(op, ranks, small[0], small[2], large, large_time, bandwidth, bus)
        )
    return summaries


def format_summary(summaries: Iterable[CollectiveSummary]) -> str:
    """A plain-text table: latency at the smallest size, bandwidths at the largest."""
    lines = [
        f"{'collective':<15}{'ranks':>6}{'latency':>20}{'time':>22}{'alg bw':>12}{'bus bw':>12}"
    ]
    for s in summaries:
        latency = f"{format_time(s.latency_s)} @ {format_bytes(s.smallest_bytes)}"
        at_large = f"{format_time(s.largest_time_s)} @ {format_bytes(s.largest_bytes)}"
        lines.append(
            f"{s.op:<15}{s.ranks:>6}{latency:>20}{at_large:>22} "
            f"{_gb_per_s(s.bandwidth_bytes_per_s):>11} {_gb_per_s(s.bus_bandwidth_bytes_per_s):>11}"
        )
    return "\n".join(lines)


def _gb_per_s(bandwidth_bytes_per_s: float | None) -> str:
    return "-" if bandwidth_bytes_per_s is None else f"{bandwidth_bytes_per_s / 1e9:.3g} GB/s"
