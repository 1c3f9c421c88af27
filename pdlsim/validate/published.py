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

import math
import statistics
from pathlib import Path
from typing import Any

from microbench.errors import UserError, shown_names, shown_text, unprintable
from microbench.fileio import read_json
from pdlsim.prediction.checks import MAX_NODES

__all__ = ["PUBLISHED", "format_published", "score_published"]

PUBLISHED = Path(__file__).with_name("published.json")
GROUPS = ("held-out", "set an assumption", "seen while building")
TARGET = {"median_pct": 10.0, "worst_pct": 25.0, "rows": 20, "systems": 3, "max_nodes": 32}
# A figure (GB/s of bus bandwidth, samples per second) from a thousandth to a billion: past
# either end it is a typo or another unit, and its error against a prediction no finite number.
FIGURE_RANGE = (1e-3, 1e9)
TOP_KEYS = ("about", "nodes", "rows")


def _whole(least: int, most: int | None = None) -> Any:
    """A field's check: an integer (not a bool) of at least ``least`` (and at most ``most``)."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {value!r}"
        if value < least:
            return f"must be at least {least}, got {value}"
        return None if most is None or value <= most else f"must be at most {most:,}, got {value:,}"

    return check


def _figure(value: Any) -> str | None:
    """A measured figure: a finite number in :data:`FIGURE_RANGE` (a rate: an error against 0
    or a negative one is no score, and one of 1e308 overflows to an infinite error)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {value!r}"
    if not (math.isfinite(value) and value > 0):
        return f"must be above 0, got {value!r}"
    low, high = FIGURE_RANGE
    return None if low <= value <= high else f"must be {low:g} to {high:g}, got {value!r}"


def _text(value: Any) -> str | None:
    """A name or a note: text with something in it (an id, a preset, a model), and printable:
    a newline or a terminal escape would break the table's lines."""
    if not (isinstance(value, str) and value.strip()):
        return f"must be text, got {value!r}"
    problem = unprintable(value)
    return None if problem is None else f"must be printable text: {problem}"


def _kind_of(want: type | tuple[type, ...], what: str) -> Any:
    """A field's check: a value of type ``want``, described as ``what`` when it is not."""
    return lambda value: None if isinstance(value, want) else f"must be {what}, got {value!r}"


# Every field a row may have, its check, and the kinds that require it ("" for none: optional).
_COMMON = {
    "id": (_text, "all"), "kind": (_text, "all"), "node": (_text, "all"),
    "nodes": (_whole(1, MAX_NODES), "all"), "gpus_per_node": (_whole(1), "all"),
    "published": (_figure, "all"), "source": (_kind_of(dict, "an object"), "all"),
    "used_for": (_kind_of(list, "a list of names"), ""),
    "seen": (_kind_of((str, bool), "text or true/false"), ""),
    "note": (_text, ""), "label": (_text, ""),
}  # fmt: skip
_FIELDS = {
    "allreduce_busbw": {**_COMMON, "size_bytes": (_whole(1), "all"), "algorithm": (_text, "")},
    "training_throughput": {
        **_COMMON, "model": (_text, "all"), "batch": (_whole(1), "all"),
        "precision": (_text, "all"), "optimizer": (_text, "all"),
        "single_gpu_samples_per_s": (_figure, "all"), "grad_accum": (_whole(1), ""),
        "single_gpu_grad_accum": (_whole(1), ""), "tokens": (_whole(1), ""), "gpu": (_text, ""),
    },
}  # fmt: skip


def _check_row(row: Any, where: Path, ids: set[str], number: int) -> None:
    """A row shaped as the table's rows are, every field known and of its kind, figures finite
    and above 0, its ``id`` not used before: a bad one is one line naming the row and the field,
    before any row is predicted (a zero figure was a ZeroDivisionError, a negative one an error
    of thousands of percent, a mistyped field silently ignored). ``number`` counts from 1."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: row #{number} is {type(row).__name__}, not an object; give "
                        "each row as {...}")  # fmt: skip
    name = row.get("id") if isinstance(row.get("id"), str) else "?"
    kind = row.get("kind")
    if kind not in _FIELDS:
        raise UserError(f"{where}: row {name}: unknown kind {kind!r}; known: "
                        f"{', '.join(_FIELDS)}")  # fmt: skip
    fields = _FIELDS[kind]
    unknown = sorted(set(row) - set(fields))
    if unknown:
        raise UserError(f"{where}: row {name}: unknown field(s) {', '.join(unknown)} for kind "
                        f"{kind}; known: {', '.join(fields)}")  # fmt: skip
    for field, (check, needed) in fields.items():
        if field not in row:
            if needed:
                raise UserError(f"{where}: row {name}: missing field '{field}'; give it as the "
                                f"table's other {kind} rows do")  # fmt: skip
            continue
        problem = check(row[field])
        if problem:
            raise UserError(f"{where}: row {name}: missing or malformed field '{field}': it "
                            f"{problem}")  # fmt: skip
    if row["id"] in ids:
        raise UserError(f"{where}: row {name}: the id is used twice; give each row its own")
    ids.add(row["id"])


def _group(row: dict[str, Any]) -> str:
    if row.get("used_for"):
        return "set an assumption"
    return "seen while building" if row.get("seen") else "held-out"


def _predicted(row: dict[str, Any], hardware: Any) -> dict[str, Any]:
    kinds = {"allreduce_busbw": _busbw, "training_throughput": _throughput}  # _check_row's
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
    try:
        band = collective_band("allreduce", row["size_bytes"], fabric, hardware.assumptions,
                               row.get("algorithm"))  # fmt: skip
    except ValueError as exc:  # an algorithm none of NCCL's, or one the fabric cannot run
        raise UserError(f"algorithm: {exc}") from None
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
        raise UserError(f"a training row takes a packaged node, not {row['node']!r}; give one "
                        f"of {', '.join(NODE_PRESETS)}")  # fmt: skip
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
    unknown = set(doc) - set(TOP_KEYS)
    if unknown:  # a misspelt "nodes" would leave the rows' nodes unknown, and say so later
        raise UserError(f"{where}: unknown key(s) {shown_names(unknown)}; allowed: "
                        f"{', '.join(TOP_KEYS)}")  # fmt: skip
    packaged = load_hardware()
    nodes = doc.get("nodes", {})
    shadowed = sorted(set(nodes) & set(packaged.nodes)) if isinstance(nodes, dict) else []
    if shadowed:  # the allreduce rows would take the table's, the training rows the preset
        raise UserError(f"{where}: nodes.{shown_text(shadowed[0])} is a packaged node preset; "
                        "give the table's node another name")  # fmt: skip
    hardware = packaged.overlaid({"nodes": nodes}, str(where))
    ids: set[str] = set()
    for number, row in enumerate(doc["rows"], 1):
        _check_row(row, where, ids, number)
    if not doc["rows"]:
        raise UserError(f"{where}: the 'rows' list is empty; give at least one row")
    rows = []
    for row in doc["rows"]:
        try:
            rows.append(_predicted(row, hardware))
        except UserError as exc:  # a setting the model refuses: an unknown preset, a layout
            raise UserError(f"{where}: row {row['id']}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:  # shaped right, yet not usable
            raise UserError(f"{where}: row {row['id']}: malformed field {exc}") from None
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
