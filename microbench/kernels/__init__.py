"""Compute kernels of the layers a workload is made of, as plain functions on arrays and ints.

The real network (:mod:`microbench.nn`) runs these, and the compute microbenchmarks time these same
calls at each layer's shape, so every layer's forward and backward is one call on its own.

Two implementations with the same method names, signatures and results (to float rounding):

* :class:`NumbaKernels` for numpy arrays: numba (``prange``) for the memory-bound loops,
  numpy's BLAS for the GEMMs. Thread counts come from :func:`microbench.threads.set_threads`.
* :class:`ArrayKernels` written against an array module ``xp`` (numpy or cupy), for GPU arrays.

Layouts (chosen so that each layer is one big GEMM whose operands BLAS reads contiguously):

* Activations of 2-D layers are channels-last: ``(batch, height, width, channels)``. One
  convolution is then ``cols @ W`` with ``cols`` the im2col matrix of shape
  ``(batch * out_h * out_w, k * k * c_in)`` (columns ordered kernel row, kernel column, input
  channel) and the result, ``(batch * out_h * out_w, filters)``, already the channels-last
  output: no transpose anywhere.
* Convolution weights are ``(k, k, c_in, filters)``, dense weights ``(in, out)``; both are the
  right-hand GEMM operand as stored. Biases are ``(filters,)`` / ``(out,)``.
* The max-pool ``argmax`` (int32, the output's shape) holds the winning tap ``di * size + dj``
  of each window; ties go to the first tap.

The methods, per layer kind (outputs are written into arrays the caller allocates and reuses;
``dx=None`` skips an input gradient, ``b=None``/``db=None`` a bias):

* dense: ``dense_forward(x, w, b, out)``, ``dense_backward(x, w, dout, dw, db, dx)``
* conv2d: ``conv2d_forward(x, w, b, stride, padding, cols, out)``,
  ``conv2d_backward(dout, cols, w, stride, padding, dw, db, dcols, dx)``; ``cols`` and
  ``dcols`` are ``(batch * out_h * out_w, k * k * c_in)`` workspaces
* relu: ``relu_forward(x, out)``, ``relu_backward(dout, y, dx)`` (``y`` the forward output)
* maxpool2d: ``maxpool2d_forward(x, size, stride, out, argmax)``,
  ``maxpool2d_backward(dout, argmax, size, stride, dx)``
* avgpool2d (zero padding counted in the divisor, always ``size * size``):
  ``avgpool2d_forward(x, size, stride, padding, out)``,
  ``avgpool2d_backward(dout, size, stride, padding, dx)``
* global average pool, ``(batch, h, w, c) -> (batch, c)``: ``global_avgpool_forward(x, out)``,
  ``global_avgpool_backward(dout, dx)``
* residual add: ``add(a, b, out)`` (``out = a + b``; also sums a skip's gradients,
  ``add(acc, g, acc)``); ``copy(src, dst)`` (a gradient handed to a second reader)
* layernorm, over the last axis (``rows...`` are the other axes, ``f`` the last;
  ``gamma``, ``beta``, ``dgamma``, ``dbeta`` are ``(f,)``, ``inv_std`` is ``(rows..., 1)``):
  ``layernorm_forward(x, gamma, beta, y, xhat, inv_std)`` (``inv_std = 1 / sqrt(var + 1e-5)``,
  the biased variance; ``xhat = (x - mean) inv_std``, ``y = xhat gamma + beta``),
  ``layernorm_backward(dy, xhat, inv_std, gamma, dgamma, dbeta, dx)`` (``dgamma``, ``dbeta``
  written, not added to; with ``g = dy gamma``,
  ``dx = (g - mean(g) - xhat mean(g xhat)) inv_std``)
* gelu, the tanh form: ``gelu_forward(x, y, t)`` (``t = tanh(sqrt(2 / pi) (x + 0.044715 x^3))``
  kept for the backward, or ``t=None``; ``y = 0.5 x (1 + t)``), ``gelu_backward(dy, x, t, dx)``
* loss: ``softmax_cross_entropy(logits, labels, dlogits) -> (mean loss, correct)``, with
  ``dlogits = (softmax - onehot) / batch``
* helpers the network fuses with: ``bias_activation(x, b, relu, out)`` (bias, then relu),
  ``channel_sum(x, out)`` (a bias gradient), ``nchw_to_nhwc(x, out)``,
  ``sgd_update(params, grads, velocity, lr, momentum, scratch)`` and
  ``adam_update(params, grads, m, v, scalars, scratch)`` (Adam and AdamW,
  :mod:`microbench.nn.optim`)

Elementwise outputs (relu, bias_activation, relu_backward, add) may alias their input: in
place is their fast path. The outputs of layernorm and gelu are arrays of their own, except
that a backward's ``dx`` may be its ``dy``. :mod:`microbench.nn` runs a dense or conv2d layer
and the relu and max-pool right after it as one group (bias and relu after the pool, on the
smaller tensor); a per-layer timing of these kernels should time such a group the same way.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from microbench.kernels.shapes import conv_output_hw, pool_output_hw

if TYPE_CHECKING:
    from microbench.kernels.array import ArrayKernels
    from microbench.kernels.cpu import NumbaKernels

BACKENDS = ("auto", "numba", "array")


def __getattr__(name: str) -> Any:
    """The kernel sets, loaded when first asked for: the modules of this package that only
    describe calls (``calls``, ``callspec``, ``fusion``, ``policy``, ``shapes``) are read by
    the simulator, which must not wait for numba to load (half a second a command)."""
    if name == "NumbaKernels":
        from microbench.kernels.cpu import NumbaKernels

        return NumbaKernels
    if name == "ArrayKernels":
        from microbench.kernels.array import ArrayKernels

        return ArrayKernels
    if name == "Kernels":
        return __getattr__("NumbaKernels") | __getattr__("ArrayKernels")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kernels_for(xp: ModuleType = np, backend: str = "auto") -> NumbaKernels | ArrayKernels:
    """The kernel set for arrays of module ``xp``: numba for numpy unless ``backend="array"``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "numba" and xp is not np:
        raise ValueError("the numba kernels run on numpy arrays only; use backend 'array'")
    if backend == "array" or xp is not np:
        from microbench.kernels.array import ArrayKernels

        return ArrayKernels(xp)
    from microbench.kernels.cpu import NumbaKernels

    return NumbaKernels()


__all__ = [
    "BACKENDS",
    "ArrayKernels",
    "Kernels",
    "NumbaKernels",
    "conv_output_hw",
    "kernels_for",
    "pool_output_hw",
]
