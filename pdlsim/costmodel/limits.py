"""What a hardware figure may be, in a preset, a file of one or a flag: the ranges of real
machines' links, times, FLOP rates, memory and power, and the checks that hold a figure or a
preset's text to them (:mod:`pdlsim.costmodel.presets` builds its presets with them).

A figure past its range is a typo or an overflow (``1e400`` reads as infinity, ``1e-300`` W is
no part's power); one where 0 means "none" is 0 or within its range, never a tiny positive
number that the arithmetic built on it would turn into nonsense.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from microbench.errors import UserError, unprintable

__all__ = [
    "FLOPS_RANGE",
    "MAX_LEAF_NODES",
    "MAX_NAME_CHARS",
    "MAX_OVERSUBSCRIPTION",
    "MAX_TIME_S",
    "MAX_WATTS",
    "MEMORY_RANGE_BYTES",
    "MIN_FRACTION",
    "MIN_TIME_S",
    "MIN_WATTS",
    "RATE_RANGE_BYTES_PER_S",
    "check_ranges",
    "check_text",
    "watts_problem",
]

# What a figure may be, in a preset or given in text (``--inter-bw 25GB/s``): a link of 1 B/s to
# 1 PB/s, a time up to about three centuries (an MTBF of a million hours is 3.6e9 s), a GPU of
# a megaFLOP/s to an exaFLOP/s, 1 MiB to 1 PiB of memory, 1 W to 100 kW of power (or 0: not
# given). Beyond them a number is a typo or an overflow (1e400 reads as infinity, 1e-300 W is no
# part's power), and the figures built on it would be nonsense. An assumed fraction (an
# efficiency) is at least MIN_FRACTION: a link or a GPU at a thousandth of its line rate is a
# typo, and the band drawn down to it would price steps a million times too long.
RATE_RANGE_BYTES_PER_S = (1.0, 1e15)
MAX_TIME_S = 1e10
# The shortest time a figure may be, unless 0 (none): a picosecond, past any latency or layer a
# machine has (a NIC's is a microsecond, a kernel launch a few); 1e-300 s is a typo.
MIN_TIME_S = 1e-12
FLOPS_RANGE = (1e6, 1e18)
MEMORY_RANGE_BYTES = (2**20, 2**50)
MIN_WATTS = 1.0
MAX_WATTS = 1e5
MIN_FRACTION = 1e-3
MAX_OVERSUBSCRIPTION = 1e6
MAX_LEAF_NODES = 1_000_000
MAX_NAME_CHARS = 200  # a preset's name: every report line and error that names it prints it


def watts_problem(value: float, what: str) -> str | None:
    """Why ``value`` is no power figure (a :class:`GpuPreset`'s ``board_power_w``, a power
    model's watts, ``--gpu-watts``): None for 0 (none drawn, or not given) or
    :data:`MIN_WATTS` to :data:`MAX_WATTS`; else the problem, naming ``what``. One rule for
    every watts figure, from a file or a flag."""
    if value == 0 or MIN_WATTS <= value <= MAX_WATTS:
        return None
    return (f"{what} must be 0 or {MIN_WATTS:g} to {MAX_WATTS:,.0f} watts, got {value:g}; "
            "give the figure in watts")  # fmt: skip


def check_ranges(what: str, entry: Any, ranges: Mapping[str, tuple[float, float]],
                  optional: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Each field of ``entry`` named in ``ranges`` within its (low, high); the ``optional``
    ones may also be 0 (none)."""
    for name, (low, high) in ranges.items():
        value = getattr(entry, name)
        if name in optional and value == 0:
            continue
        if not low <= value <= high:
            zero = "0 (none) or " if name in optional and low > 0 else ""
            raise UserError(
                f"{what}: {name} must be {zero}{low:g} to {high:g}, got {value:g}; "
                "give the figure in its unit (bytes, seconds, FLOP/s, watts)"
            )


def check_text(where: str, name: str, value: Any) -> None:
    """A preset's text fields printable (a newline or a terminal escape would break the report
    and the one-line errors that print them); its ``name`` not empty and at most
    :data:`MAX_NAME_CHARS` long, as a workload's is."""
    for text in [value] if isinstance(value, str) else value:
        problem = unprintable(text)
        if problem:
            raise UserError(f"{where}.{name}: {problem}; use letters, digits and punctuation")
    if name == "name" and not value.strip():
        raise UserError(f"{where}.name: a preset's name is empty; give it one")
    if name == "name" and len(value) > MAX_NAME_CHARS:
        raise UserError(
            f"{where}.name: is {len(value):,} characters long; give at most {MAX_NAME_CHARS}"
        )
