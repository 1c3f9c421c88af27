"""The short table ``pdlsim bench`` ends with, read back from the run's records.

Per collective and process count: latency at the smallest size and bandwidth at the largest;
the GEMM and triad references; per process count, the step jitter. Each part is the
microbenchmark's own summary, so the figures are the ones its log shows.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from microbench import collectives, compute, jitter
from microbench.records import read_records


def _records(run_dir: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(run_dir.rglob("*.jsonl")):
        found.extend(read_records(path)[1])
    return found


def _measurements(records: list[dict[str, Any]], benchmark: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "measurement" and r["benchmark"] == benchmark]


def jitter_summaries(records: list[dict[str, Any]]) -> list[str]:
    """One jitter table per (model, batch, threads, ranks), from the per-rank records. The
    moments the bench timed it at (``params.moment``) are pooled, each rank's samples one
    after the other, and each moment's own expected wait follows on a line."""
    groups: dict[tuple, dict[str, dict[int, list[float]]]] = defaultdict(dict)
    for record in _measurements(records, jitter.BENCHMARK):
        p = record["params"]
        if p.get("statistic") == "per_rank":
            key = (p["model"], p["batch"], p["threads"], p["ranks"])
            moment = groups[key].setdefault(str(p.get("moment") or ""), {})
            moment[int(p["rank"])] = list(record["samples"])
    tables = []
    for (model, batch, threads, _), moments in sorted(groups.items()):
        tables_by_moment = {m: np.array([r[k] for k in sorted(r)]) for m, r in moments.items()}
        table = np.concatenate(list(tables_by_moment.values()), axis=1)
        text = jitter.format_summary(
            jitter.JitterSummary.from_samples(table), model, batch, threads
        )
        if len(tables_by_moment) > 1:
            waits = (
                f"{m}: {jitter.JitterSummary.from_samples(t).expected_wait_rel:.1%}"
                for m, t in sorted(tables_by_moment.items())
            )
            text += "\nexpected wait at each moment (of its median): " + ", ".join(waits)
        tables.append(text)
    return tables


def format_bench_summary(run_dir: Path) -> str:
    records = _records(run_dir)
    parts = []
    coll = collectives.summarize(_measurements(records, "collectives"))
    if coll:
        parts.append(collectives.format_summary(coll))
    compute_table = compute.format_summary(records)
    if compute_table:
        parts.append(compute_table)
    parts.extend(jitter_summaries(records))
    return "\n\n".join(parts) if parts else "no measurements were recorded"
