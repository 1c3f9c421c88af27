"""Memory per rank and the printed report of the layer-wise modes (model, pipeline, inference).

Memory per rank, float32, plain SGD (no optimizer state), as
:func:`memory_per_rank` counts it for data parallelism:

* model parallelism: the rank's slice of every dense layer and the whole of every other layer
  (weights, and as much again for gradients in training); activations: every layer's whole
  output (gathered) plus the rank's own dense slices, at the batch; the largest gathered
  activation as a receive buffer, and the mini-batch input;
* pipeline: the worst stage: its layers' weights and gradients; the activations of its peak
  number of micro-batches in flight (its input and every output of its layers, at the largest
  micro-batch); a flat gradient buffer for the replicas' allreduce; stage 0 the batch input;
* inference keeps no activations for backward: the largest input + output of one layer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdlsim.sim import Cluster, Scenario

__all__ = [
    "activation_bytes_per_sample", "im2col_bytes_per_sample", "layerwise_memory",
    "memory_per_rank",
]  # fmt: skip

FLOAT_BYTES = 4


def _parts(weights: int, gradients: int, activations: int, buffers: int) -> dict[str, int]:
    parts = {
        "weights": int(weights),
        "gradients": int(gradients),
        "optimizer_state": 0,
        "activations": int(activations),
        "buffers": int(buffers),
    }
    parts["total"] = sum(parts.values())
    return parts


def _live(layers) -> int:
    """Bytes per sample of the largest input + output of one layer (forward only)."""
    return max(i.input_bytes_per_sample + i.activation_bytes_per_sample for i in layers)


def layerwise_memory(cfg: Any, result: Any, scenario: Any) -> dict[str, int]:
    """Bytes per rank (module docstring); for a pipeline, of its most loaded stage."""
    layers = scenario.workload.layers
    batch, inference = scenario.batch_per_rank, cfg.inference
    inputs = layers[0].input_bytes_per_sample * batch * (2 if scenario.prefetch else 1)
    if cfg.parallel == "pipeline":
        plan = result.plan
        micro = max(plan.micro_batches)
        worst: dict[str, int] = {}
        for st in plan.stages:
            own = layers[st.first_layer : st.first_layer + len(st.layers)]
            weights = FLOAT_BYTES * st.param_count
            if inference:
                act = micro * _live(own)
            else:
                act = st.peak_in_flight * micro * st.activation_bytes_per_sample
            buffers = (inputs if st.index == 0 else 0) + (
                weights if plan.replicas > 1 and not inference else 0
            )
            parts = _parts(weights, 0 if inference else weights, act, buffers)
            if not worst or parts["total"] > worst["total"]:
                worst = parts
        return worst
    shares = {name: share for name, _, share in getattr(result.plan, "slices", ())}
    params = 0
    kept = 0
    for info in layers:
        if info.name in shares:
            params += shares[info.name] * (info.input_shape[0] + 1)
            kept += shares[info.name] * FLOAT_BYTES
        else:
            params += info.param_count
    weights = FLOAT_BYTES * params
    if inference:
        act = batch * (_live(layers) + kept)
    else:
        act = batch * (scenario.workload.activation_bytes_per_sample + kept)
    gathered = max((batch * i.activation_bytes_per_sample for i in layers if i.name in shares),
                   default=0)  # fmt: skip
    return _parts(weights, 0 if inference else weights, act, gathered + inputs)


def memory_per_rank(cluster: Cluster, scenario: Scenario) -> dict[str, int]:
    """Bytes per rank: weights, gradients and optimizer state as the scenario's precision and
    optimizer keep them (:meth:`pdlsim.costmodel.training.Training.memory_bytes`; float32
    SGD: 4, 4 and none a parameter), the activations kept for backward at the batch
    (:func:`activation_bytes_per_sample`), the convolutions' im2col workspace (the column
    matrix of each conv layer, and its gradient where the layer passes one back: what an
    im2col + GEMM convolution allocates; on GPU ranks the largest layer's alone, a library
    workspace held for one call), both at the precision's bytes a value, on GPU ranks DDP
    bucket buffers (a flat copy of every gradient) when there is more than one rank (CPU
    ranks allreduce in place), and the mini-batch input (twice with prefetch)."""
    w = scenario.workload
    batch = scenario.batch_per_rank
    training = scenario.training
    per_value = training.value_bytes / 4  # the workload counts float32 values
    inputs = w.layers[0].input_bytes_per_sample * batch * (2 if scenario.prefetch else 1)
    state = training.memory_bytes(w.param_count)
    buckets = state["gradients"] if cluster.ranks > 1 and cluster.device == "gpu" else 0
    columns = [im2col_bytes_per_sample(info) for info in w.layers]
    # CPU ranks keep every conv layer's columns for its backward; a GPU library's convolution
    # workspace is transient, one call at a time, so the allocator's peak is the largest one
    workspace = batch * (max(columns, default=0) if cluster.device == "gpu" else sum(columns))
    parts = {
        **state,
        "activations": int(activation_bytes_per_sample(w, cluster.device) * batch * per_value),
        "workspace": int(workspace * per_value),
        "buffers": buckets + inputs,
    }
    parts["total"] = sum(parts.values())
    return parts


# Kinds whose backward does not read their input (autograd saves none of it): elementwise ops
# whose gradient needs their output (relu) or nothing (add, avgpool), views, and those that
# keep their own small state (dropout's mask). Every other kind reads its input.
_INPUT_NOT_READ = frozenset({
    "relu", "add", "concat", "flatten", "dropout", "token_pool", "global_avgpool", "avgpool2d",
    "to_tokens", "embedding",
})  # fmt: skip
_OUTPUT_READ = frozenset({"relu"})  # its gradient masks by its own output


def activation_bytes_per_sample(workload: Any, device: str) -> int:
    """Bytes per sample that backward keeps. CPU ranks (pdlsim's own trainer): every layer's
    output and what else it keeps. GPU ranks (a framework's autograd): a layer's output only
    where its backward reads it (relu) or a layer reading it reads its input (a convolution, a
    dense layer, a norm), plus every layer's own saved values (statistics, masks, attention's
    probabilities): a batchnorm's output that an in-place relu overwrites, or an add's that a
    relu reads, is not kept twice."""
    if device != "gpu":
        return workload.activation_bytes_per_sample
    layers = workload.layers
    read_as_input = set()
    for info in layers:
        if info.kind not in _INPUT_NOT_READ:
            read_as_input.update(j for j in info.inputs if j >= 0)
    total = 0
    for info in layers:
        output = math.prod(info.output_shape) * FLOAT_BYTES
        kept = info.kind in _OUTPUT_READ or info.index in read_as_input
        total += info.activation_bytes_per_sample - (0 if kept else output)
    return total


def im2col_bytes_per_sample(info: Any) -> int:
    """A conv layer's column matrix per sample (out h x out w rows of k x k x c_in floats),
    twice where it passes an input gradient back (the columns' gradient); 0 for other layers."""
    if info.kind != "conv2d":
        return 0
    k = info.layer.get("kernel")
    cols = math.prod(info.output_shape[1:]) * k * k * info.input_shape[0] * 4
    return cols * (2 if info.needs_input_grad else 1)
