"""What the op records of :mod:`microbench.network_ops` are called and the figures stored with
them that need no network: the op names of whole steps that start with the mini-batch gather,
the label bytes, and the compulsory-traffic estimate of a layer and of the update.

A module of its own, free of the network and its numba kernels, so that the models that read
such records (drift, the step scale, the compute model) load without compiling anything.
"""

from __future__ import annotations

from microbench.workload import BYTES_PER_VALUE, LayerInfo

__all__ = ["INFERENCE_WITH_GATHER", "LABEL_BYTES", "STEP_WITH_GATHER", "layer_bytes", "update_cost"]

LABEL_BYTES = 8  # int64 labels, as Network.forward converts them
STEP_WITH_GATHER = "data+step"  # the op name of a whole step that starts with the gather
INFERENCE_WITH_GATHER = "data+inference"  # the same for a forward-only step


def layer_bytes(info: LayerInfo, phase: str, batch: int) -> int:
    """The byte estimate of one layer's ``phase`` at ``batch`` (see :mod:`microbench.network_ops`:
    "bytes")."""
    if info.kind == "flatten":
        return 0
    x, y = info.input_bytes_per_sample * batch, info.activation_bytes_per_sample * batch
    params = info.param_count * BYTES_PER_VALUE
    if phase == "forward":
        return x + y + params
    if phase != "backward":
        raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")
    total = y + x + params  # read dy and x (or the kept output), write the parameter gradients
    if info.needs_input_grad:
        total += x + params  # write dx, read the weights it needs
    return total


def update_cost(param_count: int, momentum: float) -> tuple[int, int]:
    """``(flops, bytes)`` of one SGD update: ``p -= lr * g``, or with momentum
    ``v = m * v + g; p -= lr * v``."""
    if momentum:
        return 4 * param_count, 5 * BYTES_PER_VALUE * param_count
    return 2 * param_count, 3 * BYTES_PER_VALUE * param_count
