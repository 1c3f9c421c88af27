"""The types of arguments a Python caller passes: one check per kind of value.

The command lines' parsers hand every setting over with its type already right; a script does
not (``batch="32"``, ``nodes=2.5``, ``overlap="no"``, ``sizes="1024"``). Each checker here
returns the value in its one canonical type (numpy integers and floats become Python's, an
integral float such as ``32.0`` an ``int``, a list a tuple) or raises
:class:`ArgumentTypeError`: one line that names the argument, what it must be and what it got,
instead of a comparison failing somewhere deep inside (``'<' not supported between instances of
'str' and 'int'``) or, worse, a wrong value taken silently (``"no"`` is true).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from typing import Any

from microbench.errors import UserError, shown_value

# Samples per step on one rank, wherever a batch is given (a benchmark's, a prediction's): above
# it the arrays outgrow any machine's memory before anything is learnt, so it is a typo.
MAX_BATCH = 2**24

__all__ = [
    "MAX_BATCH",
    "ArgumentTypeError",
    "check_flag",
    "check_integer",
    "check_integers",
    "check_number",
    "check_name",
    "check_numbers",
    "check_text",
    "shown",
]


class ArgumentTypeError(UserError, TypeError):
    """An argument of the wrong type: a :class:`UserError` (one line) and a ``TypeError``."""


def shown(value: Any) -> str:
    """``value`` as an error message names it: its type and a short ``repr``."""
    return f"{type(value).__name__} {shown_value(value)}"


def check_integer(name: str, value: Any) -> int:
    """``value`` as an ``int``: an integer (not a bool) or a float with no fraction."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and float(value).is_integer()
    ):
        return int(value)
    raise ArgumentTypeError(f"{name} must be an integer, got {shown(value)}")


def check_number(name: str, value: Any) -> float:
    """``value`` as a ``float``: any real number but a bool (range checks come later)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ArgumentTypeError(f"{name} must be a number, got {shown(value)}")


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a ``bool``: True or False (numpy's too), not a truthy string or number."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ArgumentTypeError(f"{name} must be True or False, got {shown(value)}")


def check_text(name: str, value: Any, example: str = "") -> str:
    """``value`` as a ``str``: a string or a path (``os.PathLike``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    like = f" like {example}" if example else ""
    raise ArgumentTypeError(f"{name} must be a string{like}, got {shown(value)}")


def check_name(name: str, value: Any, example: str = "") -> str:
    """``value`` as :func:`check_text` takes it, and not blank: a setting that names something
    (a preset, a file, an algorithm). An empty name would else read as "not given" wherever
    ``name or default`` picks the default, the user's value dropped without a word."""
    text = check_text(name, value, example)
    if not text.strip():
        like = f", e.g. {example}" if example else ""
        raise ArgumentTypeError(f"{name} is empty; give a value{like} or leave it out")
    return text


def _listed(name: str, values: Any, what: str) -> list[Any]:
    if isinstance(values, (str, bytes, os.PathLike)) or not isinstance(values, Iterable):
        raise ArgumentTypeError(f"{name} must be a list of {what}, got {shown(values)}")
    listed = list(values)
    if not listed:
        raise ArgumentTypeError(f"{name} must be a non-empty list of {what}, got an empty one")
    return listed


def check_integers(name: str, values: Any, length: int | None = None) -> tuple[int, ...]:
    """``values`` (a list or tuple; ``length`` of them where given) as a tuple of ints."""
    listed = _listed(name, values, "integers")
    if length is not None and len(listed) != length:
        raise ArgumentTypeError(f"{name} must be {length} integers, got {len(listed)}")
    return tuple(check_integer(f"{name}[{i}]", v) for i, v in enumerate(listed))


def check_numbers(name: str, values: Any, length: int | None = None) -> tuple[float, ...]:
    """``values`` (a list or tuple; ``length`` of them where given) as a tuple of floats."""
    listed = _listed(name, values, "numbers")
    if length is not None and len(listed) != length:
        raise ArgumentTypeError(f"{name} must be {length} numbers, got {len(listed)}")
    return tuple(check_number(f"{name}[{i}]", v) for i, v in enumerate(listed))
