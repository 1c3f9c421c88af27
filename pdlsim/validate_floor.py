"""The machine's noise floor: the error a perfect model would show in a validation.

A row's prediction is of the typical step over the validation's span (the drift model's typical
speed, :mod:`pdlsim.validate_speed`); its measurement is the median of a few launches, each of
which caught the machine at one moment. Where the machine's speed switches between levels (the
2-core test machine's does, by 30% and more), even a model that knew the typical step exactly
would be off by however far the median of those launches fell from it. This module estimates
that error from the validation's own speed checks, never from a training run:

* each check's median step over the median of every check of that step is one moment's speed
  level (:func:`speed_levels`, per record name, workload and batch);
* a perfect model's relative error for one row is ``|median of R levels - 1|``, R the launches
  per configuration, the levels drawn with replacement from that row's step (the forward-only
  step for inference rows; the serial step at the row's batch for every mode, since the checks
  time nothing else);
* drawn for every row at once, ``draws`` times (:func:`floor_errors`): the median and the worst
  over the rows of each draw are what a perfect model's summary line could have read, and
  :func:`summarize_floor` gives their P10, P50 and P90.

Two assumptions, which the report states: a launch sees the machine as one speed check does
(each report checks it, :func:`add_noise_floor`: on five full validations of the test
machine, launch medians lay 1.8-5.6% from their configuration's median, drawn check levels
1.8-3.5% from theirs, so if anything launches vary more and the floor is low), and a
configuration's speed moves with its workload's serial step at its batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from microbench.jitter import FORWARD_NAME
from microbench.jitter import NAME as STEP_NAME

__all__ = [
    "FLOOR_DRAWS",
    "add_noise_floor",
    "deviation",
    "floor_errors",
    "speed_levels",
    "summarize_floor",
]

FLOOR_DRAWS = 2000
Levels = dict[tuple[str, str, int, int, str], np.ndarray]  # (name, model, batch, threads, device)


def speed_levels(speed_dir: Path) -> Levels:
    """{(record name, model, batch, threads, device): each speed check's median over their
    median} for the ``microbench speed`` records under ``speed_dir``; empty when there are
    none. Records from before the checks timed GPUs name no device: the CPU."""
    from microbench.records import load_dataframe

    try:
        df = load_dataframe(speed_dir, type="measurement")
    except FileNotFoundError:
        return {}
    if df.empty or "benchmark" not in df:
        return {}
    df = df[df["benchmark"] == "speed"]
    out: Levels = {}
    defaults = {"params.threads": 1, "params.device": "cpu"}
    df = df.assign(**{k: df[k].fillna(v) if k in df else v for k, v in defaults.items()})
    keys = ["name", "params.model", "params.batch", "params.threads", "params.device"]
    for (name, model, batch, threads, device), group in df.groupby(keys):
        medians = np.array([np.median(s) for s in group["samples"]], dtype=float)
        key = (str(name), str(model), int(batch), int(threads), str(device))
        out[key] = medians / np.median(medians)
    return out


def _row_levels(row: dict[str, Any], levels: Levels) -> np.ndarray | None:
    """The levels of the row's step: forward-only for inference, at its thread count where the
    checks timed it, else at one thread (every mode moves with the serial step); a GPU row's,
    its GPU step's (None where the checks did not time the GPU)."""
    device = row.get("device", "cpu")
    names = (FORWARD_NAME, STEP_NAME) if row["inference"] else (STEP_NAME,)
    for threads in dict.fromkeys((1 if device == "gpu" else int(row.get("threads", 1)), 1)):
        for name in names:
            found = levels.get((name, str(row["model"]), int(row["batch"]), threads, device))
            if found is not None:
                return found
    return None


def _picks(
    rows: list[dict[str, Any]], levels: Levels, repeats: int, draws: int, seed: int
) -> list[np.ndarray | None]:
    """Per row, ``draws`` x ``repeats`` levels drawn with replacement (None: no check)."""
    if repeats < 1 or draws < 1:
        raise ValueError(f"repeats and draws must be >= 1, got {repeats} and {draws}")
    rng = np.random.default_rng(seed)
    out: list[np.ndarray | None] = []
    for row in rows:
        level = _row_levels(row, levels)
        ok = level is not None and level.size > 0
        out.append(level[rng.integers(0, level.size, size=(draws, repeats))] if ok else None)
    return out


def floor_errors(
    rows: list[dict[str, Any]],
    levels: Levels,
    repeats: int,
    draws: int = FLOOR_DRAWS,
    seed: int = 0,
) -> np.ndarray:
    """Rows x ``draws``: a perfect model's relative error per row and draw (module docstring);
    a row whose step no speed check timed is NaN."""
    return _errors(_picks(rows, levels, repeats, draws, seed), draws)


def _errors(picks: list[np.ndarray | None], draws: int) -> np.ndarray:
    out = np.full((len(picks), draws), np.nan)
    for i, row_picks in enumerate(picks):
        if row_picks is not None:
            out[i] = np.abs(np.median(row_picks, axis=1) - 1.0)
    return out


def deviation(groups: list[np.ndarray]) -> float | None:
    """The median over every member of every group (a row's launches, or one draw of levels
    for it) of |member / its group's median - 1|; None when no group has two members."""
    devs = [np.abs(g / np.median(g, axis=-1, keepdims=True) - 1.0).ravel() for g in groups]
    devs = [d for d, g in zip(devs, groups, strict=True) if np.shape(g)[-1] > 1]
    return float(np.median(np.concatenate(devs))) if devs else None


def summarize_floor(errors: np.ndarray, repeats: int) -> dict[str, Any]:
    """P10/P50/P90 over the draws of the median and worst error over the rows that have a
    floor (all-NaN rows are left out); ``{"configurations": 0}`` when none has."""
    kept = errors[~np.all(np.isnan(errors), axis=1)] if errors.size else errors
    if kept.size == 0:
        return {"configurations": 0, "repeats": repeats}

    def spread(values: np.ndarray) -> dict[str, float]:
        p10, p50, p90 = np.quantile(values, (0.1, 0.5, 0.9))
        return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}

    return {
        "configurations": int(kept.shape[0]),
        "repeats": repeats,
        "draws": int(kept.shape[1]),
        "median_rel_error": spread(np.median(kept, axis=0)),
        "worst_rel_error": spread(np.max(kept, axis=0)),
    }


def add_noise_floor(rows: list[dict[str, Any]], speed_dir: Path, repeats: int) -> dict[str, Any]:
    """Each row's ``noise_floor_rel_error`` (the median over draws; None without a speed
    check of its step), and the summary over the rows that fit the cores, with the check of
    its first assumption: how far launches lie from their row's median (``launch_deviation``)
    against drawn levels from theirs (``check_deviation``), both over the rows with a floor."""
    picks = _picks(rows, speed_levels(speed_dir), repeats, FLOOR_DRAWS, seed=0)
    errors = _errors(picks, FLOOR_DRAWS)
    for row, errs in zip(rows, errors, strict=True):
        row["noise_floor_rel_error"] = None if np.all(np.isnan(errs)) else float(np.median(errs))
    fits = [i for i, r in enumerate(rows) if not r["oversubscribed"]]
    summary = summarize_floor(errors[fits] if fits else errors[:0], repeats)
    if summary["configurations"]:
        floored = [i for i in fits if picks[i] is not None]
        summary["launch_deviation"] = deviation(
            [np.asarray(rows[i]["launch_medians_s"], dtype=float) for i in floored]
        )
        summary["check_deviation"] = deviation([picks[i] for i in floored])
    return summary
