"""Validation figures: predicted against measured speedup per workload, and step-time parity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from pdlsim.plots.axes import COLOURS, write_figure

__all__ = ["parity_figure", "plot_validation", "speedup_figure"]


def _config(r: dict[str, Any]) -> tuple[int, ...]:
    """Where a row stands on the speedup plot's axis: CPU configurations by the cores they
    use, then one GPU copying in turn and one prefetching."""
    if r.get("device", "cpu") == "gpu":
        return (1, int(bool(r.get("prefetch"))))
    return (0, r["procs"] * r["threads"], r["procs"], r["threads"])


def _config_label(config: tuple[int, ...], oversubscribed: bool) -> str:
    if config[0] == 1:
        return "1 GPU" + ("\npinned,\nprefetch" if config[1] else "\npageable")
    return f"P{config[2]}T{config[3]}" + ("\n(oversub.)" if oversubscribed else "")


def speedup_figure(rows: Sequence[dict[str, Any]], model: str) -> Figure:
    """Speedup vs configuration for one workload: a predicted line with its P10-P90 band shaded
    and measured points with min..max error bars, one colour per batch per rank."""
    mine = [r for r in rows if r["model"] == model]
    configs = sorted({_config(r) for r in mine})
    xpos = {c: i for i, c in enumerate(configs)}
    figure = Figure(figsize=(7, 4.2))
    ax = figure.subplots()
    for k, batch in enumerate(sorted({r["batch"] for r in mine})):
        group = sorted((r for r in mine if r["batch"] == batch), key=lambda r: xpos[_config(r)])
        x = np.array([xpos[_config(r)] for r in group], dtype=float)
        colour = COLOURS[k % len(COLOURS)]
        for device in ("cpu", "gpu"):  # one line each: a GPU does not continue the CPU's
            part = [i for i, r in enumerate(group) if r.get("device", "cpu") == device]
            if not part:
                continue
            ax.plot(x[part], [group[i]["predicted_speedup"] for i in part], color=colour,
                    marker="_" if len(part) == 1 else None,
                    label=f"predicted, batch {batch}" if device == "cpu" else None)  # fmt: skip
            low = [group[i]["predicted_speedup_low"] for i in part]
            high = [group[i]["predicted_speedup_high"] for i in part]
            ax.fill_between(x[part], low, high, color=colour, alpha=0.2, linewidth=0)
        meas = np.array([r["measured_speedup"] for r in group])
        err = np.array(
            [
                meas - [r["measured_speedup_low"] for r in group],
                [r["measured_speedup_high"] for r in group] - meas,
            ]
        )
        shift = 0.06 * (k - 1)
        ax.errorbar(x + shift, meas, yerr=np.clip(err, 0, None), fmt="o", color=colour,
                    capsize=3, label=f"measured, batch {batch}")  # fmt: skip
    labels = [
        _config_label(c, any(r["oversubscribed"] for r in mine if _config(r) == c)) for c in configs
    ]
    ax.set_xticks(range(len(configs)), labels)
    ax.axhline(1.0, color="0.6", linestyle=":", linewidth=1)
    ax.set_xlabel("configuration (P ranks x T threads, or one GPU)")
    ax.set_ylabel("speedup vs P1T1 at the same batch/rank")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    ax.set_title(f"{model}: predicted (band P10-P90) vs measured (min..max of launches)")
    figure.tight_layout()
    return figure


def parity_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """Predicted P50 against measured median step time, log-log, with the diagonal and
    +-5% / +-15% bands; hollow markers are oversubscribed configurations."""
    figure = Figure(figsize=(5.5, 5.2))
    ax = figure.subplots()
    meas = np.array([r["measured_s"] for r in rows]) * 1e3
    pred = np.array([r["predicted_p50_s"] for r in rows]) * 1e3
    lo, hi = 0.8 * min(meas.min(), pred.min()), 1.25 * max(meas.max(), pred.max())
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, color="0.3", linewidth=1, label="predicted = measured")
    for share, alpha in ((0.15, 0.12), (0.05, 0.22)):
        ax.fill_between(line, line * (1 - share), line * (1 + share), color="tab:green",
                        alpha=alpha, linewidth=0, label=f"±{share:.0%}")  # fmt: skip
    for k, model in enumerate(sorted({r["model"] for r in rows})):
        colour = COLOURS[k % len(COLOURS)]
        for over in (False, True):
            idx = [i for i, r in enumerate(rows) if r["model"] == model
                   and bool(r["oversubscribed"]) == over]  # fmt: skip
            if not idx:
                continue
            xerr = np.array(
                [
                    meas[idx] - [rows[i]["measured_low_s"] * 1e3 for i in idx],
                    [rows[i]["measured_high_s"] * 1e3 for i in idx] - meas[idx],
                ]
            )
            yerr = np.array(
                [
                    pred[idx] - [rows[i]["predicted_p10_s"] * 1e3 for i in idx],
                    [rows[i]["predicted_p90_s"] * 1e3 for i in idx] - pred[idx],
                ]
            )
            ax.errorbar(meas[idx], pred[idx], xerr=np.clip(xerr, 0, None),
                        yerr=np.clip(yerr, 0, None), fmt="o", color=colour,
                        mfc="none" if over else colour, capsize=2,
                        label=f"{model}{' (oversubscribed)' if over else ''}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms, median)")
    ax.set_ylabel("predicted step time (ms, P50; bars P10-P90)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")
    ax.set_title("step-time parity")
    figure.tight_layout()
    return figure


def plot_validation(rows: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """``speedup-<model>.png`` per workload and ``parity.png`` in ``out_dir``: the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for model in sorted({r["model"] for r in rows}):
        path = out / f"speedup-{model}.png"
        write_figure(speedup_figure(rows, model), path, "png")
        written.append(path)
    path = out / "parity.png"
    write_figure(parity_figure(rows), path, "png")
    written.append(path)
    return written
