"""Axis helpers shared by pdlsim's figures: units on ticks, log axes, residual panels."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from microbench.fileio import atomic_write_bytes
from microbench.measurement import Measurement

DPI = 120
PARITY_BAND = 0.20  # the compute parity plot shades predictions within +-20% of the measurement
COLOURS = matplotlib.colormaps["tab10"].colors
DIRECTIONS = {"h2d": "host to device (H2D)", "d2h": "device to host (D2H)"}


def measured(samples: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median and its distribution-free 95% interval of each point's raw samples."""
    rows = []
    for s in samples:
        m = Measurement(s)
        ci = m.median_ci()
        rows.append((m.median, min(ci.low, m.median), max(ci.high, m.median)))
    med, low, high = np.array(rows, dtype=float).T
    return med, low, high


def bytes_label(value: float, _pos: Any = None) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


def seconds_label(value: float, _pos: Any = None) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= 0.999 * scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def time_axis(axis: Any) -> None:
    """Log-scaled seconds ticked at 1-2-5 steps (decades when wide), labelled "20 µs", "1 ms".

    Call after everything is drawn: the ticks are chosen for the current limits."""
    low, high = sorted(axis.get_view_interval())
    decades = math.log10(high / low)
    exponents = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for mantissas in ((1,) if decades > 3 else (1, 2, 5), (1, 2, 3, 5), range(1, 10)):
        ticks = [m * 10.0**e for e in exponents for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= 3:
            break
    if decades > 7:
        ticks = ticks[:: math.ceil(decades / 7)]
    if len(ticks) < 2:  # a range narrower than one 1..9 step: both ends and the middle
        ticks = np.geomspace(low, high, 5)[1:-1].tolist()
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(seconds_label))
    axis.set_minor_formatter(NullFormatter())


def log2_axis(ax: Axes, low: float, high: float, formatter: Callable[..., str]) -> None:
    """x limits ``low..high`` on a log scale, ticks at powers of two (at most ~7 of them)."""
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    first, last = math.ceil(math.log2(low)), math.floor(math.log2(high))
    step = max(1, math.ceil((last - first + 1) / 7))
    start = step * math.ceil(first / step)
    ax.xaxis.set_major_locator(FixedLocator([2.0**e for e in range(start, last + 1, step)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(formatter))


def residual_axis(ax: Axes, rel_percent: Sequence[float], floor: float = 5.0) -> None:
    """Relative errors in %, zero marked; a symmetric-log scale when some exceed 100%."""
    ax.axhline(0.0, color="0.3", lw=0.8)
    rel = np.asarray([r for r in rel_percent if np.isfinite(r)] or [0.0])
    below = min(max(floor, -1.2 * rel.min()), 105.0)  # a prediction is never below -100%
    above = max(floor, 1.2 * rel.max())
    if above > 150.0:  # a few wild points would flatten the rest against zero
        above *= 1.6  # headroom on the compressed scale
        ax.set_yscale("symlog", linthresh=max(floor, 20.0))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p=None: f"{v:g}"))
    ax.set_ylim(-below, above)
    ax.set_ylabel("fit error (%)")
    ax.grid(True, which="major", alpha=0.3)


def series(
    axes: tuple[Axes, Axes],
    points: pd.DataFrame,
    x: str,
    fit: Callable[[np.ndarray], np.ndarray],
    colour: Any,
    curve: np.ndarray | None = None,
) -> list[float]:
    """Measured medians (95% intervals from the raw ``samples``) against column ``x`` on the
    main axis, the fitted curve at ``curve``, and the relative errors (%) on the residual axis."""
    top, bottom = axes
    at = points[x].to_numpy(float)
    med, low, high = measured(list(points["samples"]))
    top.errorbar(at, med, yerr=[med - low, high - med], fmt="o", ms=4, color=colour, capsize=2)
    if curve is not None:
        top.plot(curve, fit(curve), color=colour, lw=1.4, zorder=1)
    rel = (np.asarray(fit(at), dtype=float) - med) / med * 100.0
    bottom.plot(at, rel, "o-", ms=3.5, lw=0.8, color=colour)
    return rel.tolist()


def size_grid(fig: Figure, n_panels: int, ylabel: str) -> list[tuple[Axes, Axes]]:
    """Panels in up to three columns, each a main axis above a residual axis sharing its x."""
    ncols = min(3, n_panels)
    grid = fig.add_gridspec(math.ceil(n_panels / ncols), ncols)
    pairs = []
    for i in range(n_panels):
        cell = grid[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=(3, 1), hspace=0.0)
        top = fig.add_subplot(cell[0])
        bottom = fig.add_subplot(cell[1], sharex=top)
        top.tick_params(labelbottom=False)
        top.set_yscale("log")
        top.set_ylabel(ylabel)
        top.grid(True, which="major", alpha=0.3)
        pairs.append((top, bottom))
    return pairs


def legend_below(fig: Figure, handles: list[Line2D]) -> None:
    columns = max(1, min(len(handles), int(fig.get_figwidth() / 2.3)))  # ~2.3 inches an entry
    fig.legend(handles=handles, loc="outside lower center", ncols=columns, fontsize=9)


def generic_handles(switches: bool) -> list[Line2D]:
    handles = [
        Line2D([], [], color="0.3", marker="o", ls="none", label="measured median, 95% CI"),
        Line2D([], [], color="0.3", lw=1.4, label="fitted model"),
    ]
    if switches:
        handles.append(Line2D([], [], color="0.5", lw=0.8, ls=":", label="regime switch"))
    return handles


def quality_note(ax: Axes, text: str) -> None:
    """Fit quality in the upper left, the corner that rising time curves leave empty."""
    box = {"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9}
    ax.text(0.03, 0.96, text, transform=ax.transAxes, ha="left", va="top", fontsize=8, bbox=box)


def records_of(frame: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    if "benchmark" not in frame.columns:
        return frame.iloc[0:0]
    rows = frame[frame["benchmark"] == benchmark]
    return rows[rows["type"] == "measurement"] if "type" in rows.columns else rows


# --------------------------------------------------------------------------- collectives


def figure_bytes(figure: Figure, fmt: str) -> bytes:
    """``figure`` drawn in memory as a ``fmt`` file's bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=DPI)
    return buffer.getvalue()


def write_figure(figure: Figure, path: str | Path, fmt: str) -> Path:
    """Save ``figure`` to ``path`` whole or not at all: drawn in memory, then written
    atomically, so a full disk never leaves a truncated image over a good one."""
    atomic_write_bytes(path, figure_bytes(figure, fmt))
    return Path(path)
