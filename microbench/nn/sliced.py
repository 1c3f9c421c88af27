"""Model (tensor) parallelism for real: a network's dense layers split by output neurons.

The P ranks of a communicator hold one model between them and all compute the same mini-batch
(MPI layer-wise parallel execution of a feedforward network). It is what
:mod:`pdlsim.sim.tensor` models, run with the ops and kernels of :mod:`microbench.nn`:

* **Dense layers are split by output neurons.** Rank r holds columns ``[lo, hi)`` of W and b
  (:func:`microbench.workload.split_columns`: the first ``units % P`` ranks one neuron more,
  so the busiest holds ``ceil(units / P)``, as the model assumes) and computes that slice of
  the output: a local GEMM ``x @ W[:, lo:hi]``, then the bias and, when a relu follows, the
  relu on the slice.
* After each dense layer's forward the slices are **all-gathered** (``Allgatherv``, then one
  copy from the rank-major receive buffer into the ``(batch, units)`` activation), so that every
  rank holds the whole activation for the next layer.
* Backward: every rank has the whole output gradient, takes its columns, computes its slice's
  dW and db (they stay local: no gradient allreduce) and the partial input gradient
  ``dY[:, lo:hi] @ W[:, lo:hi].T``; the input gradient is the **sum over ranks**, an in-place
  ``Allreduce`` of ``batch x in_features``. The first layer with parameters computes no input
  gradient, so it has none.
* **Everything else is replicated**: a conv stack, pools, flatten and the softmax cross-entropy
  run whole on every rank on the whole batch (their weight gradients come out the same on every
  rank, since the allreduce gives every rank the same sum, as MPICH does).

Initialisation: each rank builds the serial network's initial parameters
(:func:`microbench.nn.init_params`, same seed) and keeps its slice, so P ranks compute the
serial network's steps up to float32 rounding (the GEMMs block differently).

Where the real run differs from the model: a relu fused after a split dense layer runs on the
slice (1/P of the model's replicated relu), and the gather's copy into the activation is timed
as part of the allgather. The model lets ``ceil(units / P)`` be 1 when P exceeds a layer's
units; the real run refuses it (every rank needs a neuron: :func:`check_splittable`).
GPU arrays go through host memory for both collectives (the PyPI MPICH is not CUDA-aware).

It lives in microbench, beside :class:`microbench.nn.Network`, the network it splits.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from microbench.errors import UserError
from microbench.kernels import kernels_for
from microbench.nn.build import build_ops
from microbench.nn.layers import Buffers, Dense, Op, workspace_bytes
from microbench.nn.network import init_params, prepare_input, runs_channels_last
from microbench.workload import SPLITTABLE_KINDS, Workload, sliced_dense, split_columns

__all__ = ["SlicedNetwork", "check_splittable", "split_columns"]

_MAX_WORKSPACES = 4  # training batch, evaluation chunk and the last of each
_LOGITS_CHUNK = 256


def check_splittable(workload: Workload, procs: int) -> None:
    """UserError unless the workload is a chain of the kinds layer-wise parallelism splits
    (no skips: the split network runs its layers in a row) and every dense layer has at least
    one output neuron per rank."""
    workload.require(SPLITTABLE_KINDS, "--parallel model", "; train it data-parallel")
    if not workload.is_chain:
        info = next(info for info in workload.layers if info.inputs != (info.index - 1,))
        names = [workload.layers[j].name if j >= 0 else "input" for j in info.inputs]
        raise UserError(
            f"--parallel model splits a chain of layers, and workload '{workload.name}' is a "
            f"graph (layer {info.name} reads {' and '.join(names)}); train it data-parallel"
        )
    for info in workload.layers:
        units = info.output_shape[0]
        if info.kind == "dense" and units < procs:
            raise UserError(
                f"--parallel model: dense layer {info.name} of workload '{workload.name}' has "
                f"{units} output neurons, fewer than the {procs} ranks (each needs at least one); "
                f"use --procs {units} or fewer"
            )


class SlicedNetwork:
    """This rank's part of ``workload`` over ``comm`` (module docstring). Same interface as
    :class:`microbench.nn.Network` for training: flat ``params``/``grads`` (this rank's slices
    and the replicated layers, in layer order), ``forward``, ``backward``, ``logits``; the
    seconds spent in collectives accumulate in :attr:`comm_s` (``allgather``, ``allreduce``)."""

    def __init__(
        self,
        workload: Workload,
        comm: Any,
        seed: int = 0,
        init: str = "he",
        xp: ModuleType = np,
        backend: str = "auto",
        synchronize: Callable[[], None] = lambda: None,
    ) -> None:
        check_splittable(workload, comm.size)
        self.workload, self.comm, self.xp, self.sync = workload, comm, xp, synchronize
        self.kernels = kernels_for(xp, backend)
        self._nhwc = runs_channels_last(workload)
        shape = workload.input_shape
        if self._nhwc:
            c, h, w = shape
            shape = (h, w, c)
        full = build_ops(workload.layers[:-1], self.kernels, shape, self._nhwc)
        self._ops: list[Op] = []
        self._columns: list[tuple[int, int, int] | None] = []  # (lo, hi, units) of split layers
        for op in full:
            columns = None
            if isinstance(op, Dense) and comm.size > 1:
                units = op.out_shape[0]
                lo, hi = split_columns(units, comm.size)[comm.rank]
                op = Dense(sliced_dense(op.info, hi - lo), self.kernels, op.in_shape, op.relu)
                columns = (lo, hi, units)
            self._ops.append(op)
            self._columns.append(columns)
        self.params, self.grads = self._bind(init_params(workload, seed, init))
        self.param_count = int(self.params.size)
        self.comm_s = {"allgather": 0.0, "allreduce": 0.0}
        self._workspaces: OrderedDict[tuple[bool, int], list[Buffers]] = OrderedDict()
        self._pending: list[Buffers] | None = None
        self._mpi: Any = None
        if comm.size > 1:
            from mpi4py import MPI

            self._mpi = MPI

    def _bind(self, full: np.ndarray) -> tuple[Any, Any]:
        """This rank's flat parameters, copied from the serial network's ``full`` ones, and
        zero gradients of the same layout; every parametric op bound to views of them."""
        parametric = [
            (op, columns)
            for op, columns in zip(self._ops, self._columns, strict=True)
            if op.weight_shape is not None
        ]
        host = np.empty(sum(op.info.param_count for op, _ in parametric), np.float32)
        src = dst = 0
        for op, columns in parametric:
            n_w, n_b = op.info.weight_count, op.info.bias_count  # this rank's
            if columns is None:
                host[dst : dst + n_w + n_b] = full[src : src + n_w + n_b]
                src += n_w + n_b
            else:
                lo, hi, units = columns
                full_w = op.in_shape[0] * units
                w = full[src : src + full_w].reshape(-1, units)[:, lo:hi]
                host[dst : dst + n_w] = w.reshape(-1)
                host[dst + n_w : dst + n_w + n_b] = full[src + full_w + lo : src + full_w + hi]
                src += full_w + units
            dst += n_w + n_b
        params = self.xp.asarray(host)
        grads = self.xp.zeros_like(params)
        offset = 0
        for op, _ in parametric:
            n_w, end = op.info.weight_count, offset + op.info.param_count
            op.bind(
                params[offset : offset + n_w].reshape(op.weight_shape),
                params[offset + n_w : end],
                grads[offset : offset + n_w].reshape(op.weight_shape),
                grads[offset + n_w : end],
            )
            offset = end
        return params, grads

    def split_layers(self) -> list[dict[str, Any]]:
        """Each split dense layer: name, units, and this rank's columns."""
        return [
            {"layer": op.info.name, "units": c[2], "columns": [c[0], c[1]]}
            for op, c in zip(self._ops, self._columns, strict=True)
            if c is not None
        ]

    # workspaces --------------------------------------------------------------------------

    def _workspace(self, training: bool, batch: int) -> list[Buffers]:
        key = (training, batch)
        space = self._workspaces.get(key)
        if space is not None:
            self._workspaces.move_to_end(key)
            return space
        xp, on_host = self.xp, self.xp is np
        space = [op.allocate(xp, batch, training) for op in self._ops]
        for buf, columns in zip(space, self._columns, strict=True):
            if columns is None:
                continue
            lo, hi, units = columns
            buf["gathered"] = xp.empty((batch, units), np.float32)
            buf["recv"] = np.empty(batch * units, np.float32)
            bounds = split_columns(units, self.comm.size)
            counts = [batch * (b - a) for a, b in bounds]
            displs = np.cumsum([0, *counts[:-1]]).tolist()
            buf["layout"] = (counts, displs)
            buf["dy"] = xp.empty((batch, hi - lo), np.float32) if training else None
            if not on_host:  # staging for device arrays
                buf["send"] = np.empty((batch, hi - lo), np.float32)
                buf["gathered_host"] = np.empty((batch, units), np.float32)
            # each rank's block of the receive buffer and its columns of the activation, as
            # views made once: the gather's assembly is then one copy per rank and nothing else
            full = buf["gathered"] if on_host else buf["gathered_host"]
            buf["pieces"] = [
                (full[:, a:b], buf["recv"][start : start + n].reshape(batch, b - a))
                for (a, b), n, start in zip(bounds, counts, displs, strict=True)
            ]
        last: Buffers = {"dlogits": xp.empty((batch, self.workload.num_classes), np.float32)}
        if self._nhwc:
            c, h, w = self.workload.input_shape
            last["input"] = xp.empty((batch, h, w, c), np.float32)
        space.append(last)
        self._workspaces[key] = space
        while len(self._workspaces) > _MAX_WORKSPACES:
            self._workspaces.popitem(last=False)
        return space

    def workspace_bytes(self, batch: int, training: bool = True) -> int:
        """Bytes of the buffers a step at ``batch`` uses (training: with backward's), each
        array once, host staging and receive buffers included."""
        return workspace_bytes(self._workspace(training, batch))

    # collectives -------------------------------------------------------------------------

    def _allgather(self, part: Any, buf: Buffers) -> Any:
        """The whole ``(batch, units)`` activation from every rank's ``(batch, slice)``."""
        self.sync()
        t0 = time.perf_counter()
        counts, displs = buf["layout"]
        on_host = isinstance(part, np.ndarray)
        send = part if on_host else part.get(out=buf["send"])
        recv = buf["recv"]
        self.comm.mpi_comm.Allgatherv(send, [recv, counts, displs, self._mpi.FLOAT])
        for columns, block in buf["pieces"]:
            np.copyto(columns, block)
        if not on_host:
            buf["gathered"].set(buf["gathered_host"])
        self.comm_s["allgather"] += time.perf_counter() - t0
        return buf["gathered"]

    def _allreduce(self, partial: Any) -> None:
        self.sync()
        t0 = time.perf_counter()
        self.comm.allreduce_sum_(partial)
        self.comm_s["allreduce"] += time.perf_counter() - t0

    # forward, backward, inference --------------------------------------------------------

    def _run(self, x: Any, space: list[Buffers]) -> Any:
        x = prepare_input(x, space, self.workload, self.xp, self.kernels, self._nhwc)
        for op, buf, columns in zip(self._ops, space, self._columns, strict=False):
            x = op.forward(x, buf)
            if columns is not None:
                x = self._allgather(x, buf)
        return x

    def forward(self, x: Any, y: Any, training: bool = True) -> tuple[float, int]:
        """Mean softmax cross-entropy over the (whole, shared) batch and the correct argmax
        predictions, the same on every rank; with ``training``, keeps what backward needs."""
        batch = x.shape[0]
        labels = self.xp.asarray(y).astype(self.xp.int64, copy=False)
        if labels.shape != (batch,):
            raise ValueError(f"{batch} samples but labels of shape {labels.shape}")
        space = self._workspace(training, batch)
        logits = self._run(x, space)
        loss, correct = self.kernels.softmax_cross_entropy(logits, labels, space[-1]["dlogits"])
        self._pending = space if training else None
        return loss, correct

    def backward(self) -> None:
        """This rank's gradients (its slices, the replicated layers whole) into ``grads``."""
        if self._pending is None:
            raise RuntimeError("backward() needs a training forward() first")
        space, self._pending = self._pending, None
        grad = space[-1]["dlogits"]
        for op, buf, columns in zip(
            reversed(self._ops), reversed(space[:-1]), reversed(self._columns), strict=True
        ):
            if columns is not None:
                lo, hi, _ = columns
                buf["dy"][...] = grad[:, lo:hi]
                grad = op.backward(buf["dy"], buf)
                if grad is not None:
                    self._allreduce(grad)
            else:
                grad = op.backward(grad, buf)
            if grad is None:
                break

    def logits(self, x: Any) -> Any:
        """The logits of ``x`` (every rank calls this with the same ``x``), in chunks."""
        out = self.xp.empty((x.shape[0], self.workload.num_classes), dtype=self.xp.float32)
        for begin in range(0, x.shape[0], _LOGITS_CHUNK):
            chunk = x[begin : begin + _LOGITS_CHUNK]
            space = self._workspace(False, chunk.shape[0])
            out[begin : begin + chunk.shape[0]] = self._run(chunk, space)
        return out
