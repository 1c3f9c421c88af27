"""Message and buffer sizes on the command line: ``8:64MiB``, ``1KiB,64KiB,1MiB``, ``8:1MiB:4``.

Grammar (units are binary and case-insensitive: B, KiB, MiB, GiB; a bare number is bytes)::

    sizes := item ("," item)*
    item  := size | size ":" size [":" factor]
    size  := digits [unit]

``LOW:HIGH`` is the geometric series LOW, LOW*2, LOW*4, ... up to HIGH, and ``LOW:HIGH:4`` the
same with factor 4 (powers of four). HIGH is always included, even when the series steps over
it (``8:64MiB:4`` ends 8 MiB, 32 MiB, 64 MiB), so a range ends where it says. The sizes of the
whole list must be strictly ascending; anything else is a :class:`SizeError` whose message is
one line that names the offending item.
"""

from __future__ import annotations

import re

from .errors import shown_text

__all__ = ["SizeError", "check_digits", "format_bytes", "parse_size", "parse_sizes", "size_range"]

UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")


class SizeError(ValueError):
    """A size list that does not parse or is not ascending (one-line message)."""


# What a size that is not a whole number of bytes looks like: a sign, a fraction or an
# exponent, nan or inf
_NEGATIVE = re.compile(r"\s*-\s*[\d.]")
_FRACTION = re.compile(r"\s*\+?(\d*\.\d*|\d+(\.\d*)?e[+-]?\d+)\s*[A-Za-z]*\s*", re.I)
_NOT_FINITE = re.compile(r"\s*\+?(nan|inf)", re.I)
MAX_SIZE_DIGITS = 100  # far past any memory; int() refuses past 4,300


def parse_size(text: str) -> int:
    """``"64KiB"`` -> 65536. Raises :class:`SizeError` on anything else, with what is wrong:
    a negative size, one that is not a whole number, a number past any memory, a unit."""
    shown = repr(shown_text(text.strip()))
    match = _SIZE.fullmatch(text)
    if match is None:
        if _NEGATIVE.match(text):
            raise SizeError(f"bad size {shown}: a size cannot be negative; give e.g. 64KiB")
        if _FRACTION.fullmatch(text):
            raise SizeError(
                f"bad size {shown}: a size is a whole number of B, KiB, MiB or GiB; give e.g. "
                "1536MiB, not 1.5GiB"
            )
        if _NOT_FINITE.match(text):
            raise SizeError(f"bad size {shown}: a size is a whole number of bytes, e.g. 64KiB")
        raise SizeError(f"bad size {shown}: expected a number with B, KiB, MiB or GiB")
    digits, unit = match.groups()
    factor = UNITS.get(unit.lower() if unit else "b")
    if factor is None:
        raise SizeError(f"bad size {shown}: unknown unit {shown_text(unit)!r} (B, KiB, MiB or GiB)")
    return check_digits(digits, text) * factor


def check_digits(digits: str, text: str) -> int:
    """``digits`` (of the size ``text``) as an int; a :class:`SizeError` past
    :data:`MAX_SIZE_DIGITS` digits, which no memory holds (and ``int`` refuses past 4,300)."""
    if len(digits.lstrip("0")) > MAX_SIZE_DIGITS:
        shown = repr(shown_text(text.strip()))
        raise SizeError(f"bad size {shown}: {len(digits):,} digits is past any memory")
    return int(digits)


def size_range(low: int, high: int, factor: int = 2) -> list[int]:
    """``low, low*factor, ...`` while below ``high``, then ``high``."""
    if low < 1:
        raise SizeError(f"a range must start at 1 byte or more, got {low}")
    if high < low:
        raise SizeError(f"range {format_bytes(low)}:{format_bytes(high)} ends below its start")
    if factor < 2:
        raise SizeError(f"range factor must be an integer >= 2, got {factor}")
    sizes = []
    size = low
    while size < high:
        sizes.append(size)
        size *= factor
    sizes.append(high)
    return sizes


def parse_sizes(text: str, *, multiple_of: int = 1, minimum: int = 1) -> tuple[int, ...]:
    """Parse a size list (see the module docstring) into strictly ascending byte counts.

    ``multiple_of``: every size must be a multiple of it (4 for float32 buffers).
    ``minimum``: the smallest size allowed.
    """
    sizes: list[int] = []
    items = text.split(",")
    if not text.strip():
        raise SizeError("empty size list")
    for item in items:
        if not item.strip():
            raise SizeError(f"empty item in size list {text!r}")
        parts = item.split(":")
        if len(parts) == 1:
            new = [parse_size(parts[0])]
        elif len(parts) in (2, 3):
            low, high = parse_size(parts[0]), parse_size(parts[1])
            factor_text = parts[2].strip() if len(parts) == 3 else "2"
            if not factor_text.isdecimal():
                raise SizeError(f"bad range {item.strip()!r}: the factor must be an integer")
            if high < low:
                raise SizeError(f"sizes out of order: range {item.strip()!r} ends below its start")
            new = size_range(low, high, check_digits(factor_text, item))
        else:
            raise SizeError(f"bad range {item.strip()!r}: expected LOW:HIGH or LOW:HIGH:FACTOR")
        for size in new:
            if size < minimum:
                raise SizeError(
                    f"size {format_bytes(size)} in {item.strip()!r} is below the "
                    f"minimum of {format_bytes(minimum)}"
                )
            if size % multiple_of:
                raise SizeError(
                    f"size {format_bytes(size)} in {item.strip()!r} is not a multiple of "
                    f"{multiple_of} bytes"
                )
            if sizes and size <= sizes[-1]:
                raise SizeError(
                    f"sizes out of order: {format_bytes(size)} ({item.strip()!r}) after "
                    f"{format_bytes(sizes[-1])}; list them ascending, each once"
                )
            sizes.append(size)
    return tuple(sizes)


def format_bytes(n: int) -> str:
    """Binary units, exact where the value is a whole number of them: 8 B, 64 KiB, 1.5 MiB."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            value = n / factor
            return f"{value:.0f} {unit}" if n % factor == 0 else f"{value:.4g} {unit}"
    return f"{n} B"


def format_time(seconds: float) -> str:
    """Seconds with an SI prefix: 4.21 us, 12.3 ms."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
