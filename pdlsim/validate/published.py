"""``pdlsim validate --published``: pdlsim's GPU cluster model against published measurements.

Each row of ``published.json`` is a measurement someone published, with its source precise
enough to be checked: nccl-tests bus bandwidth of an allreduce on a named system, predicted
from the hardware descriptions alone (:mod:`pdlsim.costmodel.gpu_fabric`), or data-parallel
training throughput on N GPUs, predicted from the one figure a row may give as input, the same
job's single-GPU throughput (``pdlsim predict --step-time``). Nothing is fitted to the rows. A
row whose figure set one of the model's assumptions (``used_for``) or that was seen while the
model was built (``seen``) is scored apart from the held-out rows, so that the headline is what
the model says of measurements it never met.

The issue's targets are stated beside the figures: median error at most 10% and worst at most
25% over at least 20 rows spanning at least 3 systems and 2 to 32 or more nodes.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import read_json

__all__ = ["PUBLISHED", "format_published", "score_published"]

PUBLISHED = Path(__file__).with_name("published.json")
GROUPS = ("held-out", "set an assumption", "seen while building")
TARGET = {"median_pct": 10.0, "worst_pct": 25.0, "rows": 20, "systems": 3, "max_nodes": 32}


def _group(row: dict[str, Any]) -> str:
    if row.get("used_for"):
        return "set an assumption"
    return "seen while building" if row.get("seen") else "held-out"


def _predicted(row: dict[str, Any], hardware: Any) -> dict[str, Any]:
    kinds = {"allreduce_busbw": _busbw, "training_throughput": _throughput}
    if row.get("kind") not in kinds:
        raise UserError(
            f"published row {row.get('id')}: unknown kind {row.get('kind')!r}; known: "
            f"{', '.join(kinds)}"
        )
    node = hardware.node(row["node"])
    predicted, low, high, algorithm = kinds[row["kind"]](row, node, hardware)
    published = float(row["published"])
    return {
        "id": row["id"], "kind": row["kind"], "group": _group(row), "node": node.name,
        "nodes": row["nodes"], "gpus": row["nodes"] * row["gpus_per_node"],
        "what": _what(row), "unit": UNITS[row["kind"]], "published": published,
        "predicted": predicted, "band": [low, high], "in_band": low <= published <= high,
        "error_pct": 100.0 * (predicted - published) / published, "algorithm": algorithm,
        "source": row["source"], "note": row.get("note", ""),
    }  # fmt: skip


UNITS = {"allreduce_busbw": "GB/s", "training_throughput": "samples/s"}


def _what(row: dict[str, Any]) -> str:
    if row["kind"] == "allreduce_busbw":
        return f"allreduce {row['size_bytes']} B"
    tokens = f" s{row['tokens']}" if "tokens" in row else ""
    return f"{row['model']}{tokens} b{row['batch']} {row.get('label', row['precision'])}"


def _busbw(row: dict[str, Any], node: Any, hardware: Any) -> tuple[float, float, float, str]:
    """nccl-tests' bus bandwidth of the row's allreduce, GB/s, and its band."""
    from pdlsim.costmodel.gpu_fabric import collective_band, fabric_of

    fabric = fabric_of(node, hardware.network(node.network), row["nodes"], row["gpus_per_node"])
    band = collective_band("allreduce", row["size_bytes"], fabric, hardware.assumptions,
                           row.get("algorithm"))  # fmt: skip
    return (band.central.busbw_bytes_per_s / 1e9, band.slowest.busbw_bytes_per_s / 1e9,
            band.fastest.busbw_bytes_per_s / 1e9, band.central.algorithm)  # fmt: skip


def _throughput(row: dict[str, Any], node: Any, hardware: Any) -> tuple[float, float, float, str]:
    """Samples per second of data-parallel training on the row's GPUs, from the one figure
    taken as input: the single GPU's throughput at the same batch, sequence length
    (``tokens``) and precision (``--step-time``, per micro-batch where the row accumulates
    ``grad_accum`` of them per optimizer step). A single-GPU figure measured at another
    accumulation (``single_gpu_grad_accum``) carries that accumulation's share of the update,
    not the row's (``--step-time-accum``)."""
    from pdlsim import api
    from pdlsim.costmodel.presets import NODE_PRESETS

    if row["node"] not in NODE_PRESETS:
        raise UserError(f"published row {row['id']}: a training row takes a packaged node")
    accumulation = int(row.get("grad_accum", 1))
    measured_at = int(row.get("single_gpu_grad_accum", accumulation))
    gpus = row["nodes"] * row["gpus_per_node"]
    samples = row["batch"] * gpus * accumulation  # an optimizer step's
    step_ms = 1e3 * row["batch"] / float(row["single_gpu_samples_per_s"])
    out = api.predict(
        row["model"],
        api.Cluster.gpus(row["nodes"], row["gpus_per_node"]),
        batch=row["batch"],
        node=row["node"],
        gpu_preset=row.get("gpu"),
        precision=row["precision"],
        optimizer=row["optimizer"],
        tokens=row.get("tokens"),
        grad_accum=accumulation,
        step_time=f"{step_ms!r}ms",
        step_time_accum=measured_at,
        samples=20,
        iterations=3,  # GPU ranks draw no jitter: every simulated step is the same step
        dataset_samples=samples,  # one optimizer step an epoch: no epoch is read here
    )
    band = out["band"]
    algorithm = out["buckets"][0]["algorithm"] if out["buckets"] else "none"
    return (out["throughput_samples_per_s"], samples / band["p90_s"], samples / band["p10_s"],
            algorithm.removeprefix("nccl "))  # fmt: skip


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error_pct"]) for r in rows]
    return {
        "rows": len(rows),
        "median_abs_error_pct": statistics.median(errors) if errors else None,
        "worst_abs_error_pct": max(errors) if errors else None,
        "in_band_pct": 100.0 * sum(r["in_band"] for r in rows) / len(rows) if rows else None,
        "systems": sorted({r["node"] for r in rows}),
        "nodes": [min(r["nodes"] for r in rows), max(r["nodes"] for r in rows)] if rows else [],
    }


def score_published(path: str | Path | None = None) -> dict[str, Any]:
    """Every row predicted and scored; summaries per group and the targets' verdict."""
    from pdlsim.costmodel.presets import load_hardware

    where = Path(path) if path else PUBLISHED
    doc = read_json(where, str(where))
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise UserError(f"{where}: expected an object with a 'rows' list")
    hardware = load_hardware().overlaid({"nodes": doc.get("nodes", {})}, str(where))
    rows = []
    for row in doc["rows"]:
        try:
            rows.append(_predicted(row, hardware))
        except (KeyError, TypeError, ValueError) as exc:  # a row not shaped as the others
            name = row.get("id", "?") if isinstance(row, dict) else repr(row)
            raise UserError(f"{where}: row {name}: missing or malformed field {exc}") from None
    summaries = {g: _summary([r for r in rows if r["group"] == g]) for g in GROUPS}
    held = summaries["held-out"]
    met = bool(held["rows"]) and (
        held["median_abs_error_pct"] <= TARGET["median_pct"]
        and held["worst_abs_error_pct"] <= TARGET["worst_pct"]
        and held["rows"] >= TARGET["rows"]
        and len(held["systems"]) >= TARGET["systems"]
        and held["nodes"][1] >= TARGET["max_nodes"]
    )
    return {"source": str(where), "rows": rows, "summary": summaries, "target": TARGET,
            "target_met": met}  # fmt: skip


def format_published(doc: dict[str, Any]) -> str:
    lines = [
        f"published measurements ({doc['source']})",
        f"{'row':<18} {'system':<14} {'nodes':>5} {'GPUs':>5} {'what':<26} {'published':>10} "
        f"{'predicted':>10} {'band':>13} {'error':>7}  {'unit':<9} algorithm  [group]",
    ]
    for r in doc["rows"]:
        band = f"{r['band'][0]:.0f}-{r['band'][1]:.0f}"
        lines.append(
            f"{r['id']:<18} {r['node']:<14} {r['nodes']:>5} {r['gpus']:>5} {r['what']:<26} "
            f"{r['published']:>10.1f} {r['predicted']:>10.1f} {band:>13} "
            f"{r['error_pct']:>+6.1f}%  {r['unit']:<9} {r['algorithm']:<9}  [{r['group']}]"
        )
    for group, s in doc["summary"].items():
        if not s["rows"]:
            continue
        lines.append(
            f"{group}: {s['rows']} rows, median |error| {s['median_abs_error_pct']:.1f}%, worst "
            f"{s['worst_abs_error_pct']:.1f}%, {s['in_band_pct']:.0f}% in band; systems "
            f"{', '.join(s['systems'])}; {s['nodes'][0]}-{s['nodes'][1]} nodes"
        )
    t = doc["target"]
    verdict = "met" if doc["target_met"] else "not met"
    lines.append(
        f"target (held-out): median <= {t['median_pct']:g}%, worst <= {t['worst_pct']:g}%, "
        f">= {t['rows']} rows, >= {t['systems']} systems, up to >= {t['max_nodes']} nodes: "
        f"{verdict}"
    )
    lines.append("sources: each row's 'source' in --json, or the file above")
    return "\n".join(lines)
