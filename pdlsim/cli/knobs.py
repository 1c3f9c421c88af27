"""``pdlsim sweep --vary KNOB=V1,V2,...``: one knob at a time against a baseline, and which buys
the most.

Every knob is varied alone from the baseline configuration (the sweep's one --nodes, --gpus or
--procs-per-node and --batch value, with its other options); each value is one prediction. The
report gives, per knob, its best value (the highest throughput; samples per second, so that a
knob that adds devices is judged by what it delivers) and the gain over the baseline, knobs
sorted by gain. A change of the step time smaller than half the baseline's band (P10..P90,
from the fitted parameters' intervals and jitter) is marked: not a gain the profile can vouch
for. Throughput only: local SGD and top-k change what a step learns (convergence per step is
not modelled), so their gains are upper bounds on time to accuracy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from microbench.fileio import atomic_write_all, encode_text
from pdlsim.cli.args import positive_int
from pdlsim.cli.predict_options import compression_arg, positive_number

if TYPE_CHECKING:
    import pandas as pd

    from pdlsim.prediction.config import PredictConfig

__all__ = ["KNOBS", "Knob", "format_report", "parse_vary", "rank_knobs", "run_vary", "vary"]


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got '{text}'")
    return text == "on"


def _balance(text: str) -> str:
    if text not in ("static", "proportional"):
        raise argparse.ArgumentTypeError(f"expected static or proportional, got '{text}'")
    return text


@dataclass(frozen=True)
class Knob:
    """A PredictConfig field, how to read a value of it, and what it means."""

    field: str
    parse: Callable[[str], Any]
    values: str  # what values look like, for messages


KNOBS: dict[str, Knob] = {
    "bucket-mb": Knob("bucket_mb", positive_number, "bucket MiB, e.g. 1,5,25"),
    "overlap": Knob("overlap", _on_off, "on,off"),
    "prefetch": Knob("prefetch", _on_off, "on,off"),
    "compression": Knob("compression", compression_arg, "none,fp16,topk:0.01"),
    "sync-every": Knob("sync_every", positive_int, "steps, e.g. 1,2,4,8"),
    "network-scale": Knob("network_scale", positive_number, "bandwidth factors, e.g. 0.5,2"),
    "latency-scale": Knob("latency_scale", positive_number, "latency factors, e.g. 0.5,2"),
    "nodes": Knob("nodes", positive_int, "node counts, e.g. 8,16,32"),
    "balance": Knob("balance", _balance, "static,proportional"),
}


def parse_vary(text: str) -> tuple[str, tuple[Any, ...], tuple[str, ...]]:
    """argparse type for ``KNOB=V1,V2,...``: (knob, parsed values, their spellings)."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not name:
        raise argparse.ArgumentTypeError(
            f"expected KNOB=V1,V2,... like bucket-mb=10,50, got '{text}'; knobs: {', '.join(KNOBS)}"
        )
    if name not in KNOBS:
        raise argparse.ArgumentTypeError(
            f"unknown knob '{name}' in '{text}'; knobs: {', '.join(KNOBS)}"
        )
    items = [v.strip() for v in values.split(",")] if sep else []
    if not items or not all(items):
        raise argparse.ArgumentTypeError(
            f"give values as {name}=V1,V2,... ({KNOBS[name].values}), got '{text}'"
        )
    parsed = []
    for item in items:
        try:
            parsed.append(KNOBS[name].parse(item))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{name}={item}: {exc}") from None
    if len(set(parsed)) != len(parsed):
        raise argparse.ArgumentTypeError(f"a value of {name} is listed twice in '{text}'")
    return name, tuple(parsed), tuple(items)


def _row(knob: str, value: str, out: dict[str, Any]) -> dict[str, Any]:
    return {
        "knob": knob,
        "value": value,
        "step_time_s": out["step_time_s"],
        "throughput_samples_per_s": out["throughput_samples_per_s"],
        "devices": out["config"]["devices"],
        "comm_overhead_pct": out["comm_overhead_pct"],
        "sync_s": out["breakdown"]["sync_s"],
        "p10_s": out["band"]["p10_s"],
        "p90_s": out["band"]["p90_s"],
    }


def _spelled(knob: str, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def vary(
    base: PredictConfig,
    knobs: list[tuple[str, tuple[Any, ...], tuple[str, ...]]],
    predict: Callable[[PredictConfig], dict[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """One row for the baseline (knob "baseline") and one per knob value, with the gains;
    ``progress(done, total)`` after each prediction."""
    import pandas as pd

    from pdlsim.prediction.checks import MAX_PREDICTIONS
    from pdlsim.prediction.core import check_prediction

    if predict is None:
        from pdlsim.prediction.core import run_prediction as predict
    seen = [name for name, _, _ in knobs]
    twice = {name for name in seen if seen.count(name) > 1}
    if twice:
        raise UserError(f"--vary {sorted(twice)[0]} is given twice; list all its values once")
    total = 1 + sum(len(values) for _, values, _ in knobs)
    if total > MAX_PREDICTIONS:
        raise UserError(
            f"--vary asks for {total:,} predictions; give at most {MAX_PREDICTIONS:,} values "
            "in all, or split it into several sweeps"
        )
    check_prediction(base)  # every value, and the baseline, refused before the first prediction
    for name, values, spellings in knobs:
        for value, spelling in zip(values, spellings, strict=True):
            try:
                check_prediction(replace(base, **{KNOBS[name].field: value}))
            except UserError as exc:
                raise UserError(f"--vary {name}={spelling}: {exc}") from None
    rows = [_row("baseline", "", predict(base))]
    for name, values, spellings in knobs:
        for value, spelling in zip(values, spellings, strict=True):
            try:
                out = predict(replace(base, **{KNOBS[name].field: value}))
            except UserError as exc:
                raise UserError(f"--vary {name}={spelling}: {exc}") from None
            rows.append(_row(name, spelling, out))
            if progress is not None:
                progress(len(rows), total)
    frame = pd.DataFrame(rows)
    base_row = frame.iloc[0]
    frame["throughput_gain_pct"] = 100.0 * (
        frame["throughput_samples_per_s"] / base_row["throughput_samples_per_s"] - 1.0
    )
    frame["step_change_pct"] = 100.0 * (frame["step_time_s"] / base_row["step_time_s"] - 1.0)
    half_band = (base_row["p90_s"] - base_row["p10_s"]) / 2.0
    frame["outside_band"] = (frame["step_time_s"] - base_row["step_time_s"]).abs() > half_band
    return frame


def rank_knobs(frame: pd.DataFrame, base: PredictConfig) -> pd.DataFrame:
    """Per knob: the baseline's value, the best value and its gains, sorted by gain."""
    import pandas as pd

    rows = []
    for name, group in frame[frame["knob"] != "baseline"].groupby("knob", sort=False):
        knob = KNOBS[name]
        top = group["throughput_samples_per_s"].max()
        tied = group[group["throughput_samples_per_s"] >= top * (1.0 - 1e-12)]
        current = tied["value"].map(knob.parse) == getattr(base, knob.field)
        best = tied[current].iloc[0] if current.any() else tied.iloc[0]  # ties: the baseline's
        rows.append(
            {
                "knob": name,
                "baseline_value": _spelled(name, getattr(base, knob.field)),
                "best_value": best["value"],
                "step_time_s": best["step_time_s"],
                "throughput_samples_per_s": best["throughput_samples_per_s"],
                "throughput_gain_pct": best["throughput_gain_pct"],
                "step_change_pct": best["step_change_pct"],
                "outside_band": bool(best["outside_band"]),
                "baseline_is_best": knob.parse(best["value"]) == getattr(base, knob.field),
            }
        )
    ranking = pd.DataFrame(rows)
    return ranking.sort_values("throughput_gain_pct", ascending=False, ignore_index=True)


def format_report(frame: pd.DataFrame, ranking: pd.DataFrame) -> str:
    """The per-value table, then the knobs ranked by what their best value buys."""
    base = frame.iloc[0]
    lines = [
        f"baseline: step {base['step_time_s'] * 1e3:.4g} ms (band {base['p10_s'] * 1e3:.4g}.."
        f"{base['p90_s'] * 1e3:.4g} ms), {base['throughput_samples_per_s']:,.0f} samples/s",
        "",
    ]
    table = frame.iloc[1:].assign(step_ms=frame["step_time_s"] * 1e3)
    cols = ["knob", "value", "devices", "step_ms", "throughput_samples_per_s",
            "throughput_gain_pct", "comm_overhead_pct"]  # fmt: skip
    lines.append(table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    lines += ["", "which knob buys the most (best value of each, by throughput):"]
    for r in ranking.itertuples():
        note = "" if r.outside_band else "  (within the baseline's band: no clear gain)"
        if r.baseline_is_best:
            note = "  (the baseline's value is best)"
        lines.append(
            f"  {r.knob:<14} {r.baseline_value:>8} -> {r.best_value:<10} "
            f"throughput {r.throughput_gain_pct:+7.1f}%  step {r.step_change_pct:+7.1f}%{note}"
        )
    return "\n".join(lines)


def run_vary(
    args: argparse.Namespace,
    cfg: PredictConfig,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """``pdlsim sweep ... --vary ...``: the baseline is the one configuration the other flags
    give; writes ``knobs.csv`` (every value) and ``knob_ranking.csv`` under ``--out``."""
    given = {"--nodes": args.nodes, "--gpus": args.gpus or (0,)}
    given.update({"--procs-per-node": args.procs_per_node, "--batch": args.batch})
    for flag, values in given.items():
        if len(values) > 1:
            raise UserError(
                f"with --vary, give one value of {flag} (the baseline); vary nodes with "
                "--vary nodes=..."
            )
    base = replace(cfg, nodes=args.nodes[0])
    frame = vary(base, args.vary, progress=progress)
    ranking = rank_knobs(frame, base)
    atomic_write_all({  # the table and its ranking, both or neither
        args.out / "knobs.csv": encode_text(frame.to_csv(index=False)),
        args.out / "knob_ranking.csv": encode_text(ranking.to_csv(index=False)),
    })  # fmt: skip
    print(format_report(frame, ranking))
    print(f"tables: {args.out / 'knobs.csv'}, {args.out / 'knob_ranking.csv'}")
    return 0
