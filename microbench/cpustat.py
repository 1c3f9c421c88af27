"""CPU time the hypervisor took away: steal, from ``/proc/stat``.

On a virtual machine, "steal" is the time a virtual CPU was ready to run but the host ran
something else. It is invisible to every timer inside the guest and slows whatever is measured
meanwhile, so a measurement taken under steal is a measurement of the neighbours too. Reading
the counters before and after a measurement says how much of it was stolen. Where
``/proc/stat`` does not exist (not Linux) or has no steal column, there is no figure (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuTimes", "cpu_times", "steal_fraction"]


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate "cpu" line of ``/proc/stat``: every state's ticks, and steal's."""

    total_ticks: int
    steal_ticks: int


def cpu_times(path: str | Path = "/proc/stat") -> CpuTimes | None:
    try:
        first = Path(path).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return CpuTimes(total_ticks=sum(ticks), steal_ticks=ticks[7])


def steal_fraction(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """The share of CPU time stolen between two readings (None without both)."""
    if before is None or after is None:
        return None
    total = after.total_ticks - before.total_ticks
    return (after.steal_ticks - before.steal_ticks) / total if total > 0 else 0.0
