"""The scaling plot of a sweep: speedup and parallel efficiency against total devices."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pdlsim.plots.axes import figure_bytes, write_figure

__all__ = ["plot_scaling", "scaling_figure", "scaling_png"]


def scaling_figure(frame: pd.DataFrame) -> Figure:
    """Two panels, one line per (ranks per node, batch): speedup (with the ideal line) and
    efficiency against total devices, both on log-2 device axes."""
    figure = Figure(figsize=(10, 4.2))
    speed, eff = figure.subplots(1, 2)
    unit = "GPUs" if (frame["device"] == "gpu").any() else "procs"
    for (per_node, batch), group in frame.groupby(["per_node", "batch"]):
        group = group.sort_values("devices")
        label = f"{per_node} {unit}/node, batch {batch}"
        speed.plot(group["devices"], group["speedup"], marker="o", label=label)
        eff.plot(group["devices"], group["efficiency"], marker="o", label=label)
    top = float(frame["devices"].max())
    speed.plot([1, top], [1, top], color="0.6", linestyle="--", label="ideal")
    for ax, name in ((speed, "speedup vs one device"), (eff, "parallel efficiency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices (ranks)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    speed.set_yscale("log", base=2)
    eff.set_ylim(0, 1.05)
    speed.legend(fontsize="small")
    figure.suptitle("predicted scaling (weak: batch per rank fixed)")
    figure.tight_layout()
    return figure


def plot_scaling(frame: pd.DataFrame, path: str | Path) -> Path:
    """Draw :func:`scaling_figure` of a sweep table (``pdlsim sweep``'s CSV) to ``path``."""
    path = Path(path)
    fmt = path.suffix.lstrip(".") or "png"
    return write_figure(scaling_figure(frame), path, fmt)


def scaling_png(frame: pd.DataFrame) -> bytes:
    """:func:`scaling_figure` of a sweep table as PNG bytes, for writing beside its table."""
    return figure_bytes(scaling_figure(frame), "png")
