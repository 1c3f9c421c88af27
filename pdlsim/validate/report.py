"""The rows, summary, files and printed tables of ``pdlsim validate`` (see
:mod:`pdlsim.validate.run`).

Relative error = |predicted P50 - measured median| / measured median. "In band": the measured
median lies within the prediction's P10..P90.

Rows say their ``parallel`` mode (data or model) and whether they are ``inference`` (forward
only). Model-parallel rows are strong scaling (:mod:`pdlsim.validate.run`); their communication is
``allgather`` + ``allreduce`` (of activations and input gradients), their ``wait`` the barrier
at the step start. Their plots are drawn as a workload of their own (``mlp-model``,
``mlp-model-inference``), so that their points never join the data-parallel lines.

Memory per rank: predicted (``pdlsim predict``'s parts), the arrays training allocated (its
own count of the same parts; the CNN's im2col columns make its activations larger than the
prediction's) and the peak resident memory of the biggest rank (the interpreter, numpy, numba
and MPI included).

Energy per sample (:mod:`pdlsim.prediction.energy`): the prediction's, and the same power model
applied to the measured step and phases (forward + backward + update busy, the rest polling), so
that the two differ only by what was measured; no power counter is read (most machines, this one
too, do not expose them to users).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from microbench.fileio import atomic_write_text
from pdlsim.validate.machine_speed import speed_line

__all__ = [
    "COLUMNS",
    "build_rows",
    "by_ranks",
    "format_breakdown",
    "format_ablation",
    "format_report",
    "summarize",
    "ablation",
]

PHASES = ("data", "h2d", "forward", "backward", "wait", "allreduce", "allgather", "update")
# measured_skew_s: the ranks' mean wait (T_sync), beside the slowest rank's phases above
MEASURED = (*PHASES, "skew")
COLUMNS = (
    "set", "model", "mode", "parallel", "inference", "device", "prefetch", "procs", "threads",
    "batch", "oversubscribed",
    "steps",
    "measured_s", "measured_low_s", "measured_high_s",
    "predicted_p50_s", "predicted_p10_s", "predicted_p90_s", "predicted_step_s",
    "rel_error", "in_band",
    "measured_speedup", "measured_speedup_low", "measured_speedup_high",
    "predicted_speedup", "predicted_speedup_low", "predicted_speedup_high",
    *(f"measured_{p}_s" for p in MEASURED),
    "predicted_compute_s", "predicted_comm_s", "predicted_sync_s",
    "predicted_energy_j_per_sample", "measured_activity_energy_j_per_sample",
    "predicted_memory_bytes", "measured_model_state_bytes", "measured_peak_rss_bytes",
    "steal_max",
)  # fmt: skip
HELDOUT, IN_SAMPLE = "held-out", "in-sample"


def build_rows(results: list[tuple[Any, dict[str, Any], dict[str, Any]]], cores: int) -> list:
    """One flat row per configuration from (RunSpec, measurement, prediction) triples."""
    rows = []
    for spec, meas, pred in results:
        band, b = pred["band"], pred["breakdown"]
        row: dict[str, Any] = {
            "set": HELDOUT if spec.heldout else IN_SAMPLE, "model": spec.name,
            "workload_file": spec.model, "mode": spec.mode, "parallel": spec.parallel,
            "inference": spec.inference, "device": spec.device, "prefetch": spec.prefetch,
            "procs": spec.procs,
            "threads": spec.threads, "batch": spec.batch,
            "oversubscribed": spec.oversubscribed(cores), "steps": meas["steps"],
            "measured_s": meas["measured_s"], "measured_low_s": meas["measured_low_s"],
            "measured_high_s": meas["measured_high_s"],
            "launch_medians_s": meas["repeat_medians_s"],  # JSON only: in launch order
            "predicted_p50_s": band["p50_s"], "predicted_p10_s": band["p10_s"],
            "predicted_p90_s": band["p90_s"], "predicted_step_s": pred["step_time_s"],
        }  # fmt: skip
        m, p50 = row["measured_s"], row["predicted_p50_s"]
        row["rel_error"] = abs(p50 - m) / m
        row["in_band"] = bool(band["p10_s"] <= m <= band["p90_s"])
        for phase in MEASURED:
            row[f"measured_{phase}_s"] = meas["measured_phases_s"].get(phase, 0.0)
        for term in ("compute", "comm", "sync"):
            row[f"predicted_{term}_s"] = b[f"{term}_s"]
        row.update(_energy(spec, meas, pred))
        row["predicted_memory_bytes"] = pred["memory_bytes_per_rank"]
        row["measured_model_state_bytes"] = meas["measured_model_state_bytes"]
        row["measured_peak_rss_bytes"] = meas["measured_peak_rss_bytes"]
        row["steal_max"] = meas.get("steal_max")
        row["predicted_serial_s"] = pred["single_device_step_time_s"]  # model rows' baseline
        rows.append(row)
    _add_speedups(rows)
    return rows


def _energy(spec: Any, meas: dict[str, Any], pred: dict[str, Any]) -> dict[str, float]:
    """Joules per sample: predicted, and the prediction's power model on the measured step."""
    from pdlsim.prediction.energy import PowerModel, StepActivity, estimate_energy

    energy = pred["energy"]
    activity = StepActivity.from_phases(
        meas["measured_phases_s"], meas["measured_s"], spec.procs, spec.threads, spec.device
    )
    measured = estimate_energy(
        activity,
        PowerModel(**energy["power_model"]),
        energy["steps_per_epoch"],
        energy["dataset_samples"],
    )
    return {
        "predicted_energy_j_per_sample": energy["joules_per_sample"],
        "measured_activity_energy_j_per_sample": measured["joules_per_sample"],
    }


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """Throughput over that of P1T1 at the same model and batch per rank (NaN without one);
    a GPU row's is the serial CPU run's step over its own.

    Model-parallel rows (same global batch, so no factor P): measured against the serial
    data-parallel run's step, or its data + h2d + forward phases for inference; predicted
    against the layer-wise prediction's own one-rank step (``predicted_serial_s``)."""
    serial = {
        (r["model"], r["batch"]): r
        for r in rows
        if (r["procs"], r["threads"]) == (1, 1)
        and r["parallel"] == "data"
        and not r["inference"]
        and r.get("device", "cpu") == "cpu"
    }
    for r in rows:
        base = serial.get((r["model"], r["batch"]))
        p = r["procs"]
        if base is None:
            for k in ("", "_low", "_high"):
                r[f"measured_speedup{k}"] = r[f"predicted_speedup{k}"] = float("nan")
            continue
        sm, sp = base["measured_s"], base["predicted_p50_s"]
        if r["parallel"] == "model":
            p, sp = 1, r["predicted_serial_s"]
            if r["inference"]:
                sm = sum(base[f"measured_{phase}_s"] for phase in ("data", "h2d", "forward"))
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


def _band_width(rows: list[dict[str, Any]]) -> float | None:
    widths = [(r["predicted_p90_s"] - r["predicted_p10_s"]) / r["predicted_p50_s"] for r in rows]
    return float(np.median(widths)) if widths else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`_stats` and the median band width (P90 - P10) / P50."""
    return {**_stats(rows), "median_band_width": _band_width(rows)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Held-out and in-sample apart, rows that fit the cores (:func:`_summary`)."""
    return {
        key: _summary([r for r in rows if r["set"] == key and not r["oversubscribed"]])
        for key in (HELDOUT, IN_SAMPLE)
    }


def by_ranks(rows: list[dict[str, Any]], calibrated: int) -> dict[str, Any] | None:
    """Each set's rows within the ``calibrated`` ranks per node and beyond them (every
    validated row runs on one node), where any row is beyond: the extrapolation in ranks that
    a calibration at 1-2 ranks on a many-core node makes, scored apart. None where none is."""
    rows = [r for r in rows if not r["oversubscribed"]]
    beyond = [r for r in rows if r["procs"] > calibrated]
    if not beyond:
        return None
    out: dict[str, Any] = {
        "calibrated_ranks_per_node": calibrated,
        "beyond_ranks": sorted({r["procs"] for r in beyond}),
    }
    for key in (HELDOUT, IN_SAMPLE):
        part = [r for r in rows if r["set"] == key]
        out[key] = {
            "within": _summary([r for r in part if r["procs"] <= calibrated]),
            "beyond": _summary([r for r in part if r["procs"] > calibrated]),
        }
    return out


def ablation(
    rows: list[dict[str, Any]], others: dict[str, list[dict[str, Any]]], chosen: str
) -> list[dict[str, Any]]:
    """The summary of each correction set in ``others`` (name -> its predictions, in row
    order), held-out and in-sample apart. The chosen set is scored from its entry there when it
    has one, predicted again as the others are: a band from fewer draws is narrower, so only
    sets drawn alike compare; from the rows' own predictions otherwise."""
    table = [] if chosen in others else [{"corrections": chosen, **summarize(rows)}]
    for name, predictions in others.items():
        moved = []
        for r, pred in zip(rows, predictions, strict=True):
            band, m = pred["band"], r["measured_s"]
            moved.append(
                {**r, "predicted_p50_s": band["p50_s"], "predicted_p10_s": band["p10_s"],
                 "predicted_p90_s": band["p90_s"], "rel_error": abs(band["p50_s"] - m) / m,
                 "in_band": bool(band["p10_s"] <= m <= band["p90_s"])}
            )  # fmt: skip
        table.append({"corrections": name, **summarize(moved)})
    return table


def _stolen(r: dict[str, Any]) -> bool:
    """Whether a launch of the row ran while the hypervisor took over 5% of the CPU."""
    return r.get("steal_max") is not None and r["steal_max"] > 0.05


def _name(r: dict[str, Any]) -> str:
    if r.get("device", "cpu") == "gpu":
        return f"{r['model']} {r['mode']} b{r['batch']}"
    tags = " model" * (r["parallel"] == "model") + " inference" * bool(r["inference"])
    return f"{r['model']} P{r['procs']}T{r['threads']} b{r['batch']}{tags}"


def _mode(r: dict[str, Any]) -> str:
    return r["mode"] + "-inf" * bool(r["inference"])


def _plot_row(r: dict[str, Any]) -> dict[str, Any]:
    """A model-parallel or inference row as a workload of its own in the plots."""
    tags = "-model" * (r["parallel"] == "model") + "-inference" * bool(r["inference"])
    return {**r, "model": r["model"] + tags} if tags else r


def write_outputs(report: dict[str, Any], out: Path) -> list[str]:
    """validation.csv, validation.json and the PNG plots in ``out``: the written paths."""
    from pdlsim.plots.validation import plot_validation

    out.mkdir(parents=True, exist_ok=True)
    rows = report["rows"]
    csv_path = out / "validation.csv"
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
    atomic_write_text(csv_path, table.getvalue())
    plots = [str(p) for p in plot_validation([_plot_row(r) for r in rows], out)]
    files = [str(csv_path), str(out / "validation.json"), *plots]
    doc = {"schema": "pdlsim.validation", "schema_version": 1, **report, "files": files}
    # Strict JSON: a figure that is no number (a speedup without a serial row, NaN; an error
    # against nothing, inf) is null, which every JSON reader parses; NaN and Infinity are not
    # JSON, and jq, JavaScript and most others refuse the whole file over one.
    text = json.dumps(_finite(doc), indent=2, default=_jsonable, allow_nan=False)
    atomic_write_text(out / "validation.json", text)
    return files


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite (numpy's too) replaced by None."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)) and not np.isfinite(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    return str(value)


def _pct(share: float | None) -> str:
    return f"{'-':>5}" if share is None else f"{100 * share:4.0f}%"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f}"


def _summary_line(title: str, s: dict[str, Any]) -> str:
    if not s.get("configurations"):
        return f"{title}: no configurations"
    return (
        f"{title}: {s['configurations']} configurations, median error "
        f"{100 * s['median_rel_error']:.1f}%, worst {100 * s['worst_rel_error']:.1f}% "
        f"({s['worst_configuration']}), inside P10-P90 {100 * s['in_band_fraction']:.0f}%, "
        f"median band width {100 * s['median_band_width']:.0f}%"
    )


def _ranks_lines(split: dict[str, Any] | None) -> list[str]:
    """The summary lines of :func:`by_ranks`, held-out first; none without rows beyond."""
    if not split:
        return []
    calibrated = split["calibrated_ranks_per_node"]
    titles = {
        "within": f"within the calibrated {calibrated} ranks per node",
        "beyond": f"beyond them ({', '.join(map(str, split['beyond_ranks']))} ranks)",
    }
    return [
        _summary_line(f"{key}, {title}", split[key][side])
        for key in (HELDOUT, IN_SAMPLE)
        for side, title in titles.items()
    ]


def format_ablation(table: list[dict[str, Any]]) -> str:
    """Each correction set's held-out and in-sample figures side by side."""
    lines = [
        f"{'corrections':34} | {'held-out: median':>16} {'worst':>6} {'band':>5} | "
        f"{'in-sample: median':>17} {'worst':>6} {'band':>5}"
    ]
    for entry in table:
        cells = []
        for key in (HELDOUT, IN_SAMPLE):
            s = entry[key]
            if not s.get("configurations"):
                cells.append(f"{'-':>16} {'-':>6} {'-':>5}")
                continue
            cells.append(
                f"{100 * s['median_rel_error']:15.1f}% {100 * s['worst_rel_error']:5.1f}% "
                f"{100 * s['in_band_fraction']:4.0f}%"
            )
        lines.append(f"{entry['corrections']:34} | {cells[0]} | {cells[1]:>30}")
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    prov, summary, held = report["provenance"], report["summary"], report["heldout"]
    width = max([12, *(len(r["model"]) for r in report["rows"])])  # whole names: none alike
    lines = [
        _summary_line(
            "held-out (workloads and batches the calibration never ran)", summary[HELDOUT]
        ),
        _summary_line("in-sample (the calibration's workloads and batches)", summary[IN_SAMPLE]),
        *_ranks_lines(report.get("by_ranks")),
        "",
        f"profile {prov['profile']} (created {prov['created_utc']}; {prov['source']}; "
        f"calibration {prov.get('calibration', 'given')}; measured on {prov.get('measured_on')}); "
        f"corrections: {prov['corrections']}",
        *([f"warning: {prov['machine_warning']}"] if prov.get("machine_warning") else []),
        *[f"warning: {line}" for line in prov.get("calibration_warnings", ())],
        f"held-out set: seed {held['seed']}, {len(held['workloads'])} random workloads, "
        f"batches {','.join(map(str, held['batches']))}",
        *[f"not run: {line}" for line in held["refused"]],
        f"{report['cores']} cores; {report['repeats']} launches per configuration, at least "
        f"{report['min_steps_per_run']} steps each, {report['warmup']}; step = max over ranks; "
        f"interval = {report['interval']}",
        f"speedup = {report['speedup']}",
        *filter(None, [speed_line(report.get("machine_speed"))]),
        "",
        f"{'set':9} {'model':{width}} {'mode':12} {'P':>2} {'T':>2} {'batch':>5} "
        f"{'meas ms':>8} {'[min..max]':>19} {'pred P50':>8} {'[P10..P90]':>19} "
        f"{'err':>6} {'band':>4} {'S meas':>6} {'S pred':>6} {'steal':>5}",
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['set']:9} {r['model']:{width}} {_mode(r):12} {r['procs']:>2} {r['threads']:>2} "
            f"{r['batch']:>5} {_ms(r['measured_s'])} "
            f"[{_ms(r['measured_low_s'])}..{_ms(r['measured_high_s'])}] "
            f"{_ms(r['predicted_p50_s'])} "
            f"[{_ms(r['predicted_p10_s'])}..{_ms(r['predicted_p90_s'])}] "
            f"{100 * r['rel_error']:5.1f}% {'yes' if r['in_band'] else 'no':>4} "
            f"{r['measured_speedup']:6.2f} {r['predicted_speedup']:6.2f} {_pct(r.get('steal_max'))}"
        )
    lines += ["", format_ablation(report["ablation"])]
    if report.get("checkpoint"):  # pdlsim.validate.checkpoint
        from pdlsim.validate.checkpoint import format_checkpoint_check

        lines.append(format_checkpoint_check(report["checkpoint"]))
    lines.append(f"elapsed {report['elapsed_s']:.0f} s; files: {', '.join(report['files'])}")
    return "\n".join(lines)


def format_breakdown(rows: list[dict[str, Any]]) -> str:
    """Measured phases (slowest rank, median) against the predicted compute/comm/sync."""
    lines = [
        "breakdown, ms: measured phases of the slowest rank (median over steps): compute = "
        "data+h2d+forward+backward+update, comm = allreduce (+ allgather, model parallel); "
        "measured sync = the ranks' mean wait at the barrier (the slowest rank's own is in "
        "'wait'; model parallel: waits inside the collectives are in comm); energy per sample, "
        "mJ: the power model applied to the measured phases (a consistency check of the model "
        "against itself, not a measurement of energy), and predicted; memory per rank, MiB: "
        "predicted, training's arrays, peak RSS",
        f"{'configuration':30} {'data':>6} {'fwd':>7} {'bwd':>7} {'upd':>6} {'wait':>6} "
        f"{'allred':>6} | {'meas comp':>9} {'pred comp':>9} {'meas comm':>9} {'pred comm':>9} "
        f"{'meas sync':>9} {'pred sync':>9} | {'meas mJ':>7} {'pred mJ':>7} | "
        f"{'pred':>6} {'arrays':>6} {'rss':>6}",
    ]
    for r in rows:
        g = {p: 1e3 * r.get(f"measured_{p}_s", 0.0) for p in MEASURED}
        comp = g["data"] + g["forward"] + g["backward"] + g["update"] + g["h2d"]
        comm = g["allreduce"] + g["allgather"]
        lines.append(
            f"{_name(r):30} {g['data']:6.3f} {g['forward']:7.3f} {g['backward']:7.3f} "
            f"{g['update']:6.3f} {g['wait']:6.3f} {g['allreduce']:6.3f} | {comp:9.3f} "
            f"{1e3 * r['predicted_compute_s']:9.3f} {comm:9.3f} "
            f"{1e3 * r['predicted_comm_s']:9.3f} {g['skew']:9.3f} "
            f"{1e3 * r['predicted_sync_s']:9.3f} | "
            f"{1e3 * r['measured_activity_energy_j_per_sample']:7.3f} "
            f"{1e3 * r['predicted_energy_j_per_sample']:7.3f} | "
            f"{r['predicted_memory_bytes'] / 2**20:6.1f} "
            f"{r['measured_model_state_bytes'] / 2**20:6.1f} "
            f"{r['measured_peak_rss_bytes'] / 2**20:6.1f}"
        )
    return "\n".join(lines)
