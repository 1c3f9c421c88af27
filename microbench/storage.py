"""Storage: what writing one checkpoint file costs, at each file size.

Each repetition writes a float32 array of ``bytes`` exactly as ``pdlsim train`` writes a
checkpoint: serialised with ``np.savez`` into memory (the copy and the zip's CRC cost about as
much as the write itself at a megabyte), then :func:`microbench.fileio.atomic_write_bytes`,
i.e. a temporary file in the target directory, one ``write``, ``fsync``, a rename over the
previous file and an ``fsync`` of the directory. The rename replaces the file of the previous
repetition, so each repetition also frees one old file, as a training run's pruning of its
oldest checkpoint does. The data is drawn once per size, outside the timed region; the file is
removed after each size, and the scratch directory (``.microbench-storage-*`` inside
``--dir``) at the end, on error and interrupt too.

What it measures is this directory's file system and device as seen through the page cache
with a forced flush: latency (file creation, two fsyncs, rename) plus bytes over the write
bandwidth. A parallel file system on a cluster must be measured there.

Records (benchmark "storage", name "atomic_write"), params: ``bytes``, ``operation``
("atomic_write": temp file, write, fsync, rename, directory fsync), ``filesystem`` (type and
mount point of the directory, from ``/proc/self/mounts``; null where unknown), ``threads`` (1).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from microbench.cli import BenchmarkError
from microbench.fileio import atomic_write_bytes
from microbench.measurement import Measurement
from microbench.records import RecordWriter
from microbench.sampling import SamplingPolicy, measure, report_point, timed
from microbench.sizes import format_bytes, format_time, size_range

__all__ = [
    "DEFAULT_SIZES",
    "FULL_POLICY",
    "QUICK_POLICY",
    "QUICK_SIZES",
    "StorageSummary",
    "filesystem_of",
    "format_summary",
    "run_storage",
    "summarize",
]

DEFAULT_SIZES = tuple(size_range(64 << 10, 256 << 20, 2))
QUICK_SIZES = tuple(size_range(64 << 10, 16 << 20, 4))
FULL_POLICY = SamplingPolicy(warmup=2, min_samples=10, max_samples=100, time_cap_s=1.0)
QUICK_POLICY = SamplingPolicy(warmup=1, min_samples=5, max_samples=20, time_cap_s=0.1)
LARGE_BYTES = 16 << 20  # from here on, policy.fewer(LARGE_FACTOR)
LARGE_FACTOR = 5
SCRATCH_PREFIX = ".microbench-storage-"


def filesystem_of(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """``{"type", "mount_point", "device"}`` of the mount holding ``path`` (the longest mount
    point that contains it, from ``/proc/self/mounts``); None where that file is missing."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best: dict[str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount, kind = (f.replace("\\040", " ") for f in fields[:3])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= len(best["mount_point"])):
            best = {"type": kind, "mount_point": mount, "device": device}
    return best


def run_storage(
    sizes: Iterable[int],
    policy: SamplingPolicy,
    directory: Path,
    writer: RecordWriter | None,
    progress: TextIO | None = None,
) -> list[Measurement]:
    """Time an atomic, durable write of each size into a scratch directory inside
    ``directory``; one record per size. Nothing is left behind."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=directory))
    except OSError as exc:
        raise BenchmarkError(f"cannot create a scratch directory in {directory}: {exc}") from None
    filesystem = filesystem_of(scratch)
    rng = np.random.default_rng(0)
    results = []
    try:
        for nbytes in sizes:
            point_policy = policy.fewer(LARGE_FACTOR) if nbytes >= LARGE_BYTES else policy
            data = np.frombuffer(rng.bytes(nbytes - nbytes % 4), dtype=np.float32)
            path = scratch / f"storage-{nbytes}.bin"
            params = {
                "bytes": nbytes,
                "operation": "atomic_write",
                "filesystem": filesystem,
                "threads": 1,
            }
            try:
                m = measure(
                    timed(lambda path=path, data=data: _write_checkpoint_like(path, data)),
                    point_policy,
                    benchmark="storage",
                    name="atomic_write",
                    params=params,
                )
            except OSError as exc:  # a full disk, a file system gone read-only
                raise BenchmarkError(
                    f"writing {format_bytes(nbytes)} in {scratch}: {exc}"
                ) from None
            path.unlink(missing_ok=True)
            results.append(m)
            label = f"atomic write{format_bytes(nbytes):>10}"
            report_point(m, writer, progress, label, policy=point_policy.to_dict())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


@dataclass(frozen=True)
class StorageSummary:
    """Time at the smallest size (about the latency) and throughput at the largest."""

    smallest_bytes: int
    smallest_s: float
    largest_bytes: int
    bytes_per_s: float


def _write_checkpoint_like(path: Path, values: np.ndarray) -> None:
    """What ``pdlsim train``'s checkpoint writer does with its arrays: ``np.savez`` into
    memory, then one atomic, fsynced write."""
    buffer = io.BytesIO()
    np.savez(buffer, params=values)
    atomic_write_bytes(path, buffer.getvalue())


def summarize(records: Iterable[Mapping[str, Any]]) -> StorageSummary | None:
    """The summary of the "storage" measurement records (others ignored); None without any."""
    points = sorted(
        (int(r["params"]["bytes"]), Measurement.from_record(r).median)
        for r in records
        if r.get("type") == "measurement" and r.get("benchmark") == "storage"
    )
    if not points:
        return None
    (small, small_s), (large, large_s) = points[0], points[-1]
    return StorageSummary(small, small_s, large, large / large_s)


def format_summary(summary: StorageSummary | None) -> str:
    if summary is None:
        return "no storage points measured"
    return (
        f"atomic write: {format_time(summary.smallest_s)} @ {format_bytes(summary.smallest_bytes)}"
        f", {summary.bytes_per_s / 1e9:.3f} GB/s @ {format_bytes(summary.largest_bytes)}"
    )
