"""Gradient compression: what it costs to compress a float32 gradient and to expand it again.

Two methods, each timed on this machine's CPU with numpy, one phase at a time, at each gradient
size (the bytes of the dense float32 gradient, as a bucket holds it):

* ``fp16``: **compress** casts to float16 (half the bytes on the wire), **decompress** casts
  the received float16 back to float32.
* ``topk`` (density F, 1% by default: k = round(F n) of n elements, at least 1): **compress**
  takes |g|, ``np.argpartition`` for the k largest, gathers their values (float32) and indices
  (int32): 8 k bytes on the wire; **decompress** zeroes a dense gradient and scatter-adds one
  rank's k values into it; **scatter** is the scatter-add alone (each further rank's
  contribution, as an allgather delivers one per rank).

Output buffers are allocated once per point and reused, as a training loop's allocator does,
so the samples time the conversions, not page faults. Each point's result is checked once
before timing (the fp16 round trip within float16 rounding; top-k keeping exactly the k
largest magnitudes). Threads: numpy's element-wise kernels run on one core.

Records (benchmark "compression", name "<method>:<phase>"), params: ``method``, ``phase``,
``bytes`` (dense float32 gradient), ``elements``, ``density`` (top-k; null for fp16),
``wire_bytes`` (what one rank sends), ``device`` ("cpu"), ``threads`` (1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from microbench.cli import BenchmarkError
from microbench.measurement import Measurement
from microbench.records import RecordWriter
from microbench.sampling import SamplingPolicy, measure, report_point, timed
from microbench.sizes import format_bytes, format_time, size_range

__all__ = [
    "DEFAULT_DENSITY",
    "DEFAULT_SIZES",
    "FULL_POLICY",
    "METHODS",
    "PHASES",
    "QUICK_POLICY",
    "QUICK_SIZES",
    "Codec",
    "CompressionSummary",
    "buffer_bytes",
    "format_summary",
    "run_compression",
    "summarize",
]

METHODS = ("fp16", "topk")
PHASES = {"fp16": ("compress", "decompress"), "topk": ("compress", "decompress", "scatter")}
# Bytes a point holds at its peak per byte of its gradient (:class:`Codec`): the gradient and
# the dense result, and the float16 copy (fp16) or the magnitudes and argpartition's int64
# indices, twice the float32 bytes (top-k).
BUFFERS_PER_BYTE = {"fp16": 2.5, "topk": 5.0}
DEFAULT_DENSITY = 0.01
DEFAULT_SIZES = tuple(size_range(64 << 10, 64 << 20, 2))
QUICK_SIZES = tuple(size_range(64 << 10, 64 << 20, 4))
FULL_POLICY = SamplingPolicy(warmup=3, min_samples=10, max_samples=200, time_cap_s=0.5)
QUICK_POLICY = SamplingPolicy(warmup=1, min_samples=5, max_samples=30, time_cap_s=0.05)
LARGE_BYTES = 16 << 20  # from here on, policy.fewer(LARGE_FACTOR)
LARGE_FACTOR = 5
ELEMENT_BYTES = 4  # float32 gradients


def buffer_bytes(nbytes: int, methods: Iterable[str]) -> int:
    """The memory one point of the hungriest of ``methods`` holds at a gradient of ``nbytes``
    (:data:`BUFFERS_PER_BYTE`): what must be free before the sweep starts, or its last sizes
    fail as an allocation after the smaller ones were recorded."""
    return int(max(BUFFERS_PER_BYTE[method] for method in methods) * nbytes)


class Codec:
    """One method at one gradient size: the gradient, reused buffers and a callable per phase."""

    def __init__(self, method: str, nbytes: int, density: float = DEFAULT_DENSITY, seed: int = 0):
        if method not in METHODS:
            raise ValueError(f"unknown compression method {method!r}; known: {', '.join(METHODS)}")
        if nbytes < ELEMENT_BYTES or nbytes % ELEMENT_BYTES:
            raise ValueError(f"a float32 gradient needs a multiple of 4 bytes, got {nbytes}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        self.method, self.nbytes, self.density = method, nbytes, density
        self.n = nbytes // ELEMENT_BYTES
        self.grad = np.random.default_rng(seed).standard_normal(self.n, dtype=np.float32)
        self.dense = np.empty(self.n, dtype=np.float32)
        if method == "fp16":
            self.half = np.empty(self.n, dtype=np.float16)
            self.k = self.n
        else:
            self.k = max(1, round(density * self.n))
            self.magnitude = np.empty(self.n, dtype=np.float32)
            self.values = np.empty(self.k, dtype=np.float32)
            self.indices = np.empty(self.k, dtype=np.int32)
        self.phases: dict[str, Callable[[], None]] = {
            "compress": self.compress,
            "decompress": self.decompress,
        }
        if method == "topk":
            self.phases["scatter"] = self.scatter

    @property
    def wire_bytes(self) -> int:
        """Bytes one rank sends: float16 values, or float32 values plus int32 indices."""
        return 2 * self.n if self.method == "fp16" else 8 * self.k

    def compress(self) -> None:
        if self.method == "fp16":
            self.half[...] = self.grad
            return
        np.abs(self.grad, out=self.magnitude)
        top = np.argpartition(self.magnitude, self.n - self.k)[self.n - self.k :]
        self.indices[...] = top
        np.take(self.grad, top, out=self.values)

    def decompress(self) -> None:
        if self.method == "fp16":
            self.dense[...] = self.half
            return
        self.dense.fill(0.0)
        self.dense[self.indices] += self.values  # indices of one rank are distinct

    def scatter(self) -> None:
        self.dense[self.indices] += self.values

    def check(self) -> None:
        """Compress and decompress once; :class:`BenchmarkError` if the result is wrong."""
        self.compress()
        self.decompress()
        what = f"{self.method} of {format_bytes(self.nbytes)}"
        if self.method == "fp16":
            if not np.allclose(self.dense, self.grad, rtol=1e-3, atol=1e-4):
                raise BenchmarkError(f"{what}: the float16 round trip lost more than rounding")
            return
        kept = np.abs(self.grad[self.indices])
        nonzero = int(np.count_nonzero(self.dense))
        dropped = np.abs(np.delete(self.grad, self.indices))
        largest_dropped = float(dropped.max()) if dropped.size else 0.0
        if nonzero != self.k or float(kept.min()) < largest_dropped:
            raise BenchmarkError(f"{what}: top-k did not keep exactly the {self.k} largest")
        if not np.array_equal(self.dense[self.indices], self.grad[self.indices]):
            raise BenchmarkError(f"{what}: top-k decompression put values in the wrong places")


def run_compression(
    sizes: Iterable[int],
    policy: SamplingPolicy,
    writer: RecordWriter | None,
    progress: TextIO | None = None,
    methods: Iterable[str] = METHODS,
    density: float = DEFAULT_DENSITY,
) -> list[Measurement]:
    """Measure every phase of every method at each size; one record per point."""
    results = []
    for nbytes in sizes:
        point_policy = policy.fewer(LARGE_FACTOR) if nbytes >= LARGE_BYTES else policy
        for method in methods:
            codec = Codec(method, nbytes, density)
            codec.check()
            for phase, call in codec.phases.items():
                params = {
                    "method": method,
                    "phase": phase,
                    "bytes": nbytes,
                    "elements": codec.n,
                    "density": density if method == "topk" else None,
                    "wire_bytes": codec.wire_bytes,
                    "device": "cpu",
                    "threads": 1,
                }
                m = measure(
                    timed(call),
                    point_policy,
                    benchmark="compression",
                    name=f"{method}:{phase}",
                    params=params,
                )
                results.append(m)
                label = f"{method:<5}{phase:>11}{format_bytes(nbytes):>10}"
                report_point(m, writer, progress, label, policy=point_policy.to_dict())
    return results


@dataclass(frozen=True)
class CompressionSummary:
    """Per method and phase: time at the smallest size, throughput at the largest."""

    method: str
    phase: str
    smallest_bytes: int
    smallest_s: float
    largest_bytes: int
    bytes_per_s: float


def summarize(records: Iterable[Mapping[str, Any]]) -> list[CompressionSummary]:
    """Summaries of the "compression" measurement records (other records are ignored)."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for record in records:
        if record.get("type") != "measurement" or record.get("benchmark") != "compression":
            continue
        p = record["params"]
        median = Measurement.from_record(record).median
        points.setdefault((p["method"], p["phase"]), []).append((p["bytes"], median))
    out = []
    for (method, phase), values in sorted(points.items()):
        values.sort()
        (small, small_s), (large, large_s) = values[0], values[-1]
        out.append(CompressionSummary(method, phase, small, small_s, large, large / large_s))
    return out


def format_summary(summaries: Iterable[CompressionSummary]) -> str:
    lines = [f"{'method':<8}{'phase':<12}{'smallest':>22}{'throughput':>26}"]
    for s in summaries:
        small = f"{format_time(s.smallest_s)} @ {format_bytes(s.smallest_bytes)}"
        rate = f"{s.bytes_per_s / 1e9:.2f} GB/s @ {format_bytes(s.largest_bytes)}"
        lines.append(f"{s.method:<8}{s.phase:<12}{small:>22}{rate:>26}")
    return "\n".join(lines)
