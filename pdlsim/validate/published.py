"""``pdlsim validate --published``: pdlsim's GPU cluster model against published measurements.

Each row of ``published.json`` is a measurement someone published (nccl-tests bus bandwidth
of an allreduce on a named system), with its source precise enough to be checked. pdlsim
predicts it from the hardware descriptions alone (:mod:`pdlsim.costmodel.gpu_fabric`); nothing
is fitted to the rows. A row whose figure set one of the model's assumptions (``used_for``) or
that was seen while the model was built (``seen``) is scored apart from the held-out rows, so
that the headline is what the model says of measurements it never met.

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
    from pdlsim.costmodel.gpu_fabric import collective_band, fabric_of

    if row.get("kind") != "allreduce_busbw":
        raise UserError(f"published row {row.get('id')}: unknown kind {row.get('kind')!r}")
    node = hardware.node(row["node"])
    fabric = fabric_of(node, hardware.network(node.network), row["nodes"], row["gpus_per_node"])
    band = collective_band("allreduce", row["size_bytes"], fabric, hardware.assumptions,
                           row.get("algorithm"))  # fmt: skip
    gbps = band.central.busbw_bytes_per_s / 1e9
    low, high = band.slowest.busbw_bytes_per_s / 1e9, band.fastest.busbw_bytes_per_s / 1e9
    published = float(row["published_GBps"])
    return {
        "id": row["id"], "group": _group(row), "node": node.name, "nodes": row["nodes"],
        "gpus": row["nodes"] * row["gpus_per_node"], "size_bytes": row["size_bytes"],
        "published_GBps": published, "predicted_GBps": gbps, "band_GBps": [low, high],
        "in_band": low <= published <= high, "error_pct": 100.0 * (gbps - published) / published,
        "algorithm": band.central.algorithm, "source": row["source"],
    }  # fmt: skip


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
    rows = [_predicted(row, hardware) for row in doc["rows"]]
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
        f"published measurements ({doc['source']}): allreduce bus bandwidth, GB/s",
        f"{'row':<14} {'system':<14} {'nodes':>5} {'GPUs':>5} {'size_B':>11} {'published':>9} "
        f"{'predicted':>9} {'band':>13} {'error':>7}  algorithm  [group]",
    ]
    for r in doc["rows"]:
        band = f"{r['band_GBps'][0]:.0f}-{r['band_GBps'][1]:.0f}"
        lines.append(
            f"{r['id']:<14} {r['node']:<14} {r['nodes']:>5} {r['gpus']:>5} {r['size_bytes']:>11} "
            f"{r['published_GBps']:>9.1f} {r['predicted_GBps']:>9.1f} {band:>13} "
            f"{r['error_pct']:>+6.1f}%  {r['algorithm']:<9}  [{r['group']}]"
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
