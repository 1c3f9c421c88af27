"""The real network's ops, one at a time, on the buffers a training step uses.

A training step (``pdlsim train``) is ``Network.forward`` (each op's forward, then the loss),
``Network.backward`` (each op's backward, last op first, down to the first parametric layer)
and ``SGD.step``. :func:`network_points` builds the same :class:`~microbench.nn.Network` and
optimizer, runs one whole step untimed (numba compiles every kernel variant the thread count
uses here, never in a sample), then hands out one :class:`Point` per op and phase that repeats
exactly that call (``op.forward(x, buf)``, ``op.backward(dy, buf)``) on the inputs the step
produced, plus the loss, the update, the whole step and the forward-only step. Repeating a
call is harmless: forwards and backwards overwrite their outputs (in-place relus and masks are
idempotent), the update's parameter drift is undone after it is measured.

An op repeated alone finds its weights and buffers in cache, which inside a step the other ops
have evicted, so the per-op medians add up to less than the measured step (about 0.8x for the
MLP and the CNN at small batches on a 2-core machine with 2 MiB of L2 per core). The "step"
point is there so that calibration can see and correct that gap.

Figures stored with each point (per op: the workload's layers the op runs, a dense or conv2d
with the relu and max-pool fused into it):

* ``flops``: the workload's FLOPs of those layers for that phase, times the batch. The loss is
  its forward and backward (one kernel computes both); the update is 2 FLOPs per parameter
  (4 with momentum); the step is everything the step computes.
* ``bytes``: an estimate of the compulsory memory traffic, as if each layer of the op ran alone
  and touched every operand once: forward reads the input activations and the parameters and
  writes the output activations; backward reads the output gradient and the input (or, for
  relu and max-pool, the kept output or arg-max) and writes the parameter gradients, plus the
  input gradient and a read of the weights where the layer needs an input gradient. Flatten is
  a view (0 bytes). The im2col matrix, fusion savings and cache reuse are not counted: the
  figure orders ops by memory intensity, it does not predict traffic. The loss reads the
  logits and labels and writes their gradient; the update reads parameters and gradients
  (and the velocity) and writes parameters (and velocity).
* The first op's forward also transposes the input to channels-last when the network runs
  so (the step does it before the first op): its time is in that op's forward, and the
  transpose's bytes (input read and written) are in its ``bytes``.

On the host, each point set also holds the **mini-batch gather** (op and phase "data", kind
"gather"): what ``pdlsim train`` does before every step, ``np.take`` of ``batch`` rows of the
inputs and labels into reused buffers, walking a random permutation of a
:data:`DATASET_SAMPLES`-sample set so that consecutive repetitions take different rows, as
consecutive steps do. Its ``bytes`` are the rows read and written. The host's whole step (op
:data:`STEP_WITH_GATHER`) is the step as a training loop runs it, gather first: the gather's
traffic evicts part of what the previous step left in cache, which costs the step itself
several percent at small batches (evidence: docs/evidence.md, "Jitter"). The forward-only
step (op :data:`INFERENCE_WITH_GATHER`, phase "inference": the gather, the forward and the
loss, what ``pdlsim train --inference`` runs) is timed the same way. The simulator does not
scale forward passes to this row alone (a single moment's figure, and on a machine whose speed
moves, one timed on the other level puts a forward pass far off): its median over the
step's is one moment of the forward-only share (:meth:`calibration.drift.DriftModel
.forward_fraction`), which the speed checks also time, side by side with the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from microbench.nn import SGD, Network, random_batch
from microbench.op_records import (
    INFERENCE_WITH_GATHER,
    LABEL_BYTES,
    STEP_WITH_GATHER,
    layer_bytes,
    update_cost,
)
from microbench.sampling import Point
from microbench.workload import BYTES_PER_VALUE, LayerInfo, Workload

__all__ = [
    "DATASET_SAMPLES",
    "OpGroup",
    "gather_point_fn",
    "network_points",
    "op_groups",
]

DATASET_SAMPLES = 8192  # the gather's data set: pdlsim train's default synthetic size


@dataclass(frozen=True)
class OpGroup:
    """The workload layers one op of the network runs, lead layer first."""

    layers: tuple[LayerInfo, ...]

    @property
    def name(self) -> str:
        return "+".join(info.name for info in self.layers)

    @property
    def kind(self) -> str:
        return self.layers[0].kind

    def cost(self, phase: str, batch: int) -> tuple[int, int]:
        """``(flops, bytes)`` of this op's ``phase`` ("forward" or "backward") at ``batch``."""
        per_sample = (
            "forward_flops_per_sample" if phase == "forward" else "backward_flops_per_sample"
        )
        flops = sum(getattr(info, per_sample) for info in self.layers) * batch
        return flops, sum(layer_bytes(info, phase, batch) for info in self.layers)


def op_groups(workload: Workload, ops: tuple[Any, ...]) -> list[OpGroup]:
    """The layers of each op: from its lead layer up to the next op's (the loss excluded)."""
    starts = [op.info.index for op in ops] + [len(workload.layers) - 1]
    return [OpGroup(tuple(workload.layers[a:b])) for a, b in zip(starts, starts[1:], strict=False)]


def network_points(
    net: Network,
    opt: SGD,
    batch: int,
    base_params: dict[str, Any],
    synchronize: Callable[[], None],
    seed: int = 0,
) -> list[Point]:
    """Points for every op's forward and backward, the loss, the update and the step of
    ``net`` at ``batch``, in the order a step runs them (see the module docstring).

    ``base_params`` go into every point's params (model, threads, device...). ``synchronize``
    waits for the device (a no-op on the CPU). Runs one step untimed first.
    """
    workload, xp = net.workload, net.xp
    rng = np.random.default_rng(seed)
    x, y = (xp.asarray(a) for a in random_batch(workload, batch, rng))
    labels = y.astype(xp.int64, copy=False)
    saved = net.params.copy()

    def restore() -> None:
        net.params[...] = saved
        synchronize()

    # One whole step, untimed: allocates the workspace, compiles every kernel variant.
    net.forward(x, y)
    net.backward()
    opt.step(net.params, net.grads)
    restore()

    ops, space = net.ops, net.workspace(batch)
    groups = op_groups(workload, ops)
    loss_info = workload.layers[-1]
    transposes = space[-1].get("input") is not None

    def point(
        group_name: str,
        layers: list[str],
        kind: str,
        phase: str,
        cost: tuple[int, int],
        fn: Callable[[], object],
        cleanup: Callable[[], None] | None = None,
    ) -> Point:
        flops, nbytes = cost
        params = {
            **base_params,
            "op": group_name,
            "layers": layers,
            "kind": kind,
            "phase": phase,
            "batch": batch,
            "flops": int(flops),
            "bytes": int(nbytes),
        }
        return Point("op", params, fn, cleanup)

    # Each op's input and incoming gradient as the step hands them over (graph-aware).
    inputs, logits, dlogits, handed = net.step_arguments(x, y)
    synchronize()

    points = []
    for i, (op, buf, group) in enumerate(zip(ops, space, groups, strict=False)):
        names = [info.name for info in group.layers]
        flops, nbytes = group.cost("forward", batch)
        fn: Callable[[], object] = partial(op.forward, inputs[i], buf)
        if i == 0:  # what the step runs before the first op belongs to its forward
            fn = partial(_first_forward, net, op, x, space)
            nbytes += 2 * x.size * BYTES_PER_VALUE if transposes else 0
        points.append(point(group.name, names, group.kind, "forward", (flops, nbytes), fn))

    rows = batch * int(np.prod(loss_info.input_shape[:-1]))  # a row per token, if so
    loss_cost = (
        (loss_info.forward_flops_per_sample + loss_info.backward_flops_per_sample) * batch,
        2 * rows * workload.num_classes * BYTES_PER_VALUE + rows * LABEL_BYTES,
    )
    loss_fn = partial(net.loss, logits, labels, dlogits)
    points.append(
        point(loss_info.name, [loss_info.name], loss_info.kind, "loss", loss_cost, loss_fn)
    )

    backward_flops = backward_bytes = 0
    for i, dy in handed:
        op, buf, group = ops[i], space[i], groups[i]
        cost = group.cost("backward", batch)
        backward_flops, backward_bytes = backward_flops + cost[0], backward_bytes + cost[1]
        names = [info.name for info in group.layers]
        points.append(
            point(group.name, names, group.kind, "backward", cost, partial(op.backward, dy, buf))
        )

    parametric = [info.name for info in workload.parametric_layers]
    update = update_cost(net.param_count, opt.momentum)
    update_fn = partial(opt.step, net.params, net.grads)
    points.append(point("update", parametric, "sgd", "update", update, update_fn, restore))

    on_host = xp is np
    gather = gather_point_fn(workload.input_shape, batch, seed) if on_host else None

    def step() -> None:
        if gather is not None:
            gather()
        net.forward(x, y)
        net.backward()
        opt.step(net.params, net.grads)

    forward = [p.params for p in points if p.params["phase"] == "forward"]
    step_cost = (
        sum(p["flops"] for p in forward) + loss_cost[0] + backward_flops + update[0],
        sum(p["bytes"] for p in forward) + loss_cost[1] + backward_bytes + update[1],
    )
    everything = [info.name for info in workload.layers]
    name = STEP_WITH_GATHER if on_host else "step"
    points.append(point(name, everything, "step", "step", step_cost, step, restore))

    def inference() -> None:
        if gather is not None:
            gather()
        net.forward(x, y)

    forward_cost = (
        sum(p["flops"] for p in forward) + loss_cost[0],
        sum(p["bytes"] for p in forward) + loss_cost[1],
    )
    name = INFERENCE_WITH_GATHER if on_host else "inference"
    points.append(point(name, everything, "step", "inference", forward_cost, inference))
    if gather is not None:
        row_bytes = BYTES_PER_VALUE * int(np.prod(workload.input_shape)) + LABEL_BYTES
        points.append(point("data", [], "gather", "data", (0, 2 * batch * row_bytes), gather))
    return points


def gather_point_fn(input_shape: tuple[int, ...], batch: int, seed: int = 0) -> Callable[[], None]:
    """One call gathers the next ``batch`` rows of a random permutation of a
    :data:`DATASET_SAMPLES`-sample float32 set (and its int64 labels) into reused buffers, as
    the training loop's loader does; the permutation wraps around."""
    samples = max(DATASET_SAMPLES, batch)
    data_x = np.full((samples, *input_shape), 0.5, dtype=np.float32)  # touched: no lazy pages
    data_y = np.zeros(samples, dtype=np.int64)
    x_buf = np.empty((batch, *input_shape), dtype=np.float32)
    y_buf = np.empty(batch, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(samples)
    cursor = [0]

    def gather() -> None:
        start = cursor[0]
        if start + batch > samples:
            start = 0
        index = order[start : start + batch]
        cursor[0] = start + batch
        np.take(data_x, index, axis=0, out=x_buf)
        np.take(data_y, index, axis=0, out=y_buf)

    return gather


def _first_forward(net: Network, op: Any, x: Any, space: list[dict[str, Any]]) -> Any:
    return op.forward(net.first_op_input(x, space), space[0])
