"""Mini-batches from the host data set to the device: the ``data`` and ``h2d`` phases of a step.

:class:`BatchFeed` gathers a step's samples on the host (``data``) and makes them the arrays
the network reads (``h2d``): on the CPU the gathered arrays themselves; on a GPU a copy, from the
gathered (pageable) arrays or through page-locked staging (``pinned``).

With ``prefetch`` (GPU, pinned) the copy of the next step's batch runs on a copy stream behind
this step's compute, as the simulator's prefetch does (:mod:`pdlsim.sim.engine`: the copy of
step i + 1 is issued when step i's forward starts, and step i + 1 waits only for what is left
of it). This step's ``data`` phase then gathers the *next* step's samples (straight into
page-locked memory: the same host work per step, shifted by one), and its ``h2d`` phase waits
for this step's copy and issues the next one. Two staging and two device buffers take turns, so
a copy never writes what a forward reads nor reads what a gather writes. The first step of an
epoch has no step before it to copy behind (the next epoch's order is drawn when it starts), so
it copies in its own ``h2d`` phase.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdlsim.train.data import Dataset
from pdlsim.train.device import Device, pinned_empty

__all__ = ["BatchFeed", "step_indices"]


class BatchFeed:
    """One rank's mini-batches of ``batch`` samples of ``data`` on ``device``: call
    :meth:`gather` in the data phase, then :meth:`to_device` in the h2d phase."""

    def __init__(
        self, data: Dataset, batch: int, device: Device, pinned: bool, prefetch: bool = False
    ) -> None:
        if prefetch and not (device.kind == "gpu" and pinned):
            raise ValueError("prefetch copies from page-locked memory to a GPU: needs both")
        self.data, self.device, self.batch, self.prefetch = data, device, batch, prefetch
        x_shape, y_shape = (batch, *data.x.shape[1:]), (batch, *data.y.shape[1:])
        gpu = device.kind == "gpu"
        if prefetch:  # two slots: page-locked host buffers and their device copies
            xp = device.xp
            self.x_host = [pinned_empty(x_shape, np.float32) for _ in range(2)]
            self.y_host = [pinned_empty(y_shape, data.y.dtype) for _ in range(2)]
            self._x_dev = [xp.empty(x_shape, dtype=np.float32) for _ in range(2)]
            self._y_dev = [xp.empty(y_shape, dtype=data.y.dtype) for _ in range(2)]
            self._stream = xp.cuda.Stream(non_blocking=True)
        else:
            self.x_host = [np.empty(x_shape, dtype=np.float32)]
            self.y_host = [np.empty(y_shape, dtype=data.y.dtype)]
        staged = gpu and pinned and not prefetch  # pageable gather, then page-locked staging
        self.staging = pinned_empty(x_shape, np.float32) if staged else None
        self._slot = 0  # where this step's batch is (prefetch: the other slot takes the next)
        self._in_flight: np.ndarray | None = None  # the samples whose copy the stream runs
        self._hit = False  # this step's batch is the one in flight
        self._next: np.ndarray | None = None  # the samples gathered for the next step

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the host batches, the staging and, on a GPU, the batches' device copies."""
        host = sum(a.nbytes for a in (*self.x_host, *self.y_host))
        staging = 0 if self.staging is None else self.staging.nbytes
        device = host if self.device.kind == "gpu" else 0
        return int(host + staging + device)

    def gather(self, index: np.ndarray, next_index: np.ndarray | None = None) -> None:
        """The data phase: this step's samples ``index`` on the host, unless their copy is
        already in flight; with prefetch also the next step's ``next_index`` (None: no next
        step to prefetch, e.g. at the end of an epoch)."""
        slot = self._slot
        self._hit = self._in_flight is not None and np.array_equal(self._in_flight, index)
        if self._in_flight is not None and not self._hit:
            self._stream.synchronize()  # a copy nobody will read: let it finish before reuse
            self._in_flight = None
        if not self._hit:
            np.take(self.data.x, index, axis=0, out=self.x_host[slot])
            np.take(self.data.y, index, axis=0, out=self.y_host[slot])
        self._next = None
        if self.prefetch and next_index is not None:
            np.take(self.data.x, next_index, axis=0, out=self.x_host[1 - slot])
            np.take(self.data.y, next_index, axis=0, out=self.y_host[1 - slot])
            self._next = next_index

    def to_device(self) -> tuple[Any, Any]:
        """The h2d phase: this step's (inputs, labels) where the network reads them. With
        prefetch, after waiting for this step's copy, the next step's copy is issued."""
        if not self.prefetch:
            x = self.device.to_device(self.x_host[0], self.staging)
            return x, self.device.to_device(self.y_host[0])
        slot = self._slot
        x, y = self._x_dev[slot], self._y_dev[slot]
        if self._hit:
            self._stream.synchronize()
        else:
            x.set(self.x_host[slot])
            y.set(self.y_host[slot])
        self._in_flight = None
        if self._next is not None:
            other = 1 - slot
            self._x_dev[other].set(self.x_host[other], stream=self._stream)
            self._y_dev[other].set(self.y_host[other], stream=self._stream)
            self._in_flight, self._slot = self._next, other
        return x, y


def step_indices(
    permutation: np.ndarray, step: int, steps: int, stride: int, offset: int, batch: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """A rank's samples at ``step`` of an epoch of ``steps`` and at the next step (None after
    the last): ``batch`` samples from ``step * stride + offset`` of the epoch's ``permutation``
    (data parallel: stride P x B, offset rank x B; model parallel: stride B, offset 0)."""

    def at(k: int) -> np.ndarray:
        start = k * stride + offset
        return permutation[start : start + batch]

    return at(step), (at(step + 1) if step + 1 < steps else None)
