"""Timelines as Chrome trace JSON: one track per rank and per link; opens in Perfetto.

The format is the Trace Event Format's JSON object form: complete events (``"ph": "X"``) with
``ts`` and ``dur`` in microseconds, ``pid``/``tid`` naming a track, and metadata events
(``"ph": "M"``) giving processes and threads their names. Ranks live in one process ("ranks"),
links and copy engines in another ("links"), so Perfetto groups them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import atomic_write_text

__all__ = ["Timeline", "TraceEvent", "write_chrome_trace"]

_GROUPS = {"ranks": 1, "links": 2}


@dataclass(frozen=True)
class TraceEvent:
    track: str
    name: str
    start_s: float
    duration_s: float
    category: str = ""
    args: dict[str, Any] | None = None


@dataclass
class Timeline:
    """Events collected during a simulation, with each track's group (ranks or links)."""

    events: list[TraceEvent] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)  # track -> "ranks" | "links"

    def track(self, name: str, group: str) -> str:
        if group not in _GROUPS:
            raise ValueError(f"track group must be one of {', '.join(_GROUPS)}, got {group!r}")
        self.groups.setdefault(name, group)
        return name

    def add(
        self,
        track: str,
        name: str,
        start_s: float,
        end_s: float,
        category: str = "",
        args: dict[str, Any] | None = None,
    ) -> None:
        if end_s > start_s:
            self.events.append(TraceEvent(track, name, start_s, end_s - start_s, category, args))

    def tracks(self) -> list[str]:
        return list(self.groups)

    def to_chrome_trace(self) -> dict[str, Any]:
        tids = {name: i + 1 for i, name in enumerate(self.groups)}
        out: list[dict[str, Any]] = []
        for group, pid in _GROUPS.items():
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": group}})
        for name, tid in tids.items():
            pid = _GROUPS[self.groups[name]]
            out.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            out.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        for event in self.events:
            record: dict[str, Any] = {
                "ph": "X",
                "name": event.name,
                "cat": event.category or "sim",
                "ts": event.start_s * 1e6,
                "dur": event.duration_s * 1e6,
                "pid": _GROUPS[self.groups.get(event.track, "ranks")],
                "tid": tids.get(event.track, 0),
            }
            if event.args:
                record["args"] = event.args
            out.append(record)
        return {"traceEvents": out, "displayTimeUnit": "ms"}


def _non_finite(record: dict[str, Any]) -> str | None:
    """The first of ``record``'s times (or numeric args) that is NaN or infinite, as
    ``field value``; None when all are finite."""
    args = record.get("args") or {}
    fields = {"ts": record.get("ts"), "dur": record.get("dur")}
    fields.update((f"args.{key}", value) for key, value in args.items())
    for field_name, value in fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"{field_name} {value}"
    return None


def write_chrome_trace(
    path: str | os.PathLike[str], timeline: Timeline, source: str | None = None
) -> Path:
    """Write ``timeline`` as Chrome trace JSON, atomically (temporary file + rename).

    JSON has no NaN or infinity (Python would write ``Infinity``, which no trace viewer
    reads): a timeline holding one is refused with a :class:`UserError` starting with
    ``source`` (default: the path), and the file is left as it was.
    """
    target = Path(path)
    doc = timeline.to_chrome_trace()
    try:
        text = json.dumps(doc, allow_nan=False)
    except ValueError:  # found only then, so that a good trace is not walked twice
        named = ((r["name"], _non_finite(r)) for r in doc["traceEvents"])
        name, bad = next(((n, b) for n, b in named if b is not None), (None, None))
        what = f"the event {name!r} has {bad}" if bad else "an event holds NaN or infinity"
        raise UserError(
            f"{source or target}: not written: {what}, and JSON has no NaN or infinity; the "
            "simulated times overflowed, so check the inputs' times and sizes"
        ) from None
    atomic_write_text(target, text)
    return target
