"""The calibration report: every fitted parameter with its 95% interval, and each fit's error.

Read from the profile document itself (not the model objects), so that ``pdlsim calibrate``
and anyone holding only a profile file see the same table. A parameter is any entry of an
``intervals`` mapping beside its value; units follow from the name (``_s``, ``_s_per_byte``,
``_bytes_per_s``, ``_flops_per_s``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def _scaled(name: str, value: float) -> tuple[float, str]:
    """A value in the unit a person reads, from the unit in its name."""
    if name.endswith("_s_per_byte"):
        return (value * 1e9, "ns/B")
    if name.endswith("flops_per_s"):
        return (value / 1e9, "GFLOP/s")
    if name.endswith("_bytes_per_s"):
        return (value / 1e9, "GB/s")
    if name.endswith("_s"):
        return (value * 1e6, "us")
    if name.endswith("_flops"):
        return (value / 1e6, "MFLOP")
    return (value, "")


def _bytes(n: Any) -> str:
    n = int(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def parameter_rows(models: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """(where, parameter, value, low, high, unit) for every interval in the model sections."""

    def walk(node: Any, where: str) -> Iterator[dict[str, Any]]:
        if isinstance(node, Mapping):
            if "min_bytes" in node and "max_bytes" in node:  # a message-size regime
                where += f"[{_bytes(node['min_bytes'])}..{_bytes(node['max_bytes'])}"
                where += f" {node['algorithm']}]" if node.get("algorithm") else "]"
            yield from _series_rows(node, where)
            intervals = node.get("intervals")
            if isinstance(intervals, Mapping):
                for name, interval in intervals.items():
                    value = node.get(name)
                    if not isinstance(interval, Mapping) or not isinstance(value, int | float):
                        continue
                    scaled, unit = _scaled(name, float(value))
                    low, _ = _scaled(name, float(interval["low"]))
                    high, _ = _scaled(name, float(interval["high"]))
                    yield {
                        "where": where,
                        "parameter": name,
                        "value": scaled,
                        "low": low,
                        "high": high,
                        "unit": unit,
                    }
            for key, child in node.items():
                if key not in ("intervals", "hockney", "table", "quality", "quantiles"):
                    yield from walk(child, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for index, child in enumerate(node):
                regime = isinstance(child, Mapping) and "min_bytes" in child
                yield from walk(child, where if regime else f"{where}[{index}]")

    for section, model in models.items():
        if model is not None:
            # The collectives section holds its per-op models under "collectives" again.
            yield from walk(
                model.get("collectives", model) if section == "collectives" else model, section
            )


def _series_rows(node: Mapping[str, Any], where: str) -> Iterator[dict[str, Any]]:
    """The node fill's series (``levels``, each series per level with its interval of lists:
    the slowdown S(k) and the straggler T(k)), one row per level above one process."""
    levels = node.get("levels")
    if not (isinstance(levels, list) and "slowdown" in node):
        return
    series = [("slowdown", node["slowdown"], node.get("interval"))]
    straggler = node.get("straggler")
    if isinstance(straggler, Mapping):
        series.append(("straggler", straggler.get("value"), straggler.get("interval")))
    for name, values, interval in series:
        if not (isinstance(values, list) and isinstance(interval, Mapping)):
            continue
        for i, (k, value) in enumerate(zip(levels, values, strict=False)):
            if k == 1:
                continue  # one process against itself: 1 by definition
            low, high = interval["low"][i], interval["high"][i]
            yield {"where": where, "parameter": f"{name}[{k} procs]", "value": value,
                   "low": low, "high": high, "unit": "x (the kernels' range)"}  # fmt: skip


def quality_rows(fit_quality: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """(where, r2, median/max relative error, leave-out error, points) of every fit."""

    def walk(node: Any, where: str) -> Iterator[dict[str, Any]]:
        if isinstance(node, Mapping) and "median_rel_error" in node:
            yield {"where": where, **{k: node.get(k) for k in _QUALITY_KEYS}}
        elif isinstance(node, Mapping):
            for key, child in node.items():
                yield from walk(child, f"{where}.{key}" if where else str(key))

    yield from walk(fit_quality, "")


_QUALITY_KEYS = ("r2", "median_rel_error", "max_rel_error", "leave_out_rel_error", "n_points")


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_report(profile: Mapping[str, Any]) -> str:
    """Two aligned tables: parameters with intervals, then fit quality per model."""
    params = list(parameter_rows(profile["models"]))
    width = max([len(r["where"]) + len(r["parameter"]) + 1 for r in params] + [20])
    lines = [f"{'parameter':<{width}}  {'value':>12}  {'95% interval':>27}  unit"]
    for r in params:
        name = f"{r['where']}.{r['parameter']}"
        interval = f"[{r['low']:.4g}, {r['high']:.4g}]"
        lines.append(f"{name:<{width}}  {r['value']:>12.4g}  {interval:>27}  {r['unit']}")
    quality = list(quality_rows(profile.get("fit_quality") or {}))
    if quality:
        qwidth = max([len(q["where"]) for q in quality] + [10])
        lines += [
            "",
            f"{'fit':<{qwidth}}  {'R^2':>7}  {'median err':>10}  {'max err':>9}  "
            f"{'leave-out':>9}  {'points':>6}",
        ]
        for q in quality:
            r2 = "-" if q["r2"] is None else f"{q['r2']:.3f}"
            lines.append(
                f"{q['where']:<{qwidth}}  {r2:>7}  {_pct(q['median_rel_error']):>10}  "
                f"{_pct(q['max_rel_error']):>9}  {_pct(q['leave_out_rel_error']):>9}  "
                f"{q['n_points'] or '-':>6}"
            )
    return "\n".join(lines)
