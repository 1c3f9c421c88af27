"""Output sizes of the windowed layers, shared by both kernel implementations, and the rows
of a layer's 2-D view."""

from __future__ import annotations

import math
from collections.abc import Sequence


def matrix_rows(batch: int, sample_shape: Sequence[int]) -> int:
    """The rows of the ``(rows, last axis)`` view of ``batch`` samples of ``sample_shape``:
    every axis but the last (a dense layer on tokens, a normalisation over channels)."""
    return batch * math.prod(sample_shape[:-1])


def conv_output_hw(
    height: int, width: int, kernel: int, stride: int, padding: int
) -> tuple[int, int]:
    """Output height and width of a square ``kernel`` convolution (floor division, like torch)."""
    out_h = (height + 2 * padding - kernel) // stride + 1
    out_w = (width + 2 * padding - kernel) // stride + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"kernel {kernel} does not fit the padded input {height + 2 * padding}x"
            f"{width + 2 * padding}"
        )
    return out_h, out_w


def pool_output_hw(height: int, width: int, size: int, stride: int) -> tuple[int, int]:
    """Output height and width of a ``size`` x ``size`` max pool without padding."""
    return conv_output_hw(height, width, size, stride, 0)


def window_range(out_size: int, in_size: int, stride: int, offset: int) -> tuple[int, int]:
    """Outputs ``o`` in ``[lo, hi)`` whose window position ``o * stride + offset`` is inside the
    input ``[0, in_size)``; ``offset`` is a kernel tap minus the padding (may be negative)."""
    lo = min(out_size, -(offset // stride)) if offset < 0 else 0  # ceil(-offset / stride)
    last = in_size - 1 - offset
    hi = min(out_size, last // stride + 1) if last >= 0 else 0
    return lo, max(lo, hi)
