"""The machine's memory as the kernel reports it: the one place that reads ``/proc/meminfo``
and the cgroup's ``memory.max`` and ``memory.current``.

Two questions, two answers: :func:`available_memory_bytes` is what this process may still
allocate now (sizes of buffers and data sets: the triad's arrays, the node fill's streams, a
training run's synthetic samples are kept below it); :func:`usable_memory_bytes` is what a
process may hold at most on a machine, this one or one its records describe (a batch or a
message that could never fit is refused with it, whatever else runs at the moment).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "activations_problem",
    "available_memory_bytes",
    "cgroup_memory_limit_bytes",
    "memory_total_bytes",
    "usable_memory_bytes",
]

_CGROUP = Path("/sys/fs/cgroup")


def _meminfo_bytes(field: str) -> int | None:
    """``field`` of ``/proc/meminfo`` (MemTotal, MemAvailable) in bytes, or None."""
    try:
        for line in Path("/proc/meminfo").read_text(errors="replace").splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # the kernel's "kB" is KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory_limit_bytes() -> int | None:
    """This container's memory limit (cgroup v2 ``memory.max``); None when unlimited or
    unknown."""
    try:
        value = (_CGROUP / "memory.max").read_text().strip()
        return None if value == "max" else int(value)
    except (OSError, ValueError):
        return None


def memory_total_bytes() -> int | None:
    """The machine's memory: MemTotal, else the page count times the page size."""
    total = _meminfo_bytes("MemTotal")
    if total is not None:
        return total
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, or less under a cgroup limit."""
    values = [v for v in (_meminfo_bytes("MemAvailable"),) if v is not None]
    limit = cgroup_memory_limit_bytes()
    if limit is not None:
        try:
            used = int((_CGROUP / "memory.current").read_text())
            values.append(max(0, limit - used))
        except (OSError, ValueError):
            pass
    return min(values) if values else None


def usable_memory_bytes(machine: Mapping[str, Any] | None = None) -> int | None:
    """The memory a process may use at most: the smaller of the cgroup's limit and the
    machine's total, of ``machine`` (metadata as :func:`microbench.machine.machine_metadata`
    records it) or, without it, of this machine now; None where neither is known."""
    if machine is None:
        machine = {"memory_limit_bytes": cgroup_memory_limit_bytes(),
                   "memory_total_bytes": memory_total_bytes()}  # fmt: skip
    known = [machine.get(k) for k in ("memory_limit_bytes", "memory_total_bytes")]
    known = [int(v) for v in known if isinstance(v, (int, float)) and v > 0]
    return min(known) if known else None


def activations_problem(flag: str, batches: Iterable[int], workloads: Iterable[Any]) -> str | None:
    """Why a training step of one of ``workloads`` (objects with ``name`` and
    ``activation_bytes_per_sample``, as :class:`microbench.workload.Workload` has them) at the
    largest of ``batches``, given by ``flag``, can never run here: its activations alone take
    more than :func:`usable_memory_bytes`. None where every one fits or the memory is unknown.
    Asked before a benchmark records anything, so that a batch with extra zeros is named as
    the culprit at once rather than failing as an allocation once the points before it are
    written."""
    memory = usable_memory_bytes()
    batch = max(batches, default=0)
    if memory is None or batch < 1:
        return None
    for workload in workloads:
        per_sample = workload.activation_bytes_per_sample
        if per_sample > memory:  # no batch helps: the workload is the culprit
            return (
                f"{workload.name}'s activations alone take {per_sample / 2**30:,.1f} GiB per "
                f"sample, more than this machine's {memory / 2**30:,.1f} GiB at any {flag}; "
                "give a smaller workload"
            )
        if batch * per_sample > memory:
            return (
                f"{flag} {batch:,}: {workload.name}'s activations alone take "
                f"{batch * per_sample / 2**30:,.1f} GiB, more than this machine's "
                f"{memory / 2**30:,.1f} GiB; give a smaller {flag}"
            )
    return None
