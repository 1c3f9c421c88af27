"""The kernel sweep: every kernel a training step calls, timed alone over a designed grid of
shapes, with no workload in sight.

A step of any workload of the supported layer kinds is a sequence of calls to a small set of
kernels (:mod:`microbench.kernels.calls`): float32 GEMMs in three layouts, a dozen numba loops,
a gather and a copy. This benchmark times those kernels, not any network's steps, over shapes
chosen to cover what such workloads land in, so that a profile fitted from it prices
workloads, batches and thread counts it never ran:

* **GEMM** ``gemm``: ``c (m x n) = a @ b`` in layouts ``nn``, ``tn`` (``a`` read transposed,
  a weight gradient) and ``nt`` (``b`` transposed, an input gradient), at every (m, n, k) of
  :data:`GEMM_DIMS` (small values closely spaced: BLAS's edge tiles make odd small dimensions
  cost more than their FLOPs) whose FLOPs stay under ``gemm_max_flops`` and operands under
  :data:`MAX_ELEMENTS`, at each thread count; and **ragged** shapes, one of m and n at
  :data:`GEMM_RAGGED_DIMS` (remainders past whole 8-float vectors that need BLAS's edge tiles
  of 4, 2 and 1 columns) with the other dimensions at :data:`GEMM_PARTNER_DIMS`, from which
  :mod:`calibration.kernel_tables` measures what each edge tile costs. Beyond the grid a GEMM
  keeps the efficiency of the grid's edge. Above one thread each sample follows a short gap,
  as every GEMM of a step follows other work: a GEMM that BLAS threads pays their wake-up
  (:data:`microbench.threads.BLAS_SLEEP_GAP_S`).
* **GEMM stride pairs** ``gemm_alias``: at each width n of :data:`GEMM_ALIAS_N` (row strides
  of a large power of two bytes, as every grid width from 64 up) and each (m, k) of
  :data:`GEMM_ALIAS_MK`, the GEMM at n and :data:`GEMM_ALIAS_SHIFT` columns either side of it,
  one right after the other, in every layout: what such a stride costs
  (:mod:`calibration.gemm_alias`).
* **Loops** ``loop``: each numba loop, the gather and the copy over :data:`LOOP_ELEMENTS`
  elements and, where a kernel's speed depends on it, a few lengths of its inner contiguous
  run (:func:`microbench.kernels.calls.call_features`: channels, columns, classes, row bytes).
  A loop's serial driver is timed at one thread, its parallel driver at every other count.
* **Steps** ``step`` and ``step_alone``: whole training steps (forward, loss, backward,
  update) of networks that no workload names, each right after another step as training runs
  them, against the very same kernel calls each timed alone (:mod:`microbench.kernels.record`),
  side by side in rounds so that a slow spell of a shared machine lands on both. The networks
  are tiny ones whose kernels do next to no work (their steps are the Python between kernels)
  and random ones of the supported layer kinds at random batches, drawn from a stream of
  their own that no held-out set uses, the same at every thread count
  (:mod:`microbench.kernels.steps`). :mod:`calibration.step_terms` fits from them what a step
  costs beyond its kernels: the Python per op call and per step, and the factor by which
  kernels run slower inside a step than alone.

Points run in a shuffled order (seeded), so that a slow spell of a shared machine lands on
scattered shapes rather than on one neighbourhood of the grid, and the thread counts take
turns in blocks of points, so that it lands on every count alike. A GEMM above one thread
far slower than at one thread stalled on a descheduled core and is timed again at the end
(``retimed``; the kernel model takes that record instead). Each point is sampled under
:mod:`microbench.sampling` and written as one record at once.

Record params (benchmark "kernels"; all carry ``threads``):

* "gemm": ``layout``, ``m``, ``n``, ``k``, ``flops``.
* "gemm_alias": the same, with ``base_n`` (the triple's width of a costly stride) and
  ``shift`` (the columns n is past it: -8, 0 or 8).
* "loop": ``kernel``, ``variant``, ``dims`` (:data:`~microbench.kernels.calls.KERNEL_DIMS`),
  ``elements``, ``run``.
* "step", "step_alone": ``workload_json`` (its description, as JSON text), ``batch``,
  ``op_calls``; the samples of "step" are whole steps, those of "step_alone" the sum of the
  same calls each timed alone, one sample of each per round.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from microbench.kernels.calls import GEMM_LAYOUTS, KERNEL_DIMS, call_features, op_calls
from microbench.kernels.callspec import SERIAL_ONLY
from microbench.kernels.steps import measure_step, step_workloads
from microbench.loopcalls import MAX_ELEMENTS, im2col_dims, loop_dims, loop_fn
from microbench.measurement import Measurement
from microbench.records import RecordWriter
from microbench.sampling import SamplingPolicy, measure, report_point, timed
from microbench.threads import let_blas_threads_sleep, set_threads
from microbench.workload import Workload

__all__ = [
    "ATTENTION_MAX_BLOCKS",
    "FULL_POLICY",
    "GEMM_MAX_FLOPS",
    "QUICK_GEMM_MAX_FLOPS",
    "QUICK_LOOP_ELEMENTS",
    "CHANNEL_RUNS",
    "QUICK_CHANNEL_RUNS",
    "QUICK_IM2COL_SHAPES",
    "im2col_dims",
    "gemm_shapes",
    "loop_dims",
    "GEMM_DIMS",
    "GEMM_PARTNER_DIMS",
    "GEMM_RAGGED_DIMS",
    "QUICK_GEMM_PARTNER_DIMS",
    "QUICK_GEMM_RAGGED_DIMS",
    "ragged_shapes",
    "LOOP_ELEMENTS",
    "MAX_ELEMENTS",
    "QUICK_GEMM_DIMS",
    "QUICK_POLICY",
    "KernelPlan",
    "Pool",
    "loop_points",
    "QUICK_STEP_MAX_FLOPS",
    "QUICK_STEP_ROUNDS",
    "GEMM_ALIAS_N",
    "GEMM_ALIAS_MK",
    "QUICK_GEMM_ALIAS_N",
    "QUICK_GEMM_ALIAS_MK",
    "run_kernels",
]

# 262144: a convolution's GEMM has batch x output pixels rows (200704 for 28 x 28 at batch
# 256); past 65536 its tall operand leaves the last-level cache and the rate drops by a fifth.
GEMM_DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096,
             16384, 65536, 262144)  # fmt: skip
QUICK_GEMM_DIMS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096, 65536)
# Ragged m or n: 14 needs the edge tiles of 4 and 2 columns, 15 and 63 all three (12, on the
# grid, the tile of 4); the other two dimensions span the grid's range.
GEMM_RAGGED_DIMS = (14, 15, 63)
GEMM_PARTNER_DIMS = (16, 64, 256, 1024, 4096, 16384)
QUICK_GEMM_RAGGED_DIMS = (14, 15)
QUICK_GEMM_PARTNER_DIMS = (16, 256, 4096)
GEMM_MAX_FLOPS = 2**28
# Stride pairs: widths whose float32 rows are 256 B to 8 KiB apart, at short and long m and k
# (the extra is per element of the right operand, so m spans it only as a check).
GEMM_ALIAS_N = (64, 128, 256, 512, 1024, 2048)
GEMM_ALIAS_MK = ((16, 512), (16, 2048), (128, 512), (128, 2048))
GEMM_ALIAS_SHIFT = 8
QUICK_GEMM_ALIAS_N = (64, 256, 1024)
QUICK_GEMM_ALIAS_MK = ((16, 2048), (128, 512))
QUICK_GEMM_MAX_FLOPS = 2**27
# A GEMM with a dimension this small or smaller (a convolution's: few filters, a narrow
# im2col) is timed up to SKINNY_MAX_FLOPS: its rate keeps changing as its long operand
# outgrows each cache, where a squarer one's has long settled.
SKINNY_DIM = 64
SKINNY_MAX_FLOPS = 2**30
LOOP_ELEMENTS = tuple(8**e for e in range(2, 9))  # 64 .. 16.8 M
QUICK_LOOP_ELEMENTS = (64, 2**12, 2**15, 2**18, 2**21, 2**24)
# The step benchmark (microbench.kernels.steps): random networks per thread count, and the
# (step, calls alone) samples of each.
STEP_NETWORKS = 15
# --quick's networks: the same draw less its steps above this many FLOPs (the two largest, 5.4
# and 13 GFLOP, take 0.3-0.6 s a step on a core of the 2-core VM; the 13 below, 0.5-77 ms of
# kernels, take about 9 s at two thread counts, against 7 s for the six first draws the quick
# sweep had timed)
QUICK_STEP_MAX_FLOPS = 2e9
STEP_ROUNDS = 7
QUICK_STEP_ROUNDS = 4
FULL_POLICY = SamplingPolicy(warmup=2, min_samples=5, max_samples=40, time_cap_s=0.01)
QUICK_POLICY = SamplingPolicy(warmup=1, min_samples=3, max_samples=15, time_cap_s=0.003)

# Inner-run lengths per kernel whose speed depends on one; others have run 1. A run's vector
# body and its scalar remainder cost differently (a run of 23 floats: two 8-wide vector
# iterations, then 7 scalar ones), so channel-like runs are measured at multiples of 8 and at
# remainders of 1 and 7 (calibration.kernel_tables interpolates between those classes).
CHANNEL_RUNS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 48, 63, 64, 128, 512)
QUICK_CHANNEL_RUNS = (1, 3, 7, 8, 9, 15, 16, 23, 24, 32, 63, 64, 512)
CHANNEL_KERNELS = frozenset(
    {"bias_act", "column_sum", "copy_runs", "col2im", "maxpool", "maxpool_backward",
     "maxpool_backward_tiled", "nchw_to_nhwc", "avgpool", "avgpool_backward",
     "global_avgpool", "global_avgpool_backward", "batchnorm", "batchnorm_eval",
     "batchnorm_backward"}
)  # fmt: skip
# Other kernels whose speed depends on a run, and the runs timed: classes, row bytes, widths
# (layernorm, embedding), block sizes (attention: sequences of 2 to 128 tokens of a 16-wide
# head), channels (batchnorm: fewer than the
# channel-like loops, whose runs set their vector remainders; batchnorm's channels are its
# vector axis too, but it runs after few of the layers).
_RUNS = {
    "softmax_xent": (2, 10, 100, 1000), "gather": (16, 256, 4096, 65536),
    **{k: (16, 64, 256, 768) for k in ("layernorm", "layernorm_backward", "embedding",
                                      "embedding_backward")},
    **{k: (64, 256, 1024, 4096, 16384, 65536, 262144) for k in ("attention",
                                                               "attention_backward")},
    **{k: (1, 3, 8, 16, 32, 64, 128, 512)
       for k in ("batchnorm", "batchnorm_eval", "batchnorm_backward")},
}  # fmt: skip
# im2col's run depends on the kernel, the channels and how many windows overhang the padding
# (microbench.kernels.calls.call_features): (kernel, padding, channels) settings spanning it.
IM2COL_SHAPES = ((1, 0, 1), (1, 0, 8), (1, 0, 64), (3, 1, 1), (3, 1, 3), (3, 0, 3), (3, 1, 8),
                 (3, 1, 16), (3, 1, 64), (5, 2, 1), (5, 2, 3), (5, 0, 8), (7, 3, 1), (7, 3, 3),
                 (3, 1, 256))  # fmt: skip
QUICK_IM2COL_SHAPES = ((1, 0, 8), (3, 1, 1), (3, 1, 3), (3, 1, 16), (3, 1, 64), (5, 2, 3),
                       (7, 3, 1), (7, 3, 3))  # fmt: skip
# Pool windows timed: (size, stride); tiled windows and overlapping ones.
POOL_WINDOWS = {"maxpool": ((2, 2), (3, 2)), "maxpool_backward": ((3, 2),),
                "maxpool_backward_tiled": ((2, 2),), "avgpool": ((2, 2), (3, 2)),
                "avgpool_backward": ((2, 2), (3, 2))}  # fmt: skip
# A channel-like point walks at most this many elements per channel (and at least 2**21): a
# loop over 16 M single-channel elements takes 0.1 s and matches no layer.
ELEMENTS_PER_RUN = 2**19


# An attention point holds at most this many (sample, head) blocks (a batch of 256 with 16
# heads): past it a call is more of the same blocks, which the table's law in elements prices,
# and a sweep of tiny blocks at the largest sizes (262,144 blocks of 2 tokens) took seconds.
ATTENTION_MAX_BLOCKS = 4096


def _within_cap(elements: int, channels: int) -> bool:
    return elements <= max(2**21, ELEMENTS_PER_RUN * channels)


def _blocks_within_cap(kernel: str, elements: int, run: int) -> bool:
    return not kernel.startswith("attention") or elements <= ATTENTION_MAX_BLOCKS * run


# Loops with a parallel driver (numba prange).
_PARALLEL = set(KERNEL_DIMS) - SERIAL_ONLY


@dataclass(frozen=True)
class KernelPlan:
    """What one sweep measures."""

    threads: tuple[int, ...]
    gemm_dims: tuple[int, ...] = GEMM_DIMS
    gemm_max_flops: float = GEMM_MAX_FLOPS
    gemm_ragged_dims: tuple[int, ...] = GEMM_RAGGED_DIMS
    gemm_partner_dims: tuple[int, ...] = GEMM_PARTNER_DIMS
    gemm_alias_n: tuple[int, ...] = GEMM_ALIAS_N
    gemm_alias_mk: tuple[tuple[int, int], ...] = GEMM_ALIAS_MK
    loop_elements: tuple[int, ...] = LOOP_ELEMENTS
    channel_runs: tuple[int, ...] = CHANNEL_RUNS
    im2col_shapes: tuple[tuple[int, int, int], ...] = IM2COL_SHAPES
    policy: SamplingPolicy = FULL_POLICY
    seed: int = 0
    step_networks: int = STEP_NETWORKS  # random networks of the step benchmark per thread count
    step_max_flops: float | None = None  # the draw less its steps above this (quick)
    step_rounds: int = STEP_ROUNDS  # (step, calls alone) samples of each


TURN_POINTS = 25  # points a thread count runs before the next count takes its turn
# A GEMM above one thread slower than this many times itself at one thread, plus this, waited
# for a descheduled core and is timed again (run_kernels).
STALL_FACTOR = 2.0
STALL_ALLOWANCE_S = 100e-6


class Pool:
    """A few large float32 buffers, filled once; a point's arrays are views into them, so the
    sweep allocates and fills nothing per point."""

    def __init__(self, elements: int, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.buffers = [rng.random(elements, dtype=np.float32) - 0.5 for _ in range(count)]

    def view(self, i: int, shape: tuple[int, ...]) -> np.ndarray:
        return self.buffers[i][: math.prod(shape)].reshape(shape)


# ----------------------------------------------------------------------------------- GEMM


def _within_limits(m: int, n: int, k: int, max_flops: float) -> bool:
    flops = SKINNY_MAX_FLOPS if min(m, n, k) <= SKINNY_DIM else max_flops
    return 2 * m * n * k <= flops and max(m * k, k * n, m * n) <= MAX_ELEMENTS


def gemm_shapes(dims: tuple[int, ...], max_flops: float) -> list[tuple[int, int, int]]:
    """The grid's (m, n, k) within the FLOP limits (``max_flops``; a skinny GEMM's own) and
    the operand limit."""
    return [key for key in itertools.product(dims, repeat=3) if _within_limits(*key, max_flops)]


def ragged_shapes(
    ragged: tuple[int, ...], partners: tuple[int, ...], max_flops: float
) -> list[tuple[int, int, int]]:
    """(m, n, k) with m or n ragged and the other two at ``partners``, within the limits."""
    shapes = []
    for d, other, k in itertools.product(ragged, partners, partners):
        shapes += [(d, other, k), (other, d, k)]
    return [key for key in shapes if _within_limits(*key, max_flops)]


def _gemm_fn(pool: Pool, layout: str, m: int, n: int, k: int) -> Callable[[], object]:
    a = pool.view(0, (k, m) if layout[0] == "t" else (m, k))
    b = pool.view(1, (n, k) if layout[1] == "t" else (k, n))
    a, b = (a.T if layout[0] == "t" else a), (b.T if layout[1] == "t" else b)
    c = pool.view(2, (m, n))
    matmul = np.matmul
    return lambda: matmul(a, b, out=c)


# ----------------------------------------------------------------------------------- loops


def loop_points(plan: KernelPlan, threads: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(kernel, variant, dims) to time at ``threads``: serial drivers and single-variant
    kernels at one thread, parallel drivers at every other count."""
    out = []
    for kernel in KERNEL_DIMS:
        if kernel.startswith("gemm_"):
            continue
        parallel = kernel in _PARALLEL
        if threads == 1:
            variant = kernel + "_serial" if parallel else kernel
        elif parallel:
            variant = kernel
        else:
            continue
        if kernel == "im2col":  # no cap per channel: k x k taps of few channels make a
            # first layer's columns as many as any (15 M values: 3 channels, 5 x 5, batch 256)
            for elements in plan.loop_elements:
                for shape in plan.im2col_shapes:
                    out.append((kernel, variant, im2col_dims(elements, shape)))
            continue
        channels = kernel in CHANNEL_KERNELS
        runs = _RUNS.get(kernel) or (plan.channel_runs if channels else (1,))
        for window in POOL_WINDOWS.get(kernel, ((2, 2),)):
            for elements in plan.loop_elements:
                for run in runs:
                    if (
                        run <= elements
                        and (not channels or _within_cap(elements, run))
                        and _blocks_within_cap(kernel, elements, run)
                    ):
                        out.append((kernel, variant, loop_dims(kernel, elements, run, window)))
    return out


# ----------------------------------------------------------------------------------- run


def _units(plan: KernelPlan, threads: int, pool: Pool) -> list[list[tuple[str, dict, Any]]]:
    """The points at ``threads`` in their shuffled order, in units that run one right after
    the other (a stride triple; else a single point)."""
    base = {"threads": threads}
    units: list[list[tuple[str, dict, Any]]] = []  # a stride triple is one unit: side by side

    def gemm(name: str, layout: str, m: int, n: int, k: int, **extra: int) -> tuple:
        params = {**base, "layout": layout, "m": m, "n": n, "k": k, "flops": 2 * m * n * k}
        return name, {**params, **extra}, (_gemm_fn, pool, layout, m, n, k)

    for layout in GEMM_LAYOUTS:
        shapes = gemm_shapes(plan.gemm_dims, plan.gemm_max_flops) + ragged_shapes(
            plan.gemm_ragged_dims, plan.gemm_partner_dims, plan.gemm_max_flops
        )
        units += [[gemm("gemm", layout, m, n, k)] for m, n, k in shapes]
        for n, (m, k) in itertools.product(plan.gemm_alias_n, plan.gemm_alias_mk):
            units.append([gemm("gemm_alias", layout, m, n + s, k, base_n=n, shift=s)
                          for s in (-GEMM_ALIAS_SHIFT, 0, GEMM_ALIAS_SHIFT)])  # fmt: skip
    for kernel, variant, dims in loop_points(plan, threads):
        elements, run = call_features(kernel, dims)
        params = {**base, "kernel": kernel, "variant": variant, "dims": list(dims),
                  "elements": elements, "run": run}  # fmt: skip
        units.append([("loop", params, (loop_fn, pool, kernel, variant, dims))])
    for workload, batch in step_workloads(plan.step_networks, plan.step_max_flops):
        params = {**base, "workload_json": json.dumps(workload.to_dict()), "batch": batch,
                  "op_calls": len(op_calls(workload))}  # fmt: skip
        units.append([("step", params, (workload, batch))])
    order = np.random.default_rng(plan.seed + threads).permutation(len(units))
    return [units[i] for i in order]


def run_kernels(
    plan: KernelPlan,
    writer: RecordWriter | None,
    progress: TextIO | None = None,
    status: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Time every point of ``plan`` at each of its thread counts; each record is written to
    ``writer`` as soon as it is measured (``progress``: a line per point; ``status``: a line
    per thread count).

    The thread counts take turns, a block of about :data:`TURN_POINTS` points each, their
    blocks sized so that all end together: a slow spell of a shared machine then lands on every
    count alike, and the ratios between them (how a kernel scales with threads) are measured
    side by side rather than minutes apart."""
    pool = Pool(MAX_ELEMENTS, 6, plan.seed)
    queues = {threads: _units(plan, threads, pool) for threads in plan.threads}
    for threads, units in queues.items():
        if status is not None:
            status(f"kernels at {threads} thread(s): {sum(map(len, units))} points")
    lengths = [len(units) for units in queues.values()]  # no count sits a turn out:
    turns = max(1, min(math.ceil(max(lengths) / TURN_POINTS), min(lengths)))
    compiled: dict[int, set[tuple[str, int]]] = {t: set() for t in queues}  # (variant, len(dims))
    results: list[Measurement] = []
    for turn in range(turns):
        for threads, units in queues.items():
            set_threads(threads)
            for unit in units[len(units) * turn // turns : len(units) * (turn + 1) // turns]:
                for point in unit:
                    results += _run_point(plan, threads, point, compiled[threads], writer,
                                          progress)  # fmt: skip
    return results + _retime_stalled(plan, queues, results, writer, progress)


def _retime_stalled(
    plan: KernelPlan,
    queues: dict[int, list[list[tuple[str, dict[str, Any], Any]]]],
    results: list[Measurement],
    writer: RecordWriter | None,
    progress: TextIO | None,
) -> list[Measurement]:
    """Time again, now, each GEMM or loop point above one thread that took more than
    :data:`STALL_FACTOR` x the same call at one thread (a loop: its serial driver) plus
    :data:`STALL_ALLOWANCE_S`: more threads share the work, and their wake-up costs tens of
    microseconds, so such a point waited for a descheduled core (a few milliseconds of a
    shared machine's steal stall every sample of a short point, which all fall within a
    millisecond). Its record is written again with ``retimed: true``, which the kernel model
    takes in place of the first."""
    timed = [m for m in results if m.name in _RETIMED]
    alone = {_point_key(m.name, m.params): m.median for m in timed if m.params["threads"] == 1}
    points = {
        (threads, _point_key(*point[:2])): point
        for threads, units in queues.items()
        for unit in units
        for point in unit
        if point[0] in _RETIMED
    }
    stalled = [
        m for m in timed
        if m.params["threads"] > 1
        and m.median > STALL_FACTOR * alone.get(_point_key(m.name, m.params), m.median)
        + STALL_ALLOWANCE_S
    ]  # fmt: skip
    out: list[Measurement] = []
    for threads in sorted({m.params["threads"] for m in stalled}):
        set_threads(threads)
        for m in (m for m in stalled if m.params["threads"] == threads):
            name, params, make = points[(threads, _point_key(m.name, m.params))]
            point = (name, {**params, "retimed": True}, make)
            out += _run_point(plan, threads, point, set(), writer, progress)
    return out


_RETIMED = ("gemm", "loop")  # the points a stall is looked for in


def _point_key(name: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """A GEMM's layout and shape, or a loop's kernel and dimensions: what the same call at
    another thread count shares."""
    if name == "loop":
        return name, params["kernel"], tuple(params["dims"])
    return name, params["layout"], params["m"], params["n"], params["k"]


def _run_point(
    plan: KernelPlan,
    threads: int,
    point: tuple[str, dict[str, Any], Any],
    compiled: set[tuple[str, int]],
    writer: RecordWriter | None,
    progress: TextIO | None,
) -> list[Measurement]:
    name, params, (make, *args) = point
    if name == "step":
        return _run_step(plan, params, make, *args, writer, progress)
    fn = make(*args)
    gemm = name.startswith("gemm")
    # A loop variant's first call compiles it (or loads it from numba's cache) and, at several
    # threads, starts numba's pool: untimed, outside the time cap too. Operands are filled when
    # a point is made, so after that a point's own warm-up is all it needs (a GEMM compiles
    # nothing).
    signature = None if gemm else (params["variant"], len(params["dims"]))
    if not plan.policy.warmup or (signature is not None and signature not in compiled):
        fn()
        compiled.add(signature)
    before = let_blas_threads_sleep if gemm and threads > 1 else None
    m = measure(timed(fn, before=before), plan.policy, benchmark="kernels", name=name,
                params=params)  # fmt: skip
    report_point(m, writer, progress, _label(name, params), policy=plan.policy.to_dict())
    return [m]


def _run_step(
    plan: KernelPlan,
    params: dict[str, Any],
    workload: Workload,
    batch: int,
    writer: RecordWriter | None,
    progress: TextIO | None,
) -> list[Measurement]:
    steps, alone = measure_step(workload, batch, plan.step_rounds)
    out = []
    for name, samples in (("step", steps), ("step_alone", alone)):
        m = Measurement(samples, benchmark="kernels", name=name, params=params,
                        warmup_discarded=2, stop_reason="rounds")  # fmt: skip
        report_point(m, writer, progress, _label(name, params), policy=plan.policy.to_dict())
        out.append(m)
    return out


def _label(name: str, p: dict[str, Any]) -> str:
    if name.startswith("gemm"):
        triple = " (stride triple)" if name == "gemm_alias" else ""
        what = f"gemm_{p['layout']} {p['m']}x{p['n']}x{p['k']}{triple}"
    elif name == "loop":
        what = f"{p['variant']} {p['dims']}"
    else:
        what = f"{name} {json.loads(p['workload_json'])['name']} b{p['batch']}"
    return f"t={p['threads']} {what:<44}"
