"""The simulator's resources: links that carry collective steps and GPU copy engines (simpy).

Small classes holding ``env``, as SimPy's own examples write them; :mod:`pdlsim.sim.engine`
plays the ranks' processes on them.
"""

from __future__ import annotations

import simpy

from .collectives import TimedStep
from .trace import Timeline

__all__ = ["CopyEngine", "Link"]


class Link:
    """One link (an intra-node link or a NIC): carries one step group at a time, FIFO, so that
    collectives in flight together queue on it."""

    def __init__(self, env: simpy.Environment, name: str, timeline: Timeline | None = None):
        self.env = env
        self.name = name
        self.timeline = timeline
        self.resource = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0
        if timeline is not None:
            timeline.track(name, "links")

    def carry(self, timed: TimedStep, label: str = ""):
        with self.resource.request() as request:
            yield request
            start = self.env.now
            yield self.env.timeout(timed.duration_s)
            self.busy_s += timed.duration_s
            if self.timeline is not None:
                step = timed.step
                name = f"{label} {step.phase}".strip() + (
                    f" x{step.repeat}" if step.repeat > 1 else ""
                )
                args = {"bytes": step.nbytes, "flows": step.flows, "repeat": step.repeat}
                self.timeline.add(self.name, name, start, self.env.now, "link", args)


class CopyEngine:
    """A GPU's host-to-device copy engine: one copy at a time, beside the compute."""

    def __init__(self, env: simpy.Environment, name: str, copy_s: float, timeline=None):
        self.env = env
        self.name = name
        self.copy_s = copy_s
        self.timeline = timeline
        self.resource = simpy.Resource(env, capacity=1)
        if timeline is not None:
            timeline.track(name, "links")

    def copy(self, done: simpy.Event, step: int):
        with self.resource.request() as request:
            yield request
            start = self.env.now
            yield self.env.timeout(self.copy_s)
            if self.timeline is not None:
                self.timeline.add(self.name, f"h2d batch {step}", start, self.env.now, "copy")
        done.succeed()
