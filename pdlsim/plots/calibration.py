"""The fit plots of a calibration: measured points, the fitted curve and the residuals."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from calibration.jitter import CONFIG_KEYS, FAMILIES, config_runs
from calibration.optable import NON_OP_PHASES
from calibration.readers import collective_points, copy_points
from microbench.errors import UserError
from pdlsim.plots.axes import (
    COLOURS,
    DIRECTIONS,
    PARITY_BAND,
    bytes_label,
    generic_handles,
    legend_below,
    log2_axis,
    quality_note,
    records_of,
    residual_axis,
    series,
    size_grid,
    time_axis,
)


def collectives_figure(model: Any, frame: pd.DataFrame) -> Figure | None:
    try:
        points = collective_points(frame)
    except UserError:
        return None
    points = points[(points["ranks"] >= 2) & points["op"].isin(list(model.models_))]
    if points.empty:
        return None
    ops = [op for op in model.models_ if op in set(points["op"])]
    pairs = points[["ranks", "ranks_per_node"]].drop_duplicates()
    groups = sorted((int(p), int(q)) for p, q in pairs.itertuples(index=False))
    colour = {g: COLOURS[i % len(COLOURS)] for i, g in enumerate(groups)}
    ncols = min(3, len(ops))
    fig = Figure(
        figsize=(max(5.0 * ncols, 9.0), 4.4 * math.ceil(len(ops) / ncols) + 0.9),
        layout="constrained",
    )
    for op, (top, bottom) in zip(ops, size_grid(fig, len(ops), "time per call"), strict=True):
        _collective_panel(top, bottom, model.models_[op], points[points["op"] == op], colour)
    title = "Collectives: measured time and the fitted cost model (1-rank points not fitted)"
    if getattr(model, "skipped_", None):
        title += f"; not fitted: {', '.join(sorted(model.skipped_))}"
    fig.suptitle(title)
    handles = [
        Line2D([], [], color=c, marker="o", ms=4, lw=1.4, label=_ranks_label(p, q))
        for (p, q), c in colour.items()
    ]
    switches = any(len(m.regimes_) > 1 for m in model.models_.values())
    legend_below(fig, handles + generic_handles(switches))
    return fig


def _ranks_label(p: int, q: int) -> str:
    return f"{p} ranks" if q >= p else f"{p} ranks, {q} per node"


def _collective_panel(
    top: Axes, bottom: Axes, cm: Any, pts: pd.DataFrame, colour: dict[tuple[int, int], Any]
) -> None:
    sized = pts[pts["bytes"] > 0]
    rel: list[float] = []
    if sized.empty:  # barrier: no payload, time against the process count
        for (p, q), g in pts.groupby(["ranks", "ranks_per_node"]):
            fit = _fit_collective(cm, "ranks", int(p), int(q))
            rel += series((top, bottom), g, "ranks", fit, colour[(int(p), int(q))])
        high = max(16.0, 2.0 * float(pts["ranks"].max()))
        ranks = np.unique(np.round(np.geomspace(2.0, high, 64)))
        top.step(ranks, cm.predict(0.0, ranks), where="post", color="0.3", lw=1.4, zorder=1)
        log2_axis(bottom, 1.6, high * 1.2, lambda v, _p=None: f"{v:g}")
        bottom.set_xlabel("process count")
    else:
        low, high = float(sized["bytes"].min()) / 1.6, float(sized["bytes"].max()) * 1.6
        curve = np.geomspace(low, high, 256)
        for (p, q), g in sized.groupby(["ranks", "ranks_per_node"]):
            fit = _fit_collective(cm, "bytes", int(p), int(q))
            rel += series((top, bottom), g, "bytes", fit, colour[(int(p), int(q))], curve)
        for a, b in zip(cm.regimes_[:-1], cm.regimes_[1:], strict=True):
            for ax in (top, bottom):
                ax.axvline(math.sqrt(a.max_bytes * b.min_bytes), color="0.5", lw=0.8, ls=":")
        log2_axis(bottom, low, high, bytes_label)
        bottom.set_xlabel("message size (bytes per rank)")
    top.set_title(f"{cm.op}: {' | '.join(r.algorithm for r in cm.regimes_)}", fontsize=10)
    note = f"median |error| {cm.quality_.median_rel_error:.1%}"
    if getattr(cm, "cv_error_", None) is not None:
        note += f"\nheld-out process count {cm.cv_error_:.1%}"
    quality_note(top, note)
    time_axis(top.yaxis)
    residual_axis(bottom, rel)


def _fit_collective(cm: Any, x: str, p: int, q: int) -> Callable[[np.ndarray], np.ndarray]:
    """The model along ``x`` ("bytes" at ``p`` ranks, or "ranks" for a payload-free op)."""
    per_node = None if q >= p else q
    if x == "ranks":
        return lambda ranks: cm.predict(0.0, ranks, per_node)
    return lambda n: cm.predict(n, p, per_node)


# ------------------------------------------------------------------------------ compute


def compute_figure(model: Any, frame: pd.DataFrame) -> Figure | None:
    """Parity of measured and predicted op times, from the measured op table the model keeps
    (whole-step entries left out: the curves are fitted to the ops, not to steps)."""
    entries = [
        e
        for e in model.table_
        if e.phase not in NON_OP_PHASES and (e.device, e.threads) in model.curves_
    ]
    if not entries:
        return None
    fig = Figure(figsize=(7.0, 8.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 1.1))
    phases = sorted({e.phase for e in entries})
    marker = {ph: "osD^v<>ph*"[i % 10] for i, ph in enumerate(phases)}
    handles: list[Any] = []
    rel_all: list[float] = []
    times: list[float] = []
    for i, key in enumerate(sorted({(e.device, e.threads) for e in entries})):
        colour = COLOURS[i % len(COLOURS)]
        here = [e for e in entries if (e.device, e.threads) == key]
        meas = np.array([e.time_s for e in here])
        pred = np.array([_predict_op(model, e) for e in here])
        xerr = np.array([[e.time_s - e.low_s for e in here], [e.high_s - e.time_s for e in here]])
        rel = (pred - meas) / meas * 100.0
        for phase in phases:
            sel = np.array([e.phase == phase for e in here])
            if sel.any():
                style = {"color": colour, "alpha": 0.85, "ls": "none", "marker": marker[phase]}
                top.errorbar(meas[sel], pred[sel], xerr=xerr[:, sel], ms=5, capsize=2, **style)
                bottom.plot(meas[sel], rel[sel], ms=4.5, **style)
        threads = f"{key[1]} thread" + ("s" if key[1] != 1 else "")
        label = f"{key[0]}, {threads}: median |error| {np.median(np.abs(rel)):.1f}%"
        handles.append(Patch(color=colour, label=label))
        rel_all += rel.tolist()
        times += [*meas, *pred]
    low, high = min(times) / 1.6, max(times) * 1.6
    line = np.geomspace(low, high, 64)
    top.fill_between(line, line * (1 - PARITY_BAND), line * (1 + PARITY_BAND), color="0.88", lw=0)
    top.plot(line, line, color="0.3", lw=1.0)
    top.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    top.set_xlabel("measured op time (median, 95% CI)")
    top.set_ylabel("predicted op time")
    top.set_title("Compute: roofline-efficiency model against every measured op")
    top.grid(True, which="major", alpha=0.3)
    handles += [
        Line2D([], [], color="0.3", marker=marker[ph], ls="none", label=ph) for ph in phases
    ]
    handles.append(Patch(color="0.88", label=f"within {PARITY_BAND:.0%}"))
    top.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.9)
    bottom.axhspan(-100 * PARITY_BAND, 100 * PARITY_BAND, color="0.88", lw=0)
    bottom.set(xscale="log", xlim=(low, high))
    bottom.set_xlabel("measured op time")
    for axis in (top.xaxis, top.yaxis, bottom.xaxis):
        time_axis(axis)
    residual_axis(bottom, rel_all, floor=1.25 * 100 * PARITY_BAND)
    return fig


def _predict_op(model: Any, e: Any) -> float:
    return float(model.predict(e.flops, e.bytes, e.threads, e.device, e.kind, e.phase))


# ------------------------------------------------------------------------------- jitter


def _family_pdf(family: str, params: dict[str, float], x: np.ndarray) -> np.ndarray:
    dist, fixed, names = FAMILIES[family]
    shapes = [params[n] for n in names if n not in ("loc", "scale")]
    loc = params.get("loc", fixed.get("floc", 0.0))
    return dist(*shapes, loc=loc, scale=params["scale"]).pdf(x)


def jitter_figure(model: Any, frame: pd.DataFrame) -> Figure:
    """Per-rank step times over their rank's median (as the model pooled them; its atoms when
    the records are not at hand) with the fitted densities, and the slowest-of-P factor."""
    rows = records_of(frame, "jitter")
    statistic = rows.get("params.statistic", pd.Series("per_rank", index=rows.index))
    chosen = rows[statistic.fillna("per_rank") == "per_rank"]["samples"]
    per_rank = [a for a in (np.asarray(s, float) for s in chosen) if a.size]
    relative = np.concatenate([s / np.median(s) for s in per_rank]) if per_rank else model.atoms_
    fig = Figure(figsize=(12.0, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    _histogram_panel(left, model, np.asarray(relative, dtype=float))
    _max_panel(right, model, rows, statistic)
    return fig


def _histogram_panel(ax: Axes, model: Any, relative: np.ndarray) -> None:
    # The bulk, not the odd stall: 1%..99% of the steps, widened; the rest is counted.
    low, high = np.quantile(relative, [0.01, 0.99], method="nearest")
    pad = 0.3 * (high - low) or 0.01
    low, high = low - pad, high + pad
    bins = np.linspace(low, high, int(np.clip(2 * np.sqrt(relative.size), 12, 60)) + 1)
    weights = np.full(relative.size, 1.0 / (relative.size * (bins[1] - bins[0])))
    label = f"measured ({relative.size} steps)"
    heights = ax.hist(relative, bins, weights=weights, color="0.75", ec="white", label=label)[0]
    grid = np.linspace(low, high, 400)
    peak = float(np.max(heights))
    for family, candidate in model.candidates_.items():
        chosen = family == model.family_
        params = model.params_ if chosen else candidate["params"]
        density = _family_pdf(family, params, grid)
        text = ", ".join(f"{k}={v:.3g}" for k, v in params.items())
        label = f"{family} ({text})" + (f", chosen by {model.criterion.upper()}" if chosen else "")
        style = {"lw": 2.0, "zorder": 3} if chosen else {"lw": 1.0, "ls": "--", "zorder": 2}
        ax.plot(grid, density, label=label, **style)
        peak = max(peak, float(np.max(density))) if chosen else peak
    ax.axvline(1.0, color="0.3", lw=0.8, ls=":")
    ax.set_xlim(low, high)
    ax.set_ylim(0.0, 1.6 * peak)  # room for the legend above the distribution
    ax.set_xlabel("step time / its rank's median (1)")
    ax.set_ylabel("probability density (1)")
    outside = relative[(relative < low) | (relative > high)]
    title = f"Per-rank step time (median {model.median_s_ * 1e3:.3g} ms)"
    if outside.size:
        title += f"; {outside.size} off the axis, up to {outside.max():.3g}x"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")


def _max_panel(ax: Axes, model: Any, rows: pd.DataFrame, statistic: pd.Series) -> None:
    ranks = np.arange(1, 1025)
    model_label = "model: E[max of P draws]"
    ax.plot(ranks, model.expected_max_factor(ranks), color=COLOURS[0], lw=1.8, label=model_label)
    switch = int(model.empirical_max_ranks_)
    if 1 < switch < ranks[-1]:
        label = f"from P={switch}: the slowest mostly in the fitted tail"
        ax.axvline(switch, color="0.5", lw=0.8, ls=":", label=label)
    points = _measured_maxima(rows, statistic) or [
        (int(c["ranks"]), float(c["measured_factor"]), 0.0) for c in model.checks_
    ]
    if points:
        p, factor, half = (np.array(v, dtype=float) for v in zip(*points, strict=True))
        label = "measured: mean per-step max over ranks, 95% CI"
        ax.errorbar(p, factor, half, fmt="o", color=COLOURS[3], capsize=3, label=label)
    log2_axis(ax, 0.8, 1300.0, lambda v, _p=None: f"{v:g}")
    ax.set_xlabel("ranks P")
    ax.set_ylabel("E[slowest of P ranks] / median step (1)")
    ax.set_title("Synchronisation: the slowest rank sets the pace", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def _measured_maxima(rows: pd.DataFrame, statistic: pd.Series) -> list[tuple[int, float, float]]:
    """``(ranks, mean max / median, 95% half-width)`` of each run with max-over-ranks records,
    its per-rank records matched by the run's configuration as the jitter model matches them."""
    per_rank = rows[statistic.fillna("per_rank") == "per_rank"]
    maxima = rows[statistic == "max_over_ranks"]
    runs = config_runs(per_rank, CONFIG_KEYS)
    out = []
    for key, group in config_runs(maxima, CONFIG_KEYS).items():
        if key not in runs:
            continue
        median = float(np.median(_pooled(runs[key]["samples"])))
        worst = _pooled(group["samples"])
        half = 1.96 * worst.std(ddof=1) / math.sqrt(worst.size) if worst.size > 1 else 0.0
        ranks = group.iloc[0].get("params.ranks", 1)
        ranks = 1 if ranks is None or pd.isna(ranks) else int(ranks)
        out.append((ranks, float(worst.mean()) / median, half / median))
    return sorted(out)


def _pooled(samples: pd.Series) -> np.ndarray:
    return np.concatenate([np.asarray(s, dtype=float).ravel() for s in samples])


# ----------------------------------------------------------------------------- transfer


def transfer_figure(model: Any, frame: pd.DataFrame) -> Figure | None:
    try:
        points = copy_points(frame)
    except UserError:
        return None
    measured = set(points["direction"])
    directions = [d for d in DIRECTIONS if d in measured and any(k[0] == d for k in model.curves_)]
    if not directions:
        return None
    fig = Figure(figsize=(max(5.4 * len(directions), 9.0), 5.3), layout="constrained")
    low, high = float(points["bytes"].min()) / 1.6, float(points["bytes"].max()) * 1.6
    curve = np.geomspace(low, high, 256)
    colour = {True: COLOURS[0], False: COLOURS[1]}
    switches = False
    for direction, axes in zip(
        directions, size_grid(fig, len(directions), "copy time"), strict=True
    ):
        rel: list[float] = []
        notes = []
        for pinned in (True, False):
            key = (direction, pinned)
            g = points[(points["direction"] == direction) & (points["pinned"] == pinned)]
            if key not in model.curves_ or g.empty:
                continue
            fit = _fit_copy(model, direction, pinned)
            rel += series(axes, g, "bytes", fit, colour[pinned], curve)
            for switch in model.curves_[key].breakpoints_bytes_:
                switches = True
                for ax in axes:
                    ax.axvline(switch, color=colour[pinned], lw=0.8, ls=":", alpha=0.7)
            error = model.curves_[key].quality_.median_rel_error
            notes.append(f"{'pinned' if pinned else 'pageable'}: median |error| {error:.1%}")
        top, bottom = axes
        top.set_title(DIRECTIONS[direction], fontsize=10)
        quality_note(top, "\n".join(notes))
        time_axis(top.yaxis)
        log2_axis(bottom, low, high, bytes_label)
        bottom.set_xlabel("copy size (bytes)")
        residual_axis(bottom, rel)
    fig.suptitle("Host-device copies: measured time and the fitted Hockney model")
    handles = [
        Line2D([], [], color=colour[p], marker="o", ms=4, lw=1.4, label=name)
        for p, name in ((True, "pinned host memory"), (False, "pageable host memory"))
    ]
    legend_below(fig, handles + generic_handles(switches))
    return fig


def _fit_copy(model: Any, direction: str, pinned: bool) -> Callable[[np.ndarray], np.ndarray]:
    return lambda n: model.predict(direction, n, pinned)
