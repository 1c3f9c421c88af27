"""What one kernel call of a training step is: its kernel, the dimensions its cost depends on
(:data:`KERNEL_DIMS`), and the two features a kernel's cost table is laid out over
(:func:`call_features`). :mod:`microbench.kernels.calls` lists a step's calls; the kernel
sweep and the compute model read them through these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from microbench.kernels.shapes import conv_output_hw, pool_output_hw, window_range
from microbench.workload import BYTES_PER_VALUE

__all__ = [
    "GEMM_LAYOUTS", "KERNEL_DIMS", "LABEL_BYTES", "ROW_KERNELS", "SERIAL_ONLY", "KernelCall",
    "call_features",
]  # fmt: skip

LABEL_BYTES = 8  # int64 labels, as Network.forward converts them
GEMM_LAYOUTS = ("nn", "tn", "nt")  # which operand BLAS reads transposed: none, A, B

# The dimensions of each kernel's call, in order.
KERNEL_DIMS: dict[str, tuple[str, ...]] = {
    **{f"gemm_{layout}": ("m", "n", "k") for layout in GEMM_LAYOUTS},
    "bias_act": ("rows", "cols"),
    "column_sum": ("rows", "cols"),
    "relu": ("elements",),
    "relu_mask": ("elements",),
    "copy": ("elements",),
    "copy_runs": ("rows", "run"),  # into or out of a slice: rows of ``run`` contiguous values
    "add": ("elements",),
    "sgd": ("elements",),
    "sgd_momentum": ("elements",),
    "adam": ("elements",),
    "softmax_xent": ("batch", "classes"),
    "im2col": ("batch", "height", "width", "channels", "kernel", "stride", "padding"),
    "col2im": ("batch", "height", "width", "channels", "kernel", "stride", "padding"),
    "maxpool": ("batch", "height", "width", "channels", "size", "stride"),
    "maxpool_backward": ("batch", "height", "width", "channels", "size", "stride"),
    "maxpool_backward_tiled": ("batch", "height", "width", "channels", "size", "stride"),
    "avgpool": ("batch", "height", "width", "channels", "size", "stride", "padding"),
    "avgpool_backward": ("batch", "height", "width", "channels", "size", "stride", "padding"),
    "global_avgpool": ("batch", "height", "width", "channels"),
    "global_avgpool_backward": ("batch", "height", "width", "channels"),
    "nchw_to_nhwc": ("batch", "channels", "height", "width"),
    "gather": ("batch", "row_bytes"),
    **{k: ("rows", "cols") for k in ("layernorm", "layernorm_backward")},
    **{k: ("rows", "channels") for k in ("batchnorm", "batchnorm_eval", "batchnorm_backward")},
    **{k: ("elements",) for k in ("gelu", "gelu_backward", "dropout", "dropout_backward")},
    "zero": ("elements",),
    "uniform": ("elements",),
    "attention": ("batch", "tokens", "dim", "heads", "causal"),
    "attention_backward": ("batch", "tokens", "dim", "heads", "causal"),
    "embedding": ("batch", "tokens", "dim"),
    "embedding_backward": ("batch", "tokens", "dim"),
}

# Kernels with one variant: BLAS's GEMMs, numpy's copies and draws, the loss, and the loops
# that scatter (race) or gather rows serially.
SERIAL_ONLY = {
    "softmax_xent", "gather", "copy", "copy_runs", "uniform", "embedding", "embedding_backward",
    *(f"gemm_{x}" for x in GEMM_LAYOUTS),
}  # fmt: skip
ROW_KERNELS = frozenset(
    {"bias_act", "column_sum", "copy_runs", "softmax_xent", "layernorm", "layernorm_backward",
     "batchnorm", "batchnorm_eval", "batchnorm_backward"}
)  # fmt: skip


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of a step: ``kernel`` at ``dims`` (:data:`KERNEL_DIMS`), charged to
    workload layer ``layer`` in ``phase``; ``parallel``: a numba loop's parallel driver.
    ``reads`` and ``writes`` name the network's buffers the call touches and their bytes
    (buffers are named by role and lead layer, ``y3``, ``cols0``, ``W7``; an in-place op's
    output keeps its input's name), so that a model can follow what stays in cache."""

    kernel: str
    dims: tuple[int, ...]
    layer: int
    phase: str
    parallel: bool = False
    reads: tuple[tuple[str, int], ...] = ()  # (buffer, bytes) the call reads
    writes: tuple[tuple[str, int], ...] = ()  # (buffer, bytes) it writes

    def __post_init__(self) -> None:
        if self.kernel not in KERNEL_DIMS:
            raise ValueError(f"unknown kernel {self.kernel!r}")
        if len(self.dims) != len(KERNEL_DIMS[self.kernel]):
            raise ValueError(f"{self.kernel} takes dims {KERNEL_DIMS[self.kernel]}")

    @property
    def variant(self) -> str:
        """The code that runs: the kernel, or ``KERNEL_serial`` for a loop's serial driver
        (GEMMs, the loss, gathers and copies have one variant)."""
        if self.kernel in SERIAL_ONLY or self.parallel:
            return self.kernel
        return self.kernel + "_serial"


def call_features(kernel: str, dims: Sequence[int]) -> tuple[int, int]:
    """``(elements, run)`` of a loop, gather or copy call: the elements it works through (a
    max-pool: its window taps; a GEMM: its multiply-adds) and the mean length of its innermost
    contiguous runs (the values one inner loop copies or reduces before it jumps; 1 where a
    kernel has no such axis). Attention counts every (query, key) pair times the width (a
    causal core computes the whole square of scores with BLAS and masks it after, so it costs
    a full one); its run is one (sample, head) block's share of that, pairs times the head
    width: the core works block by block, each paying a fixed cost (its head's copies and BLAS
    calls) beside its pairs, so that its time per element is a law of the block (at one head
    width, short sequences cost several times more per element than long ones). A kernel's
    cost tables are laid out over these two (:mod:`microbench.kernelbench`)."""
    if kernel.startswith("gemm_"):
        m, n, k = dims
        return m * n * k, 1
    if kernel in ROW_KERNELS:
        return dims[0] * dims[1], dims[1]
    if kernel.startswith("attention"):  # every (query, key) pair, times d
        n, t, d, heads, _ = dims
        return n * t * t * d, t * t * (d // heads)
    if kernel.startswith("embedding"):
        return math.prod(dims), dims[2]
    if kernel == "gather":
        return dims[0] * dims[1] // BYTES_PER_VALUE, dims[1] // BYTES_PER_VALUE
    if kernel == "im2col":
        n, h, w, c, k, s, p = dims
        oh, ow = conv_output_hw(h, w, k, s, p)
        return n * oh * ow * k * k * c, _im2col_run(w, c, k, s, p)
    if kernel == "col2im":
        n, h, w, c, k, s, p = dims
        oh, ow = conv_output_hw(h, w, k, s, p)
        return n * oh * ow * k * k * c, c
    if kernel == "maxpool":  # every output reads its size x size window
        n, h, w, c, size, stride = dims
        oh, ow = pool_output_hw(h, w, size, stride)
        return n * oh * ow * c * size * size, c
    if kernel == "maxpool_backward":  # every input searches the windows that cover it
        n, h, w, c, size, stride = dims
        return n * h * w * c * math.ceil(size / stride) ** 2, c
    if kernel == "avgpool":
        n, h, w, c, size, stride, p = dims
        oh, ow = conv_output_hw(h, w, size, stride, p)
        return n * oh * ow * c * size * size, c
    if kernel == "avgpool_backward":  # every input sums the windows that cover it, which
        # neighbouring inputs share from L1: its time follows the inputs written (a 2x2 and a
        # 3x2 window at the same shape ran within 15% of each other, not 4x apart)
        n, h, w, c = dims[:4]
        return n * h * w * c, c
    if kernel.startswith("global_avgpool"):
        return math.prod(dims), dims[3]
    if kernel in ("maxpool_backward_tiled", "nchw_to_nhwc"):
        return math.prod(dims[:4]), (dims[3] if kernel != "nchw_to_nhwc" else dims[1])
    return dims[0], 1


def _im2col_run(width: int, c: int, k: int, stride: int, padding: int) -> int:
    """The mean contiguous run of an im2col row: a window inside the image copies each kernel
    row's k x c values in one run, one that overhangs the padding copies (or zeroes) c at a
    time (:func:`microbench.kernels.loops.im2col`)."""
    ow = (width + 2 * padding - k) // stride + 1
    inside = window_range(ow, width - k + 1, stride, -padding)
    n_inside = inside[1] - inside[0]
    runs = n_inside * k + (ow - n_inside) * k * k  # inner loops per output row
    return max(1, round(ow * k * k * c / runs))
