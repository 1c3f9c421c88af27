"""Plots: every figure pdlsim draws, and the only package that imports matplotlib.

Figures are built as :class:`matplotlib.figure.Figure` objects and saved straight to files, with
no pyplot state: nothing is shown, nothing is left open, and drawing is safe in batch jobs and
threads. The Agg backend is selected at import unless the user's program already imported pyplot
(a notebook keeps its own backend; these figures never use it).

:func:`plot_calibration` draws the fit plots of a calibration: what was measured, the fitted
curve and the residuals, one file per model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")

import pandas as pd  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from pdlsim.plots.axes import write_figure  # noqa: E402
from pdlsim.plots.calibration import (  # noqa: E402
    collectives_figure,
    compute_figure,
    jitter_figure,
    transfer_figure,
)
from pdlsim.plots.scaling import plot_scaling  # noqa: E402
from pdlsim.plots.validation import plot_validation  # noqa: E402

__all__ = ["plot_calibration", "plot_scaling", "plot_validation", "save_figure"]


def save_figure(figure: Figure, path: Path, fmt: str) -> Path:
    return write_figure(figure, path, fmt)


def check_format(fmt: str) -> None:
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise ValueError(f"cannot write plots as {fmt!r}; formats: {', '.join(sorted(supported))}")


def plot_calibration(
    models: dict[str, Any], frame: pd.DataFrame, out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Fit plots of a calibration into ``out_dir`` (created): the written paths, in order.

    ``models``: the fitted models of :func:`calibration.pipeline.fit_profile` ("collectives",
    "compute", "jitter", "transfer"); one that is None or absent is skipped. ``frame``: the
    measurement records (:func:`calibration.pipeline.load_measurements`). Files:
    ``collectives``, ``compute``, ``jitter`` and ``transfer`` with the suffix ``fmt`` (any
    format matplotlib writes: "png", "svg", "pdf"). A figure that has nothing measured to show
    (collectives or transfer without their records) is not written.
    """
    check_format(fmt)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawers: dict[str, Callable[[Any, pd.DataFrame], Figure | None]] = {
        "collectives": collectives_figure,
        "compute": compute_figure,
        "jitter": jitter_figure,
        "transfer": transfer_figure,
    }
    written = []
    for name, draw in drawers.items():
        model = models.get(name)
        figure = None if model is None else draw(model, frame)
        if figure is not None:
            written.append(save_figure(figure, out / f"{name}.{fmt}", fmt))
    return written
