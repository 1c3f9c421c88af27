"""The per-layer table of a workload, as rows (for JSON) and as aligned text."""

from __future__ import annotations

from typing import Any

from microbench.workload import Workload


def workload_table(workload: Workload) -> list[dict[str, Any]]:
    """One row per layer plus a total row; figures are per sample unless named otherwise."""
    rows = [
        {
            "index": info.index,
            "name": info.name,
            "kind": info.kind,
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
        return "x".join(str(v) for v in value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Aligned text: text columns to the left, numbers to the right."""
    cells = [[_cell(row[key]) for _, key in _COLUMNS] for row in rows]
    headers = [title for title, _ in _COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    left = {"layer", "kind", "output"}

    def line(values: list[str]) -> str:
        return "  ".join(
            v.ljust(w) if h in left else v.rjust(w)
            for v, w, h in zip(values, widths, headers, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])
