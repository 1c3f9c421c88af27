"""The rows, summary, files and printed tables of ``pdlsim validate`` (see :mod:`pdlsim.validate`).

Relative error = |predicted P50 - measured median| / measured median. "In band": the measured
median lies within the prediction's P10..P90.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["COLUMNS", "build_rows", "format_breakdown", "format_report", "summarize"]

PHASES = ("data", "h2d", "forward", "backward", "wait", "allreduce", "update")
COLUMNS = (
    "model", "mode", "procs", "threads", "batch", "oversubscribed", "steps",
    "measured_s", "measured_low_s", "measured_high_s",
    "predicted_p50_s", "predicted_p10_s", "predicted_p90_s", "predicted_step_s",
    "rel_error", "in_band",
    "measured_speedup", "measured_speedup_low", "measured_speedup_high",
    "predicted_speedup", "predicted_speedup_low", "predicted_speedup_high",
    *(f"measured_{p}_s" for p in PHASES),
    "predicted_compute_s", "predicted_comm_s", "predicted_sync_s",
)  # fmt: skip


def build_rows(results: list[tuple[Any, dict[str, Any], dict[str, Any]]], cores: int) -> list:
    """One flat row per configuration from (RunSpec, measurement, prediction) triples."""
    rows = []
    for spec, meas, pred in results:
        band, b = pred["band"], pred["breakdown"]
        row: dict[str, Any] = {
            "model": spec.model, "mode": spec.mode, "procs": spec.procs,
            "threads": spec.threads, "batch": spec.batch,
            "oversubscribed": spec.oversubscribed(cores), "steps": meas["steps"],
            "measured_s": meas["measured_s"], "measured_low_s": meas["measured_low_s"],
            "measured_high_s": meas["measured_high_s"],
            "predicted_p50_s": band["p50_s"], "predicted_p10_s": band["p10_s"],
            "predicted_p90_s": band["p90_s"], "predicted_step_s": pred["step_time_s"],
        }  # fmt: skip
        m, p50 = row["measured_s"], row["predicted_p50_s"]
        row["rel_error"] = abs(p50 - m) / m
        row["in_band"] = bool(band["p10_s"] <= m <= band["p90_s"])
        for phase in PHASES:
            row[f"measured_{phase}_s"] = meas["measured_phases_s"].get(phase, 0.0)
        for term in ("compute", "comm", "sync"):
            row[f"predicted_{term}_s"] = b[f"{term}_s"]
        rows.append(row)
    _add_speedups(rows)
    return rows


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """Throughput over that of P1T1 at the same model and batch per rank (NaN without one)."""
    serial = {(r["model"], r["batch"]): r for r in rows if (r["procs"], r["threads"]) == (1, 1)}
    for r in rows:
        base = serial.get((r["model"], r["batch"]))
        p = r["procs"]
        if base is None:
            for k in ("", "_low", "_high"):
                r[f"measured_speedup{k}"] = r[f"predicted_speedup{k}"] = float("nan")
            continue
        sm, sp = base["measured_s"], base["predicted_p50_s"]
        r["measured_speedup"] = p * sm / r["measured_s"]
        r["measured_speedup_low"] = p * sm / r["measured_high_s"]
        r["measured_speedup_high"] = p * sm / r["measured_low_s"]
        r["predicted_speedup"] = p * sp / r["predicted_p50_s"]
        r["predicted_speedup_low"] = p * sp / r["predicted_p90_s"]
        r["predicted_speedup_high"] = p * sp / r["predicted_p10_s"]


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"configurations": 0}
    errors = np.array([r["rel_error"] for r in rows])
    return {
        "configurations": len(rows),
        "median_rel_error": float(np.median(errors)),
        "worst_rel_error": float(errors.max()),
        "worst_configuration": _name(rows[int(errors.argmax())]),
        "in_band_fraction": float(np.mean([r["in_band"] for r in rows])),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "all": _stats(rows),
        "not_oversubscribed": _stats([r for r in rows if not r["oversubscribed"]]),
    }


def _name(r: dict[str, Any]) -> str:
    return f"{r['model']} P{r['procs']}T{r['threads']} b{r['batch']}"


def write_outputs(report: dict[str, Any], out: Path) -> list[str]:
    """validation.csv, validation.json and the PNG plots in ``out``: the written paths."""
    from pdlsim.plots.validation import plot_validation

    out.mkdir(parents=True, exist_ok=True)
    rows = report["rows"]
    csv_path = out / "validation.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
    plots = [str(p) for p in plot_validation(rows, out)]
    files = [str(csv_path), str(out / "validation.json"), *plots]
    doc = {"schema": "pdlsim.validation", "schema_version": 1, **report, "files": files}
    tmp = out / "validation.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=_jsonable, allow_nan=True))
    tmp.replace(out / "validation.json")
    return files


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    return str(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f}"


def format_report(report: dict[str, Any]) -> str:
    prov = report["provenance"]
    lines = [
        f"profile {prov['profile']} (created {prov['created_utc']}; {prov['source']})",
        f"{report['cores']} cores; {report['repeats']} launches per configuration, at least "
        f"{report['min_steps_per_run']} steps each, {report['warmup']}; step = max over ranks; "
        f"interval = {report['interval']}",
        f"speedup = {report['speedup']}",
        "",
        f"{'model':5} {'mode':7} {'P':>2} {'T':>2} {'batch':>5} {'over':>4} "
        f"{'meas ms':>8} {'[min..max]':>19} {'pred P50':>8} {'[P10..P90]':>19} "
        f"{'err':>6} {'band':>4} {'S meas':>6} {'S pred':>6}",
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['model']:5} {r['mode']:7} {r['procs']:>2} {r['threads']:>2} {r['batch']:>5} "
            f"{'yes' if r['oversubscribed'] else 'no':>4} {_ms(r['measured_s'])} "
            f"[{_ms(r['measured_low_s'])}..{_ms(r['measured_high_s'])}] "
            f"{_ms(r['predicted_p50_s'])} "
            f"[{_ms(r['predicted_p10_s'])}..{_ms(r['predicted_p90_s'])}] "
            f"{100 * r['rel_error']:5.1f}% {'yes' if r['in_band'] else 'no':>4} "
            f"{r['measured_speedup']:6.2f} {r['predicted_speedup']:6.2f}"
        )
    lines.append("")
    for key, title in (("all", "all"), ("not_oversubscribed", "excluding oversubscribed")):
        s = report["summary"][key]
        if s["configurations"]:
            lines.append(
                f"{title}: {s['configurations']} configurations, median error "
                f"{100 * s['median_rel_error']:.1f}%, worst {100 * s['worst_rel_error']:.1f}% "
                f"({s['worst_configuration']}), inside P10-P90 {100 * s['in_band_fraction']:.0f}%"
            )
    lines.append(f"elapsed {report['elapsed_s']:.0f} s; files: {', '.join(report['files'])}")
    return "\n".join(lines)


def format_breakdown(rows: list[dict[str, Any]]) -> str:
    """Measured phases (slowest rank, median) against the predicted compute/comm/sync."""
    lines = [
        "breakdown, ms: measured compute = data+forward+backward+update, comm = allreduce, "
        "sync = wait (barrier)",
        f"{'configuration':22} {'data':>6} {'fwd':>7} {'bwd':>7} {'upd':>6} {'wait':>6} "
        f"{'allred':>6} | {'meas comp':>9} {'pred comp':>9} {'meas comm':>9} {'pred comm':>9} "
        f"{'meas sync':>9} {'pred sync':>9}",
    ]
    for r in rows:
        g = {p: 1e3 * r[f"measured_{p}_s"] for p in PHASES}
        comp = g["data"] + g["forward"] + g["backward"] + g["update"] + g["h2d"]
        lines.append(
            f"{_name(r):22} {g['data']:6.3f} {g['forward']:7.3f} {g['backward']:7.3f} "
            f"{g['update']:6.3f} {g['wait']:6.3f} {g['allreduce']:6.3f} | {comp:9.3f} "
            f"{1e3 * r['predicted_compute_s']:9.3f} {g['allreduce']:9.3f} "
            f"{1e3 * r['predicted_comm_s']:9.3f} {g['wait']:9.3f} "
            f"{1e3 * r['predicted_sync_s']:9.3f}"
        )
    return "\n".join(lines)
