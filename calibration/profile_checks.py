"""Checks that a profile document makes sense, each failure one line naming the field.

A profile is written by pdlsim but may be edited, copied between machines or truncated, and the
simulator must never run on nonsense. The checks are generic, so that a model section written
by any modeler is covered without this module importing it:

* every number is finite (JSON has no NaN, but Python's reader accepts ``NaN`` and ``Infinity``)
  and at most :data:`MAX_MAGNITUDE` either way (``1e300`` read as a count is no number numpy
  takes);
* units in names carry the rules: names ending in ``_bytes_per_s`` or ``flops_per_s`` are
  throughputs and must be > 0; other names ending in ``_s`` or ``_s_per_byte`` are times and
  must be >= 0 (a negative latency is a failed fit, not a fast network);
* an interval must contain its value, in each of the shapes the modelers write: a sibling
  ``"<name>_interval"`` or ``"<stem>_ci"`` (``alpha_ci`` belongs to ``alpha_s``), an
  ``"intervals": {"<name>": ...}`` mapping next to the values, or one ``{"value", "low",
  "high"}`` object; an interval is ``{"low", "high", ...}`` or ``[low, high]``, its
  ``confidence`` (where given) a fraction strictly between 0 and 1;
* each model section has the keys its consumer reads (:data:`REQUIRED_MODEL_KEYS`), none of
  them empty (a compute model of no device was a KeyError traceback at the first prediction);
* the machine's counts (:data:`MACHINE_COUNTS`: cores, memory) are whole numbers >= 1 or null,
  as the recorder writes them (a core count of -1 or "16" was taken, and printed);
* with an example (the packaged profiles' fields), a number where they only hold numbers and a
  string where they only hold strings;
* every string printable: a CPU's name or a model's law is printed in a report, where a newline
  or a terminal escape would break its lines.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

from microbench.errors import UserError, shown_text, unprintable

__all__ = [
    "ITEM",
    "FieldError",
    "NUMBER",
    "OTHER",
    "REQUIRED_MODEL_KEYS",
    "ProfileError",
    "TEXT",
    "MACHINE_COUNTS",
    "NULLABLE_MODELS",
    "check_machine",
    "check_models",
    "check_tree",
    "is_number",
    "shown",
]

# The keys each model section must hold (what the simulator reads); None: the section may be
# null (transfer, on a machine without a GPU).
REQUIRED_MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "collectives": ("collectives",),  # calibration.communication.CollectiveModels
    "compute": ("devices", "table"),
    "transfer": ("directions",),
    "jitter": ("family", "params", "quantiles"),
    "overlap": ("methods",),
}
NULLABLE_MODELS = frozenset({"transfer"})
# The machine's figures that are counts (microbench.machine records them, or null where it
# cannot tell), read by predictions (cores per node, host memory).
MACHINE_COUNTS = ("logical_cores", "physical_cores", "cores_available", "memory_total_bytes",
                  "memory_limit_bytes")  # fmt: skip
# The largest number a profile holds, either way: a node's FLOP rate is 1e16, a count past
# 1e18 no longer fits the integers numpy computes with (the JSON reader's limit on whole
# numbers, microbench.fileio.MAX_INT_DIGITS, is the same).
MAX_MAGNITUDE = 1e18
_REL_TOL = 1e-9  # intervals are compared with this slack for float rounding


class ProfileError(UserError):
    """A profile that cannot be used: ``<file>: <field path>: <problem>``, one line."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        shown_field = ".".join(shown_text(key) for key in field.split("."))  # a pasted key
        where = f"{source}: {shown_field}" if field else source
        message = f"{where}: {problem}" if where else problem
        super().__init__(message.replace("\n", " "))


class FieldError(ValueError):
    """Raised by a modeler's ``from_dict`` on a value it can read but must not use (levels out
    of order, a slowdown of zero): ``field``, relative to the section, and the ``problem``;
    :func:`calibration.profile_schema.explain_build_failure` names the profile and the path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}" if field else problem)

    def within(self, key: str) -> FieldError:
        """The same error, its field one level down in ``key``."""
        return FieldError(_join(key, self.field) if self.field else key, self.problem)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def whole_count(field: str, value: Any, least: int) -> int:
    """``value``, a stored count, as an int; :class:`FieldError` on ``field`` where it is not
    a whole number of at least ``least`` (a JSON number or null shown as written)."""
    if type(value) is not int or value < least:
        got = json.dumps(value) if value is None or is_number(value) else shown(value)
        raise FieldError(field, f"must be a whole number >= {least}, got {got}")
    return value


def is_number(value: Any) -> bool:
    """A plain JSON number: an int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers_only(items: list | tuple) -> bool:
    """Whether every element is a plain JSON number (int or float, not bool)."""
    return all(map(is_number, items))


def number_rows(node: Any) -> bool:
    """Whether ``node`` is a list of non-empty lists of finite plain numbers (a table's points:
    a GEMM table holds some 20,000 rows of four), tested without a Python call per value."""
    if not isinstance(node, list) or not node or set(map(type, node)) != {list} or not all(node):
        return False
    values = itertools.chain.from_iterable
    return set(map(type, values(node))) <= {int, float} and all(map(math.isfinite, values(node)))


def _check_unit(source: str, field: str, name: str, value: float) -> None:
    """The sign rule that the unit suffix of ``name`` implies."""
    if name.endswith("_bytes_per_s") or name.endswith("flops_per_s"):
        if value <= 0:
            raise ProfileError(source, field, f"a throughput must be > 0, got {value!r}")
    elif name.endswith("_s") or name.endswith("_s_per_byte"):
        if value < 0:
            raise ProfileError(source, field, f"a time must be >= 0, got {value!r}")


def _interval_bounds(source: str, field: str, interval: Any) -> tuple[float, float]:
    if isinstance(interval, Mapping) and "low" in interval and "high" in interval:
        low, high = interval["low"], interval["high"]
    elif isinstance(interval, (list, tuple)) and len(interval) == 2:
        low, high = interval
    else:
        raise ProfileError(source, field, "an interval must be {low, high} or [low, high]")
    if not (is_number(low) and is_number(high)):
        raise ProfileError(source, field, "interval bounds must be numbers")
    if low > high:
        raise ProfileError(source, field, f"interval low {low!r} is above high {high!r}")
    level = interval.get("confidence") if isinstance(interval, Mapping) else None
    if level is not None and not (is_number(level) and 0 < level < 1):  # printed as a percent
        raise ProfileError(
            source, _join(field, "confidence"), f"a confidence level is a fraction between 0 "
            f"and 1 (0.95), got {json.dumps(level) if is_number(level) else shown(level)}"
        )  # fmt: skip
    return float(low), float(high)


def _check_contains(source: str, field: str, value: Any, interval: Any) -> None:
    low, high = _interval_bounds(source, field, interval)
    if not is_number(value):
        return
    slack = _REL_TOL * max(abs(low), abs(high), abs(value))
    if not low - slack <= value <= high + slack:
        raise ProfileError(
            source, field, f"interval [{low!r}, {high!r}] does not contain its value {value!r}"
        )


def _value_of(node: Mapping[str, Any], stem: str) -> str | None:
    """The key an interval named after ``stem`` belongs to: ``stem`` itself, or the one numeric
    key that is ``stem`` with a unit (``alpha_ci`` -> ``alpha_s``)."""
    if stem in node:
        return stem
    found = [k for k, v in node.items() if k.startswith(stem + "_") and is_number(v)]
    return found[0] if len(found) == 1 else None


def _check_intervals(source: str, path: str, node: Mapping[str, Any]) -> None:
    if {"value", "low", "high"} <= node.keys():
        _check_contains(source, path, node["value"], node)
    for key, item in node.items():
        if not isinstance(key, str) or item is None:
            continue
        for suffix in ("_interval", "_ci"):
            if key.endswith(suffix):
                name = _value_of(node, key[: -len(suffix)])
                if name is not None:
                    _check_contains(source, _join(path, key), node[name], item)
                else:
                    _interval_bounds(source, _join(path, key), item)
    intervals = node.get("intervals")
    if isinstance(intervals, Mapping):
        for name, item in intervals.items():
            field = _join(_join(path, "intervals"), name)
            if item is None:
                continue
            if name in node:
                _check_contains(source, field, node[name], item)
            else:
                _interval_bounds(source, field, item)


# Keys of an example trie (:func:`calibration.profile_schema.reference_fields`) that are not
# field names: a number was seen here, a string was seen here, something else (an object, a
# list, a boolean) was seen here, and list elements.
NUMBER, TEXT, OTHER, ITEM = object(), object(), object(), "[]"


def check_tree(
    source: str, node: Any, path: str = "", name: str = "", example: Mapping | None = None
) -> None:
    """Walk ``node``: numbers finite and signed as their names say, intervals contain values,
    and, with an ``example`` trie, a number wherever the example only ever has numbers and a
    string wherever it only ever has strings (a list there would fail deep in the simulator).

    ``name`` is the key the node sits under (list items inherit their list's name, so that
    ``"time_s": [..]`` checks every element as a time).
    """
    _check_kind(source, path, node, example)
    if is_number(node):
        if not math.isfinite(node):
            raise ProfileError(source, path, f"{node!r} is not a finite number")
        _check_size(source, path, node)
        _check_unit(source, path, name, node)
        return
    if isinstance(node, Mapping):
        for key, item in node.items():
            if not isinstance(key, str):
                raise ProfileError(source, path, f"key {key!r} is not a string")
            sub = example.get(key) if example is not None else None
            check_tree(source, item, _join(path, key), key, sub)
        _check_intervals(source, path, node)
    elif isinstance(node, (list, tuple)):
        sub = example.get(ITEM) if example is not None else None
        if number_rows(node) and _plain_rows(source, path, node, sub):
            return  # a table of rows of numbers, checked as one
        if _numbers_only(node) and all(map(math.isfinite, node)):
            if node:
                _check_kind(source, _join(path, 0), node[0], sub)
                big = max(node, key=abs)
                _check_size(source, _join(path, node.index(big)), big)
                if (low := min(node)) <= 0:  # the sign rule, on the smallest value
                    _check_unit(source, _join(path, node.index(low)), name, low)
            return  # a long table of numbers is checked without a call per value
        for i, item in enumerate(node):
            check_tree(source, item, _join(path, i), name, sub)
    elif isinstance(node, str):
        problem = unprintable(node)  # a CPU's name is printed in every prediction's sources
        if problem:
            raise ProfileError(source, path, problem)
    elif node is not None:
        raise ProfileError(source, path, f"unexpected value of type {type(node).__name__}")


def _plain_rows(source: str, path: str, rows: list[list[float]], example: Mapping | None) -> bool:
    """For :func:`check_tree`: whether the table ``rows`` (:func:`number_rows`) passes with its
    first row checked alone, as it does when each value is within :data:`MAX_MAGNITUDE` and
    above 0 (no sign rule can fail): every row is a list and every value a number, so each has
    the first's kind. False where a value needs the row-by-row check, which names it."""
    values = itertools.chain.from_iterable
    if max(map(abs, values(rows))) > MAX_MAGNITUDE or min(values(rows)) <= 0:
        return False
    _check_kind(source, _join(path, 0), rows[0], example)
    inner = example.get(ITEM) if example is not None else None
    _check_kind(source, _join(_join(path, 0), 0), rows[0][0], inner)
    return True


def _check_size(source: str, path: str, value: float) -> None:
    """``value`` within :data:`MAX_MAGNITUDE` either way (a count read as ``int(1e300)`` would
    be past the integers numpy takes)."""
    if abs(value) > MAX_MAGNITUDE:
        raise ProfileError(
            source, path, f"{value!r} is past any measured figure (at most 1e18 either way)"
        )


def _check_kind(source: str, path: str, node: Any, example: Mapping | None) -> None:
    """``node`` (not null) of the kind the ``example`` trie only ever has at its field: a
    number, or a string."""
    if node is None or example is None or OTHER in example:
        return
    if NUMBER in example and TEXT not in example and not is_number(node):
        raise ProfileError(source, path, f"expected a number, got {shown(node)}")
    if TEXT in example and NUMBER not in example and not isinstance(node, str):
        raise ProfileError(source, path, f"expected a string, got {shown(node)}")


def check_machine(source: str, machine: Mapping[str, Any]) -> None:
    """The machine's counts (:data:`MACHINE_COUNTS`) whole numbers >= 1, or null (unknown)."""
    for key in MACHINE_COUNTS:
        value = machine.get(key)
        if value is not None and (type(value) is not int or value < 1):
            got = json.dumps(value) if is_number(value) else shown(value)
            raise ProfileError(
                source, f"machine.{key}", f"must be a whole number >= 1 or null, got {got}"
            )


def shown(value: Any) -> str:
    """``value`` for a message: a string quoted as JSON, else its type; never very long."""
    return shown_text(json.dumps(value)) if isinstance(value, str) else type(value).__name__


def check_models(source: str, models: Any, example: Mapping | None = None) -> None:
    """Every model present, as an object with its required keys (transfer may be null), and
    :func:`check_tree` over them all (with the ``example`` trie of the models section)."""
    if not isinstance(models, Mapping):
        raise ProfileError(source, "models", "must be an object with one entry per model")
    for model, keys in REQUIRED_MODEL_KEYS.items():
        field = _join("models", model)
        if model not in models:
            raise ProfileError(source, field, "missing model")
        section = models[model]
        if section is None and model in NULLABLE_MODELS:
            continue
        if not isinstance(section, Mapping):
            allowed = "an object or null" if model in NULLABLE_MODELS else "an object"
            raise ProfileError(source, field, f"must be {allowed}, got {type(section).__name__}")
        for key in keys:
            if key not in section:
                raise ProfileError(source, _join(field, key), "missing field")
            if section[key] is None or section[key] in ({}, []):
                raise ProfileError(
                    source, _join(field, key), f"is empty ({json.dumps(section[key])}); the "
                    f"{model} model needs its entries: calibrate again (pdlsim calibrate)"
                )  # fmt: skip
    for model, section in models.items():  # the optional ones: present means an object
        optional = model not in REQUIRED_MODEL_KEYS
        if optional and not (section is None or isinstance(section, Mapping)):
            raise ProfileError(
                source, _join("models", model), f"must be an object or null, got {shown(section)}"
            )
    check_tree(source, models, "models", "", example)
