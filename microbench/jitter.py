"""Jitter: the distribution of one identical training step's compute time, on every rank at once.

In synchronous data parallelism every step ends in an allreduce, which no rank leaves before
the slowest has arrived, so a step costs the MAX over ranks of their compute times, not the
typical one. This benchmark measures that directly: every rank builds the real
:class:`microbench.nn.Network` and repeatedly times forward + backward + SGD update on one fixed
batch (no communication inside the timed region), each sample started right after a Barrier so
that all ranks compute simultaneously, sharing cores, memory bandwidth and OS noise as they do
in training.

Sampling: a FIXED number of samples after a fixed warm-up (numba compilation, first-touch page
faults and workspace allocation happen in the warm-up and never in a sample). The
confidence-interval stopping rule of :mod:`microbench.sampling` is deliberately not used: it
stops once the MEDIAN is known well, but what this benchmark is for is the TAIL (p99, the
maximum over ranks), which needs a sample count chosen up front and stopping rules based on
the median would bias towards calm stretches.

The step is identical on purpose: the batch is fixed and the learning rate is 0, so every step
computes exactly the same numbers (no drift into denormals or a changing loss) while the update
pass still reads and writes every parameter, costing what a real update costs. Any variation
between samples is the machine's.

**The gather first.** Each step is preceded, untimed, by the mini-batch gather a training loop
runs before it (:func:`make_gather`: ``np.take`` of the next rows of a random permutation of
a dataset, into reused buffers). The gather reads rows of a large array and writes the batch,
evicting some of the network's weights, so the step after it runs a few percent slower than
the same step run back to back, as in ``pdlsim train``'s phases (evidence: docs/evidence.md,
"Jitter"). The samplers take it as ``before``.

Every rank's raw samples are kept (gathered to rank 0), and so is the per-sample maximum over
ranks; :class:`JitterSummary` condenses them.

**Co-location.** With more than one rank, the same step is also timed on rank 0 *alone*, while
the other ranks idle without spinning (they sleep between tests of a non-blocking barrier; a
blocking MPI wait would busy-poll a core), in blocks interleaved with the blocks where every
rank computes (:func:`sample_interleaved`). The ratio of the two medians is how much the ranks
of a node slow each other down (memory bandwidth, caches), measured side by side in one run so
that machine load that comes and goes affects both alike (:mod:`calibration.colocation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .measurement import Measurement
from .workload import Workload

__all__ = [
    "FORWARD_NAME",
    "FULL_SAMPLES",
    "FULL_WARMUP",
    "QUICK_SAMPLES",
    "QUICK_WARMUP",
    "Distribution",
    "JitterSummary",
    "format_summary",
    "gather_samples",
    "jitter_records",
    "sample_alone",
    "sample_interleaved",
    "make_step_pair",
    "make_gather",
    "make_training_step",
    "sample_alternating",
    "sample_steps",
]

BENCHMARK = "jitter"
NAME = "step_compute"
FORWARD_NAME = "forward_compute"  # the forward-only step, as ``microbench speed`` records it
FULL_SAMPLES, FULL_WARMUP = 200, 10
QUICK_SAMPLES, QUICK_WARMUP = 40, 3
# The fixed count is reached by construction: "max_samples" is the stop reason that says so.
STOP_REASON = "max_samples"

Clock = Callable[[], float]


def make_training_step(workload: Workload, batch: int, seed: int = 0) -> Callable[[], None]:
    """One training step's compute (forward, backward, SGD update) on a fixed random batch.

    The same ``seed`` gives the same parameters and batch on every rank. Learning rate 0:
    see the module docstring. Nothing is allocated per call once the first call has run.
    """
    return make_step_pair(workload, batch, seed)[0]


def make_gather(workload: Workload, batch: int, seed: int = 0) -> Callable[[], None]:
    """The mini-batch gather that precedes each step (module docstring); the compute
    benchmark's own (:func:`microbench.network_ops.gather_point_fn`)."""
    from .network_ops import gather_point_fn

    return gather_point_fn(workload.input_shape, batch, seed)


def make_step_pair(
    workload: Workload,
    batch: int,
    seed: int = 0,
    xp: Any = np,
    synchronize: Callable[[], None] | None = None,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The training step of :func:`make_training_step` and the forward-only step (the forward
    and the loss, what ``pdlsim train --inference`` computes) on the same network and batch.
    On a GPU (``xp`` CuPy) each call ends with ``synchronize()``, so that a host clock around
    it times the device's work too."""
    from .nn import SGD, Network

    net = Network(workload, seed=seed, xp=xp)
    opt = SGD(lr=0.0, xp=xp)
    rng = np.random.default_rng(seed)
    x = xp.asarray(rng.standard_normal((batch, *workload.input_shape), dtype=np.float32))
    y = xp.asarray(rng.integers(0, workload.num_classes, batch))
    wait = synchronize or _nothing

    def step() -> None:
        net.forward(x, y)
        net.backward()
        opt.step(net.params, net.grads)
        wait()

    def forward_only() -> None:
        net.forward(x, y)
        wait()

    return step, forward_only


def sample_steps(
    step: Callable[[], object],
    samples: int,
    warmup: int,
    comm: Any = None,
    *,
    clock: Clock = time.perf_counter,
    before: Callable[[], object] | None = None,
) -> np.ndarray:
    """This rank's seconds for each of ``samples`` calls of ``step``, after ``warmup`` untimed ones.

    With ``comm`` every call (warm-up included) starts after a Barrier, so the ranks run each
    step together; collective, every rank must pass the same counts. ``before``: called untimed
    right before every call of the step (the gather, module docstring).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    barrier = comm.Barrier if comm is not None else None
    prepare = before or _nothing
    for _ in range(warmup):
        if barrier is not None:
            barrier()
        prepare()
        step()
    out = np.empty(samples, dtype=np.float64)
    for i in range(samples):
        if barrier is not None:
            barrier()
        prepare()
        start = clock()
        step()
        out[i] = clock() - start
    return out


def _nothing() -> None:
    return None


def sample_alternating(
    steps: Sequence[Callable[[], object]],
    samples: int,
    warmup: int,
    *,
    block: int = 1,
    settle: int | Sequence[int] = 1,
    clock: Clock = time.perf_counter,
    before: Callable[[], object] | None = None,
) -> list[np.ndarray]:
    """Each of ``steps`` ``warmup`` times untimed, then rounds through them in turn until each
    has ``samples`` timed calls: its seconds, one array per step. ``block`` 1: one timed call
    of each per round. ``block`` k > 1: per round each step has ``settle`` untimed calls (one
    number, or one per step), that put the caches back as a loop of that step keeps them, and
    then k timed calls (the last round fewer), so that each step is timed as it runs back to
    back, not as it runs right after the other one. ``before``: called untimed right before
    every call of a step."""
    if block < 1:
        raise ValueError(f"need block >= 1, got {block}")
    settles = [settle] * len(steps) if isinstance(settle, int) else list(settle)
    if len(settles) != len(steps) or min(settles, default=1) < 1:
        raise ValueError(f"need settle >= 1 for each of the {len(steps)} steps, got {settle}")
    prepare = before or _nothing
    for step in steps:
        for _ in range(warmup):
            prepare()
            step()
    out = np.empty((len(steps), samples), dtype=np.float64)
    for first in range(0, samples, block):
        for k, step in enumerate(steps):
            for _ in range(settles[k] if block > 1 else 0):
                prepare()
                step()
            for i in range(first, min(first + block, samples)):
                prepare()
                start = clock()
                step()
                out[k, i] = clock() - start
    return list(out)


def sample_alone(
    step: Callable[[], object],
    samples: int,
    comm: Any,
    *,
    clock: Clock = time.perf_counter,
    poll_s: float = 1e-3,
    before: Callable[[], object] | None = None,
) -> np.ndarray:
    """Rank 0's seconds for ``samples`` calls of ``step`` while the other ranks idle (sleeping
    between tests of a non-blocking barrier); empty on the other ranks. Collective.
    ``before``: called untimed right before every call of the step. A step that returns a float
    gives its own seconds (a part of the call it timed itself), kept instead of the call's."""
    comm.Barrier()
    if comm.Get_rank() != 0:
        request = comm.Ibarrier()
        while not request.Test():
            time.sleep(poll_s)
        return np.empty(0, dtype=np.float64)
    prepare = before or _nothing
    out = np.empty(samples, dtype=np.float64)
    for i in range(samples):
        prepare()
        start = clock()
        own = step()
        out[i] = own if isinstance(own, float) else clock() - start
    comm.Ibarrier().Wait()
    return out


def sample_interleaved(
    step: Callable[[], object],
    samples: int,
    warmup: int,
    comm: Any,
    block: int = 10,
    *,
    clock: Clock = time.perf_counter,
    before: Callable[[], object] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's ``samples`` step times with every rank computing, rank 0's ``samples``
    alone, empty elsewhere), taken in alternating blocks of ``block``; collective. ``before``:
    called untimed right before every call of the step."""
    together, alone = [], []
    for done in range(0, samples, block):
        n = min(block, samples - done)
        first = warmup if done == 0 else 0
        together.append(sample_steps(step, n, first, comm, clock=clock, before=before))
        alone.append(sample_alone(step, n, comm, clock=clock, before=before))
    return np.concatenate(together), np.concatenate(alone)


def gather_samples(local: np.ndarray, comm: Any = None) -> np.ndarray | None:
    """Every rank's samples as a (ranks, samples) array on rank 0 (None elsewhere); collective."""
    local = np.ascontiguousarray(local, dtype=np.float64)
    if comm is None:
        return local[np.newaxis, :].copy()
    root = comm.Get_rank() == 0
    table = np.empty((comm.Get_size(), local.size), dtype=np.float64) if root else None
    comm.Gather(local, table, root=0)
    return table


@dataclass(frozen=True)
class Distribution:
    """Median, tail percentiles and maximum of a set of step times, in seconds."""

    n: int
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    max_over_median: float

    @classmethod
    def of(cls, samples: Sequence[float] | np.ndarray) -> Distribution:
        values = np.asarray(samples, dtype=np.float64).ravel()
        if values.size == 0:
            raise ValueError("no samples")
        median, p90, p99 = np.percentile(values, [50, 90, 99])
        top = float(values.max())
        return cls(int(values.size), float(median), float(p90), float(p99), top, top / median)


@dataclass(frozen=True)
class JitterSummary:
    """What the slowest rank costs, from a (ranks, samples) table of step times.

    ``per_rank``: every rank's samples pooled (the distribution one rank sees);
    ``max_over_ranks``: the per-sample maximum over ranks (what a synchronous step pays);
    ``expected_wait_s``: the mean over samples of (max - mean) across ranks, the time the mean
    rank waits for the slowest one each step (0 at one rank); ``expected_wait_rel``: that over
    the pooled median.
    """

    ranks: int
    samples_per_rank: int
    per_rank: Distribution
    max_over_ranks: Distribution
    expected_wait_s: float
    expected_wait_rel: float

    @classmethod
    def from_samples(cls, table: np.ndarray) -> JitterSummary:
        table = np.asarray(table, dtype=np.float64)
        if table.ndim != 2 or table.size == 0:
            raise ValueError(f"need a non-empty (ranks, samples) table, got shape {table.shape}")
        per_rank = Distribution.of(table)
        wait_s = float(np.mean(table.max(axis=0) - table.mean(axis=0)))
        return cls(
            ranks=int(table.shape[0]),
            samples_per_rank=int(table.shape[1]),
            per_rank=per_rank,
            max_over_ranks=Distribution.of(table.max(axis=0)),
            expected_wait_s=wait_s,
            expected_wait_rel=wait_s / per_rank.median_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def jitter_records(
    table: np.ndarray,
    params: dict[str, Any],
    warmup: int,
    hosts: Sequence[str] | None = None,
    alone: np.ndarray | None = None,
    **extra: Any,
) -> list[dict[str, Any]]:
    """The "measurement" records of a (ranks, samples) table: one per rank, then the maximum,
    then (``alone`` given: rank 0's samples while the others idled) statistic "alone".

    ``params`` holds the shared ones (model, batch, threads, ranks, ranks_per_node); "rank"
    (an int, or None for the maximum) and "statistic" ("per_rank" or "max_over_ranks") are
    added. ``hosts[r]`` becomes rank r's "host" field; ``extra`` fields go on every record.
    """
    records = []
    rows = [(r, "per_rank", table[r]) for r in range(table.shape[0])]
    rows.append((None, "max_over_ranks", table.max(axis=0)))
    if alone is not None and len(alone):
        rows.append((0, "alone", np.asarray(alone, dtype=float)))
    for rank, statistic, samples in rows:
        measurement = Measurement(
            samples,
            benchmark=BENCHMARK,
            name=NAME,
            params={**params, "rank": rank, "statistic": statistic},
            warmup_discarded=warmup,
            stop_reason=STOP_REASON,
        )
        host = hosts[rank] if hosts is not None and rank is not None else None
        records.append(measurement.to_record(host=host, **extra))
    return records


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def format_summary(summary: JitterSummary, model: str, batch: int, threads: int) -> str:
    """A plain-text table of the summary, times in milliseconds."""
    lines = [
        f"jitter of one {model} training step (batch {batch}, {threads} thread(s)), "
        f"{summary.ranks} rank(s) x {summary.samples_per_rank} samples, times in ms",
        f"{'':<16}{'median':>10}{'p90':>10}{'p99':>10}{'max':>10}{'max/median':>12}",
    ]
    for label, d in (("per rank", summary.per_rank), ("max over ranks", summary.max_over_ranks)):
        lines.append(
            f"{label:<16}{_ms(d.median_s):>10}{_ms(d.p90_s):>10}{_ms(d.p99_s):>10}"
            f"{_ms(d.max_s):>10}{d.max_over_median:>12.2f}"
        )
    lines.append(
        f"expected wait of the mean rank for the slowest: {_ms(summary.expected_wait_s)} ms "
        f"per step ({summary.expected_wait_rel:.1%} of the median)"
    )
    return "\n".join(lines)
