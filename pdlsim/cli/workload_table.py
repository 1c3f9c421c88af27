"""``pdlsim workload show`` and ``list``: a workload's per-layer table, as rows (for JSON) and
as aligned text, and the workloads known by name."""

from __future__ import annotations

import json
from typing import Any

from microbench.workload import NETWORK_INPUT, PRESETS, Workload, load_workload, preset_names


def workload_table(workload: Workload) -> list[dict[str, Any]]:
    """One row per layer plus a total row; figures are per sample unless named otherwise."""
    rows = [
        {
            "index": info.index,
            "name": info.name,
            "kind": info.kind,
            "inputs": [NETWORK_INPUT if i < 0 else workload.layers[i].name for i in info.inputs],
            "output_shape": list(info.output_shape),
            "params": info.param_count,
            "forward_flops_per_sample": info.forward_flops_per_sample,
            "backward_flops_per_sample": info.backward_flops_per_sample,
            "activation_bytes_per_sample": info.activation_bytes_per_sample,
            "gradient_bytes": info.gradient_bytes,
        }
        for info in workload.layers
    ]
    rows.append(
        {
            "index": None,
            "name": "total",
            "kind": "",
            "inputs": None,
            "output_shape": None,
            "params": workload.param_count,
            "forward_flops_per_sample": workload.forward_flops_per_sample,
            "backward_flops_per_sample": workload.backward_flops_per_sample,
            "activation_bytes_per_sample": workload.activation_bytes_per_sample,
            "gradient_bytes": workload.gradient_bytes,
        }
    )
    return rows


_COLUMNS = (
    ("#", "index"),
    ("layer", "name"),
    ("kind", "kind"),
    ("reads", "inputs"),
    ("output", "output_shape"),
    ("params", "params"),
    ("fwd FLOP/sample", "forward_flops_per_sample"),
    ("bwd FLOP/sample", "backward_flops_per_sample"),
    ("act B/sample", "activation_bytes_per_sample"),
    ("grad B", "gradient_bytes"),
)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return (
            ",".join(value) if all(isinstance(v, str) for v in value) else "x".join(map(str, value))
        )
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict[str, Any]], reads: bool = False) -> str:
    """Aligned text: text columns to the left, numbers to the right; with ``reads``, the
    layers each reads (a graph's)."""
    columns = [c for c in _COLUMNS if reads or c[1] != "inputs"]
    cells = [[_cell(row[key]) for _, key in columns] for row in rows]
    headers = [title for title, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    left = {"layer", "kind", "reads", "output"}

    def line(values: list[str]) -> str:
        return "  ".join(
            v.ljust(w) if h in left else v.rjust(w)
            for v, w, h in zip(values, widths, headers, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def show_workload(spec: str, as_json: bool, tokens: int | None = None) -> str:
    """``workload show``: a header line and the per-layer table (or both as JSON), at
    ``tokens`` tokens per sample if given (:meth:`Workload.with_tokens`)."""
    workload = Workload.load(spec, tokens)
    table = workload_table(workload)
    if as_json:
        return json.dumps({"workload": workload.to_dict(), "layers": table}, indent=2)
    header = (
        f"workload {workload.name}: input {list(workload.input_shape)}, "
        f"{workload.num_classes} classes, {workload.param_count:,} parameters, "
        f"{workload.gradient_bytes:,} gradient bytes to allreduce per step"
    )
    return header + "\n" + format_table(table, reads=not workload.is_chain)


def list_workloads(as_json: bool) -> str:
    """``workload list``: every workload known by name, with its size and where it comes from."""
    rows = []
    for name in preset_names():
        w = load_workload(name)
        about = "a preset pdlsim trains" if name in PRESETS else w.description
        rows.append({"name": name, "input_shape": list(w.input_shape), "params": w.param_count,
                     "forward_flops_per_sample": w.forward_flops_per_sample,
                     "layers": len(w.layers), "about": about})  # fmt: skip
    if as_json:
        return json.dumps(rows, indent=2)
    width = max(len(r["name"]) for r in rows)
    lines = [f"{'name':{width}}  {'params':>13}  {'fwd GFLOP/sample':>16}  input          about"]
    for r in rows:
        shape = "x".join(map(str, r["input_shape"]))
        gflop = r["forward_flops_per_sample"] / 1e9
        lines.append(
            f"{r['name']:{width}}  {r['params']:>13,}  {gflop:>16.3f}  {shape:13}  {r['about']}"
        )
    return "\n".join(lines)
