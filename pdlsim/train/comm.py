"""The communication a data-parallel trainer needs, for one process or for MPI ranks.

The training loop is the same code in every execution mode; only the communicator differs.
Gradients are reduced with the buffer-based, in-place ``Allreduce`` (no pickling, no copy).
GPU arrays are staged through host memory: the PyPI MPICH is not CUDA-aware.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np


class LocalComm:
    """A single process: every collective is the identity."""

    rank = 0
    size = 1

    def barrier(self) -> None:
        return None

    def allreduce_sum_(self, buf: Any) -> None:
        return None

    def sum_floats(self, values: list[float]) -> list[float]:
        return list(values)

    def ranks_per_node(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def abort(self, status: int) -> None:
        raise SystemExit(status)

    @property
    def mpi_comm(self) -> None:
        return None


class MPIComm:
    """MPI.COMM_WORLD (or another communicator) behind the same small interface."""

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD if comm is None else comm
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        self._host_staging: np.ndarray | None = None

    @property
    def mpi_comm(self) -> Any:
        return self._comm

    def barrier(self) -> None:
        self._comm.Barrier()

    def allreduce_sum_(self, buf: Any) -> None:
        """Sum ``buf`` over all ranks, in place."""
        if isinstance(buf, np.ndarray):
            self._comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
            return
        # A device array: copy to a reused host buffer, reduce there, copy back.
        if self._host_staging is None or self._host_staging.shape != buf.shape:
            self._host_staging = np.empty(buf.shape, dtype=buf.dtype)
        buf.get(out=self._host_staging)
        self._comm.Allreduce(self._mpi.IN_PLACE, self._host_staging, op=self._mpi.SUM)
        buf.set(self._host_staging)

    def sum_floats(self, values: list[float]) -> list[float]:
        data = np.asarray(values, dtype=np.float64)
        self._comm.Allreduce(self._mpi.IN_PLACE, data, op=self._mpi.SUM)
        return data.tolist()

    def ranks_per_node(self) -> int:
        hosts = self._comm.allgather(socket.gethostname())
        return hosts.count(socket.gethostname())

    def local_rank(self) -> int:
        """This rank's index among the ranks on its node (picks its GPU)."""
        node = self._comm.Split_type(self._mpi.COMM_TYPE_SHARED)
        try:
            return node.Get_rank()
        finally:
            node.Free()

    def abort(self, status: int) -> None:
        self._comm.Abort(status)
