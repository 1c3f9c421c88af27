"""The node-fill slowdown: how much slower one core's work runs with k cores of its node busy.

From the records of ``microbench nodefill`` (:mod:`microbench.nodefill`): for each kernel
(GEMM, stream, small calls), process count k and launch, the median over processes of each
process's median call time; over launches, their median (which cores a launch lands on is the
scheduler's draw); over k = 1, the kernel's slowdown ``s_kernel(k)``. The node's slowdown is
their geometric mean,

    S(k) = (s_gemm(k) * s_stream(k) * s_calls(k)) ** (1/3),

with the kernels' range ``[min, max]`` as its interval: a training step is some mix of the
three kinds of work, so its own slowdown lies between theirs, and where it lies within that
range is the part this benchmark cannot say. Between measured k, :meth:`NodeFill.slowdown`
interpolates in log k; above the largest, it holds the largest.

**Stragglers.** A full node does not slow its processes alike: the scheduler's placement, a
core shared with the host or another tenant, leave one process persistently slower than the
rest, and a synchronous step waits for it. Per kernel, level and launch, the slowest process's
median call time over the median process's; over launches, their median; over kernels, the
geometric mean ``T(k)`` with the kernels' range as its interval (:meth:`NodeFill.straggler`,
the same interpolation). A prediction slows one rank by ``T(R) / T(R_max)`` above the jitter
benchmark's ranks per node (:meth:`calibration.colocation.ColocationModel.straggler`): below
them the jitter benchmark's own steps already hold whatever straggling two ranks show.

:class:`calibration.colocation.ColocationModel` carries its measured co-location factor from
the largest ranks per node the jitter benchmark ran to more by ``S(R) / S(R_max)``.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from microbench.errors import UserError

from .profile_checks import FieldError, is_number, shown

__all__ = ["NodeFill", "fit_node_fill"]

_PARAMS = ("params.kernel", "params.procs", "params.launch", "params.process")


@dataclass(frozen=True)
class NodeFill:
    """``levels`` (process counts) and, per level, the node's slowdown and its kernels' range;
    ``kernels``: each kernel's slowdown per level; ``stragglers``: per level, the slowest
    process over the median one and its kernels' range, as ``(values, lows, highs)`` (None in a
    profile fitted before stragglers were read from the records)."""

    levels: tuple[int, ...]
    slowdowns: tuple[float, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]
    kernels: dict[str, tuple[float, ...]]
    stragglers: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] | None = None

    def slowdown(self, k: int) -> tuple[float, float, float]:
        """``(S, low, high)`` at ``k`` busy cores: 1 at one core or fewer, interpolated in log k
        between measured levels, the largest level's above it."""
        return self._at(k, (self.slowdowns, self.lows, self.highs))

    def straggler(self, k: int) -> tuple[float, float, float] | None:
        """``(T, low, high)``: the slowest of ``k`` busy cores' processes over the median one,
        interpolated as :meth:`slowdown`; None without stragglers in the profile."""
        return None if self.stragglers is None else self._at(k, self.stragglers)

    def _at(self, k: int, series: tuple[tuple[float, ...], ...]) -> tuple[float, float, float]:
        if k <= 1:
            return 1.0, 1.0, 1.0
        x = np.log(np.asarray(self.levels, dtype=float))
        at = np.log(min(float(k), float(self.levels[-1])))
        return tuple(  # type: ignore[return-value]
            float(np.interp(at, x, np.asarray(v, dtype=float))) for v in series
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "levels": list(self.levels),
            "slowdown": list(self.slowdowns),
            "interval": {
                "low": list(self.lows),
                "high": list(self.highs),
                "of": "the kernels' range",
            },
            "kernels": {name: list(v) for name, v in self.kernels.items()},
            "law": "S(k) = geometric mean of the kernels' median slowdowns at k busy cores "
            "over one; log-k interpolation, held above the largest k",
        }
        if self.stragglers is not None:
            value, low, high = self.stragglers
            out["straggler"] = {
                "value": list(value),
                "interval": {"low": list(low), "high": list(high), "of": "the kernels' range"},
                "law": "T(k) = geometric mean over kernels of the median over launches of the "
                "slowest process's median call time over the median process's at k busy cores",
            }
        return out

    @classmethod
    def from_dict(cls, doc: Any) -> NodeFill:
        """The node fill :meth:`to_dict` wrote; :class:`FieldError` naming the field for one a
        hand edit broke (:func:`_checked`), which :meth:`slowdown` would else turn into a
        division by zero, an interpolation on unsorted levels or a silent wrong factor."""
        if not isinstance(doc, Mapping):
            raise FieldError("", f"must be an object, got {shown(doc)}")
        levels = _levels(_field(doc, "levels"))
        kernels = _field(doc, "kernels")
        if not isinstance(kernels, Mapping):
            raise FieldError("kernels", f"must be an object, got {shown(kernels)}")
        straggler = doc.get("straggler")
        if straggler is not None and not isinstance(straggler, Mapping):
            raise FieldError("straggler", f"must be an object, got {shown(straggler)}")
        return cls(
            levels,
            *_series(doc, "slowdown", levels),
            {str(name): _checked(f"kernels.{name}", v, levels) for name, v in kernels.items()},
            None if straggler is None else _series(straggler, "value", levels, "straggler", 1.0),
        )


def _series(
    doc: Mapping[str, Any],
    key: str,
    levels: tuple[int, ...],
    within: str = "",
    at_least: float | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """``(values, lows, highs)`` of a per-level series as :meth:`NodeFill.to_dict` writes it:
    ``doc[key]`` beside ``doc["interval"]``'s ``low`` and ``high``, each value inside its
    interval (and, given ``at_least``, its interval not below that: a straggler is never
    faster than the median process)."""
    at = f"{within}." if within else ""
    interval = _field(doc, "interval", within)
    if not isinstance(interval, Mapping):
        raise FieldError(f"{at}interval", f"must be an object, got {shown(interval)}")
    values = _checked(at + key, _field(doc, key, within), levels)
    lows = _checked(f"{at}interval.low", _field(interval, "low", f"{at}interval"), levels)
    highs = _checked(f"{at}interval.high", _field(interval, "high", f"{at}interval"), levels)
    for i, (value, low, high) in enumerate(zip(values, lows, highs, strict=True)):
        slack = 1e-9 * high  # a geometric mean of equal values may round past them
        inside = low - slack <= value <= high + slack
        if at_least is None and not inside:
            raise FieldError(f"{at}{key}[{i}]", f"{value!r} is outside its interval "
                             f"[{low!r}, {high!r}]")  # fmt: skip
        if at_least is not None and not (inside and low >= at_least - 1e-9):
            raise FieldError(f"{at}{key}[{i}]", f"{value!r} must be at least {at_least:g} and "
                             f"inside its interval [{low!r}, {high!r}]")  # fmt: skip
    return values, lows, highs


def _field(doc: Mapping[str, Any], key: str, within: str = "") -> Any:
    if key not in doc:
        raise FieldError(f"{within}.{key}" if within else key, "missing field")
    return doc[key]


def _list_of(field: str, values: Any, test: Any, kind: str) -> None:
    """``values`` is a list whose every element passes ``test`` (else which one does not)."""
    if not isinstance(values, list):
        raise FieldError(field, f"must be a list, got {shown(values)}")
    for i, value in enumerate(values):
        if not test(value):
            got = json.dumps(value) if value is None or is_number(value) else shown(value)
            raise FieldError(f"{field}[{i}]", f"must be {kind}, got {got}")


def _levels(values: Any) -> tuple[int, ...]:
    """Process counts as :func:`fit_node_fill` writes them: whole numbers from 1, ascending,
    at least two (one level measures no slowdown)."""
    _list_of("levels", values, lambda v: type(v) is int, "a whole number")
    if len(values) < 2 or values[0] != 1:
        raise FieldError("levels", f"must start at 1 and hold at least two counts, got {values}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise FieldError("levels", f"must ascend, each count once, got {values}")
    return tuple(values)


def _checked(field: str, values: Any, levels: tuple[int, ...]) -> tuple[float, ...]:
    """``values``: one finite slowdown > 0 per level, 1 at the first (one process against
    itself)."""
    _list_of(field, values, is_number, "a number")
    if len(values) != len(levels):
        raise FieldError(field, f"holds {len(values)} values for the {len(levels)} levels; "
                         "give one per level")  # fmt: skip
    for i, value in enumerate(values):
        if not (math.isfinite(value) and value > 0):
            raise FieldError(f"{field}[{i}]", f"a slowdown must be > 0, got {value!r}")
    if abs(values[0] - 1.0) > 1e-9:
        raise FieldError(f"{field}[0]", f"the slowdown at 1 process is 1, got {values[0]!r}")
    return tuple(float(v) for v in values)


def fit_node_fill(df: pd.DataFrame) -> NodeFill | None:
    """The node-fill slowdowns of the "nodefill" records in ``df``; None without them or
    without a one-process level to measure against. A level that lacks a kernel measured at
    one process (a run stopped while writing it) is left out, and so is a launch whose
    ``process`` records disagree with its ``procs`` (:func:`_whole_launches`); the others
    stand."""
    rows = df[(df["type"] == "measurement") & (df["benchmark"] == "nodefill")]
    if rows.empty:
        return None
    for column in _PARAMS:  # their kinds are checked where the records are read
        absent = rows[column].isna() if column in rows else pd.Series(True, index=rows.index)
        _refuse_first(rows, absent, f"has no '{column}'")
    medians = rows.assign(
        median=[float(np.median(s)) for s in rows["samples"]],
        **{"params.procs": rows["params.procs"].astype(int)},
    )
    _refuse_first(medians, medians["median"] <= 0, "has a median call time of 0")
    medians = _whole_launches(medians)
    by_launch = medians.groupby(list(_PARAMS[:3]))["median"]
    per_launch = by_launch.median()  # over processes
    typical = per_launch.groupby(level=[0, 1]).median()  # over launches
    spread = (by_launch.max() / per_launch).groupby(level=[0, 1]).median()  # slowest / median
    at_one = sorted({str(n) for n, k in typical.index if k == 1})
    if not at_one:
        return None
    levels = sorted({int(k) for _, k in typical.index
                     if all((n, k) in typical.index for n in at_one)})  # fmt: skip
    if len(levels) < 2:
        return None
    kernels = {name: tuple(float(typical[(name, k)] / typical[(name, 1)]) for k in levels)
               for name in at_one}  # fmt: skip
    table = np.array(list(kernels.values()))  # kernels x levels
    slowest = np.array([[float(spread[(name, k)]) for k in levels] for name in at_one])
    return NodeFill(tuple(levels), *_geomean_and_range(table), kernels, _geomean_and_range(slowest))


def _geomean_and_range(table: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """Per level (column), the kernels' (rows') geometric mean, minimum and maximum."""
    return tuple(
        tuple(float(v) for v in row)
        for row in (np.exp(np.log(table).mean(axis=0)), table.min(axis=0), table.max(axis=0))
    )


def _whole_launches(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` without the launches whose ``process`` records are not one set of processes 0
    to procs - 1: a launch stopped while writing, or records of another count mixed in, whose
    median over processes would stand for a fill level it did not measure. Each is left out
    with a one-line warning naming its file, as a level missing a kernel is left out
    (:func:`fit_node_fill`); the others stand."""
    keep = pd.Series(True, index=rows.index)
    for (kernel, procs, launch), group in rows.groupby(list(_PARAMS[:3]), sort=True):
        found = sorted(set(group["params.process"].astype(int)))
        if found == list(range(procs)):
            continue
        keep[group.index] = False
        where = f" in {group['source'].iloc[0]}" if "source" in group else ""
        listed = ", ".join(map(str, found[:4])) + (", ..." if len(found) > 4 else "")
        warnings.warn(
            f"nodefill{where}: kernel {kernel} at procs {procs}, launch {launch} holds records "
            f"of {len(found)} process(es) ({listed}), not of processes 0 to {procs - 1}; that "
            "launch is left out (re-run 'python -m microbench nodefill' to measure it)",
            stacklevel=3,
        )
    return rows[keep]


def _refuse_first(rows: pd.DataFrame, wrong: pd.Series, problem: str) -> None:
    """A one-line :class:`UserError` for the first of ``rows`` where ``wrong`` holds."""
    if wrong.any():
        first = int(wrong.to_numpy().argmax())
        where = f"in {rows['source'].iloc[first]} " if "source" in rows else ""
        raise UserError(f"a nodefill record {where}{problem}; re-run "
                        "'python -m microbench nodefill'")  # fmt: skip
