"""Host <-> device copies: H2D and D2H, from pinned and pageable host memory, at each size.

Timed as NVIDIA's ``bandwidthTest`` does: CUDA events on the current stream around one copy;
pinned buffers (``cupyx.empty_pinned``, page-locked) go through ``cudaMemcpyAsync``, pageable
ones (a plain numpy array) through ``cudaMemcpy``, which stages them through a driver buffer,
as ``cupy.asarray`` does with a numpy array in training. Both buffers are written before any
timing (first-touch page faults are not copy time), and each point's first copy is checked.

Records (benchmark "copies", name "h2d" or "d2h"), params: ``direction`` ("h2d"/"d2h"),
``pinned`` (bool), ``bytes``, ``device`` ("gpu"), ``gpu`` (device index). Without a GPU
nothing is measured: the command says so in one line and writes no file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from microbench.cli import BenchmarkError
from microbench.gpu import Gpu, event_timed
from microbench.measurement import Measurement
from microbench.records import RecordWriter
from microbench.sampling import SamplingPolicy, measure, report_point
from microbench.sizes import format_bytes, format_time, size_range

__all__ = [
    "DEFAULT_SIZES",
    "DIRECTIONS",
    "FULL_POLICY",
    "QUICK_POLICY",
    "QUICK_SIZES",
    "CopySummary",
    "format_summary",
    "run_copies",
    "summarize",
]

DIRECTIONS = ("h2d", "d2h")
DEFAULT_SIZES = tuple(size_range(4 << 10, 256 << 20, 2))
QUICK_SIZES = tuple(size_range(4 << 10, 256 << 20, 4))
FULL_POLICY = SamplingPolicy(warmup=5, min_samples=10, max_samples=500, time_cap_s=0.5)
QUICK_POLICY = SamplingPolicy(warmup=2, min_samples=5, max_samples=50, time_cap_s=0.05)
LARGE_BYTES = 16 << 20  # from here on, policy.fewer(LARGE_FACTOR)
LARGE_FACTOR = 10
_KINDS = tuple((direction, pinned) for direction in DIRECTIONS for pinned in (True, False))


class _Copy:
    """One direction, memory kind and size: buffers allocated and written, a copy callable."""

    def __init__(self, gpu: Gpu, direction: str, pinned: bool, nbytes: int) -> None:
        cp, rt = gpu.cupy, gpu.cupy.cuda.runtime
        if pinned:
            import cupyx

            self.host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        else:
            self.host = np.empty(nbytes, dtype=np.uint8)
        self.device = cp.empty(nbytes, dtype=cp.uint8)
        self.host.fill(0x5A if direction == "h2d" else 0)
        self.device.fill(0 if direction == "h2d" else 0xA5)
        gpu.synchronize()
        self.direction, self.nbytes, self.pinned = direction, nbytes, pinned
        host_ptr, device_ptr = int(self.host.ctypes.data), int(self.device.data.ptr)
        if direction == "h2d":
            self.args = (device_ptr, host_ptr, nbytes, rt.memcpyHostToDevice)
        else:
            self.args = (host_ptr, device_ptr, nbytes, rt.memcpyDeviceToHost)
        self.stream = cp.cuda.get_current_stream()
        self._cp, self._rt = cp, rt

    def __call__(self) -> None:
        if self.pinned:
            self._rt.memcpyAsync(*self.args, self.stream.ptr)
        else:
            self._rt.memcpy(*self.args)

    def check(self) -> bool:
        """Whether the destination holds the source's bytes (after at least one copy)."""
        self.stream.synchronize()
        step = max(1, self.nbytes // 4096)
        if self.direction == "h2d":
            return bool(np.all(self._cp.asnumpy(self.device[::step]) == 0x5A))
        return bool(np.all(self.host[::step] == 0xA5))


def run_copies(
    gpu: Gpu,
    sizes: Iterable[int],
    policy: SamplingPolicy,
    writer: RecordWriter | None,
    progress: TextIO | None = None,
) -> list[Measurement]:
    """Measure H2D and D2H, pinned and pageable, at each size; one record per point."""
    results = []
    for nbytes in sizes:
        point_policy = policy.fewer(LARGE_FACTOR) if nbytes >= LARGE_BYTES else policy
        for direction in DIRECTIONS:
            for pinned in (True, False):
                copy = _Copy(gpu, direction, pinned, nbytes)
                copy()
                if not copy.check():
                    raise BenchmarkError(
                        f"{direction} copy of {format_bytes(nbytes)} "
                        f"({'pinned' if pinned else 'pageable'}) delivered wrong bytes"
                    )
                params = {
                    "direction": direction,
                    "pinned": pinned,
                    "bytes": nbytes,
                    "device": "gpu",
                    "gpu": gpu.index,
                }
                m = measure(
                    event_timed(gpu, copy),
                    point_policy,
                    benchmark="copies",
                    name=direction,
                    params=params,
                )
                del copy
                gpu.release_pools()
                results.append(m)
                recorded = point_policy.to_dict()
                report_point(m, writer, progress, _label(m), policy=recorded, clock="cuda_event")
    return results


def _label(m: Measurement) -> str:
    p = m.params
    kind = "pinned" if p["pinned"] else "pageable"
    rate = p["bytes"] / m.median / 1e9
    return f"{p['direction']:<4}{kind:>9}{format_bytes(p['bytes']):>10}  {rate:8.2f} GB/s"


@dataclass(frozen=True)
class CopySummary:
    """Per direction and memory kind: latency at the smallest size, bandwidth at the largest."""

    direction: str
    pinned: bool
    smallest_bytes: int
    latency_s: float
    largest_bytes: int
    bandwidth_bytes_per_s: float


def summarize(records: Iterable[Mapping[str, Any]]) -> list[CopySummary]:
    """Summaries of the copies' "measurement" records (other records are ignored)."""
    points: dict[tuple[str, bool], list[tuple[int, float]]] = {}
    for record in records:
        if record.get("type") != "measurement" or record.get("benchmark") != "copies":
            continue
        p = record["params"]
        median = Measurement.from_record(record).median
        points.setdefault((p["direction"], bool(p["pinned"])), []).append((p["bytes"], median))
    summaries = []
    order = {(d, pinned): i for i, (d, pinned) in enumerate(_KINDS)}
    for (direction, pinned), values in sorted(points.items(), key=lambda kv: order[kv[0]]):
        values.sort()
        (small, latency), (large, time_s) = values[0], values[-1]
        summaries.append(CopySummary(direction, pinned, small, latency, large, large / time_s))
    return summaries


def format_summary(summaries: Iterable[CopySummary]) -> str:
    lines = [f"{'copy':<6}{'memory':>10}{'latency':>22}{'bandwidth':>24}"]
    for s in summaries:
        latency = f"{format_time(s.latency_s)} @ {format_bytes(s.smallest_bytes)}"
        bandwidth = f"{s.bandwidth_bytes_per_s / 1e9:.2f} GB/s @ {format_bytes(s.largest_bytes)}"
        kind = "pinned" if s.pinned else "pageable"
        lines.append(f"{s.direction:<6}{kind:>10}{latency:>22}{bandwidth:>24}")
    return "\n".join(lines)
