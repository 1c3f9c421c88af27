"""What memory this process may still use, read from the kernel: sizes of buffers and data sets
(the triad's arrays, the node fill's streams, a training run's synthetic samples) are kept
below it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["available_memory_bytes"]


def available_memory_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, or less under a cgroup limit."""
    values = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                values.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            values.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(values) if values else None
