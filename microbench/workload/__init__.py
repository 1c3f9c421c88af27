"""One workload description for the compute benchmarks, the real network and the simulator.

A workload is a named graph of layers with shapes (:mod:`.graph`); from it come, per layer
(:mod:`.layers`), the output shape, the parameter count, forward and backward FLOPs per sample,
activation and gradient bytes, and in total the gradient bytes that data parallelism must
allreduce. :mod:`microbench.nn` builds the real numpy/numba network from the same description;
:mod:`.zoo` names the presets and the published networks.

It lives in microbench because the compute benchmarks time each layer at the shapes a workload
runs, and microbench must work on a cluster without pdlsim; pdlsim imports it from here.
"""

from .graph import (
    NETWORK_INPUT,
    Workload,
    load_workload,
    preset_names,
    sliced_dense,
    split_columns,
)
from .layers import (
    BYTES_PER_VALUE,
    KIND_SETTINGS,
    LAYER_KINDS,
    LOSS_KINDS,
    MAX_DIM,
    Layer,
    LayerInfo,
    WorkloadError,
)
from .zoo import PRESETS, ZOO

# The kinds that layer-wise (model) parallelism splits, and those the CPU kernel model prices;
# the numpy network trains every kind.
SPLITTABLE_KINDS = (
    "dense", "conv2d", "relu", "maxpool2d", "flatten", "add", "avgpool2d", "global_avgpool",
    "softmax_cross_entropy",
)  # fmt: skip
# The CPU kernel model's kinds, each with the settings beyond the first workload language's
# (microbench.workload.graph.Workload.require) that it prices.
CPU_MODEL_KINDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(SPLITTABLE_KINDS, ()),
    "dense": ("bias", "tied_to"),
    "conv2d": ("bias",),
    "avgpool2d": ("padding",),
    "maxpool2d": ("padding",),
    **dict.fromkeys(("batchnorm2d", "layernorm", "gelu", "dropout", "token_pool", "concat"), ()),
    "to_tokens": ("cls_token", "positions"),
    "embedding": ("positions", "token_types"),
    "attention": ("bias", "causal"),
    "token_cross_entropy": (),
}

__all__ = [
    "BYTES_PER_VALUE", "KIND_SETTINGS", "LAYER_KINDS", "LOSS_KINDS", "MAX_DIM", "NETWORK_INPUT",
    "CPU_MODEL_KINDS", "PRESETS", "SPLITTABLE_KINDS", "ZOO", "Layer", "LayerInfo", "Workload",
    "WorkloadError", "load_workload", "preset_names", "sliced_dense", "split_columns",
]  # fmt: skip
