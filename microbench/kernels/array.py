"""Kernels written against an array module ``xp`` (numpy or cupy), for GPU arrays.

Only operations that numpy and cupy both provide are used: slicing with steps, ``matmul`` and
``sum`` with ``out=``, ``maximum``, ``where``, ``exp``, ``log``, ``argmax``, boolean-mask
assignment. The loops run over kernel taps (k*k iterations of whole-batch slice copies), never
over elements, so on a GPU each iteration is one device kernel.

Same signatures, layouts and results (to rounding) as :class:`microbench.kernels.cpu.NumbaKernels`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from microbench.kernels.array_tokens import ArrayTokenKernels, normalise
from microbench.kernels.loops_norm import GELU_A, GELU_C
from microbench.kernels.shapes import conv_output_hw, pool_output_hw, window_range


def _tap_slices(
    out_size: int, in_size: int, stride: int, offset: int
) -> tuple[slice, slice] | None:
    """(output slice, input slice) of one kernel tap along one axis, or None if it never fits."""
    lo, hi = window_range(out_size, in_size, stride, offset)
    if hi <= lo:
        return None
    first = lo * stride + offset
    return slice(lo, hi), slice(first, (hi - 1) * stride + offset + 1, stride)


class ArrayKernels(ArrayTokenKernels):
    """The kernel set for arrays of module ``xp`` (see :mod:`microbench.kernels` for layouts)."""

    name = "array"

    def __init__(self, xp: ModuleType = np) -> None:
        self.xp = xp

    # dense ---------------------------------------------------------------------------------

    def dense_forward(self, x: Any, w: Any, b: Any, out: Any) -> None:
        self.xp.matmul(x, w, out=out)
        if b is not None:
            self.xp.add(out, b, out=out)

    def dense_backward(self, x: Any, w: Any, dout: Any, dw: Any, db: Any, dx: Any) -> None:
        xp = self.xp
        xp.matmul(x.T, dout, out=dw)
        if db is not None:
            xp.sum(dout, axis=0, out=db)
        if dx is not None:
            xp.matmul(dout, w.T, out=dx)

    def tied_dense_backward(
        self, x: Any, table: Any, dout: Any, dtable: Any, db: Any, dx: Any
    ) -> None:
        xp = self.xp
        xp.matmul(dout.T, x, out=dtable)
        if db is not None:
            xp.sum(dout, axis=0, out=db)
        if dx is not None:
            xp.matmul(dout, table, out=dx)

    # conv2d --------------------------------------------------------------------------------

    def conv2d_forward(
        self, x: Any, w: Any, b: Any, stride: int, padding: int, cols: Any, out: Any
    ) -> None:
        n, h, wd, c = x.shape
        k, f = w.shape[0], w.shape[3]
        out_h, out_w = conv_output_hw(h, wd, k, stride, padding)
        cols6 = cols.reshape(n, out_h, out_w, k, k, c)
        if padding:
            cols.fill(0)
        for kh in range(k):
            rows = _tap_slices(out_h, h, stride, kh - padding)
            for kw in range(k):
                columns = _tap_slices(out_w, wd, stride, kw - padding)
                if rows is None or columns is None:
                    continue
                cols6[:, rows[0], columns[0], kh, kw, :] = x[:, rows[1], columns[1], :]
        out2d = out.reshape(n * out_h * out_w, f)
        self.xp.matmul(cols, w.reshape(k * k * c, f), out=out2d)
        if b is not None:
            self.xp.add(out2d, b, out=out2d)

    def conv2d_backward(
        self,
        dout: Any,
        cols: Any,
        w: Any,
        stride: int,
        padding: int,
        dw: Any,
        db: Any,
        dcols: Any,
        dx: Any,
    ) -> None:
        xp = self.xp
        n, out_h, out_w, f = dout.shape
        k, c = w.shape[0], w.shape[2]
        dout2d = dout.reshape(n * out_h * out_w, f)
        xp.matmul(cols.T, dout2d, out=dw.reshape(k * k * c, f))
        if db is not None:
            xp.sum(dout2d, axis=0, out=db)
        if dx is None:
            return
        xp.matmul(dout2d, w.reshape(k * k * c, f).T, out=dcols)
        dcols6 = dcols.reshape(n, out_h, out_w, k, k, c)
        h, wd = dx.shape[1], dx.shape[2]
        dx.fill(0)
        for kh in range(k):
            rows = _tap_slices(out_h, h, stride, kh - padding)
            for kw in range(k):
                columns = _tap_slices(out_w, wd, stride, kw - padding)
                if rows is None or columns is None:
                    continue
                # For one tap, distinct outputs land on distinct inputs: += is a plain add.
                dx[:, rows[1], columns[1], :] += dcols6[:, rows[0], columns[0], kh, kw, :]

    # elementwise and reductions ------------------------------------------------------------

    def bias_activation(self, x: Any, b: Any, relu: bool, out: Any) -> None:
        self.xp.add(x, b, out=out)
        if relu:
            self.xp.maximum(out, 0, out=out)

    def channel_sum(self, x: Any, out: Any) -> None:
        self.xp.sum(x.reshape(-1, x.shape[-1]), axis=0, out=out)

    def copy(self, src: Any, dst: Any) -> None:
        self.xp.copyto(dst, src)

    def add(self, a: Any, b: Any, out: Any) -> None:
        self.xp.add(a, b, out=out)

    def relu_forward(self, x: Any, out: Any) -> None:
        self.xp.maximum(x, 0, out=out)

    def relu_backward(self, dout: Any, y: Any, dx: Any) -> None:
        self.xp.multiply(dout, y > 0, out=dx)

    # layernorm and gelu (as microbench.nn.blocks' LayerNorm and Gelu compute them) ----------

    def layernorm_forward(
        self, x: Any, gamma: Any, beta: Any, y: Any, xhat: Any, inv_std: Any
    ) -> None:
        xp = self.xp
        mean = xp.mean(x, axis=-1, keepdims=True)
        xp.subtract(x, mean, out=xhat)
        xp.multiply(xhat, xhat, out=y)  # y as scratch for the squares
        xp.mean(y, axis=-1, keepdims=True, out=inv_std)
        normalise(xp, inv_std, xhat, gamma, beta, y)

    def layernorm_backward(
        self, dy: Any, xhat: Any, inv_std: Any, gamma: Any, dgamma: Any, dbeta: Any, dx: Any
    ) -> None:
        xp, f = self.xp, dy.shape[-1]
        xp.sum(dy.reshape(-1, f), axis=0, out=dbeta)
        work = xp.multiply(dy, xhat)
        xp.sum(work.reshape(-1, f), axis=0, out=dgamma)
        if dx is None:
            return
        xp.multiply(dy, gamma, out=work)  # g
        g_mean = xp.mean(work, axis=-1, keepdims=True)
        xp.multiply(work, xhat, out=dx)
        gx_mean = xp.mean(dx, axis=-1, keepdims=True)
        xp.multiply(xhat, gx_mean, out=dx)
        xp.subtract(work, dx, out=dx)
        xp.subtract(dx, g_mean, out=dx)
        xp.multiply(dx, inv_std, out=dx)

    def gelu_forward(self, x: Any, y: Any, t: Any) -> None:
        xp = self.xp
        u = y if t is None else t  # the tanh's argument, then the tanh
        xp.multiply(x, x, out=u)
        xp.multiply(u, GELU_A, out=u)
        xp.add(u, 1.0, out=u)
        xp.multiply(u, x, out=u)
        xp.multiply(u, GELU_C, out=u)
        xp.tanh(u, out=u)
        xp.add(u, 1.0, out=y)
        xp.multiply(y, x, out=y)
        xp.multiply(y, 0.5, out=y)

    def gelu_backward(self, dy: Any, x: Any, t: Any, dx: Any) -> None:
        xp = self.xp
        p = xp.multiply(x, x)  # p = C x (1 + 3 A x^2)
        xp.multiply(p, 3.0 * GELU_A, out=p)
        xp.add(p, 1.0, out=p)
        xp.multiply(p, x, out=p)
        xp.multiply(p, GELU_C, out=p)
        s = xp.multiply(t, t)
        xp.subtract(1.0, s, out=s)
        xp.multiply(s, p, out=s)
        xp.add(s, 1.0, out=s)
        xp.add(s, t, out=s)
        xp.multiply(s, 0.5, out=s)
        xp.multiply(s, dy, out=dx)

    # maxpool2d -----------------------------------------------------------------------------

    @staticmethod
    def _pool_slices(out: Any, stride: int, di: int, dj: int) -> tuple[slice, slice, slice, slice]:
        out_h, out_w = out.shape[1], out.shape[2]
        return (
            slice(None),
            slice(di, di + stride * (out_h - 1) + 1, stride),
            slice(dj, dj + stride * (out_w - 1) + 1, stride),
            slice(None),
        )

    def maxpool2d_forward(self, x: Any, size: int, stride: int, out: Any, argmax: Any) -> None:
        pool_output_hw(x.shape[1], x.shape[2], size, stride)  # validates the window fits
        for di in range(size):
            for dj in range(size):
                window = x[self._pool_slices(out, stride, di, dj)]
                if di == 0 and dj == 0:
                    out[...] = window
                    argmax.fill(0)
                    continue
                better = window > out  # strict: ties keep the first tap, as the numba kernel
                argmax[better] = di * size + dj
                self.xp.maximum(out, window, out=out)

    def maxpool2d_backward(self, dout: Any, argmax: Any, size: int, stride: int, dx: Any) -> None:
        xp = self.xp
        zero = dout.dtype.type(0)
        dx.fill(0)
        for di in range(size):
            for dj in range(size):
                dx[self._pool_slices(dout, stride, di, dj)] += xp.where(
                    argmax == di * size + dj, dout, zero
                )

    # avgpool2d and global average pool -----------------------------------------------------

    @staticmethod
    def _avgpool_taps(out_hw: tuple[int, int], in_hw: tuple[int, int], size: int, stride: int,
                      padding: int):  # fmt: skip
        """Per window tap that meets the input, (output slices, input slices): distinct
        outputs of one tap read distinct inputs."""
        for di in range(size):
            rows = _tap_slices(out_hw[0], in_hw[0], stride, di - padding)
            for dj in range(size):
                columns = _tap_slices(out_hw[1], in_hw[1], stride, dj - padding)
                if rows is not None and columns is not None:
                    yield (rows[0], columns[0]), (rows[1], columns[1])

    def avgpool2d_forward(self, x: Any, size: int, stride: int, padding: int, out: Any) -> None:
        in_hw = (x.shape[1], x.shape[2])
        out_hw = conv_output_hw(*in_hw, size, stride, padding)
        out.fill(0)
        for (orow, ocol), (irow, icol) in self._avgpool_taps(out_hw, in_hw, size, stride, padding):
            out[:, orow, ocol, :] += x[:, irow, icol, :]
        out *= 1.0 / (size * size)

    def avgpool2d_backward(self, dout: Any, size: int, stride: int, padding: int, dx: Any) -> None:
        in_hw, out_hw = (dx.shape[1], dx.shape[2]), (dout.shape[1], dout.shape[2])
        dx.fill(0)
        for (orow, ocol), (irow, icol) in self._avgpool_taps(out_hw, in_hw, size, stride, padding):
            dx[:, irow, icol, :] += dout[:, orow, ocol, :]
        dx *= 1.0 / (size * size)

    def global_avgpool_forward(self, x: Any, out: Any) -> None:
        self.xp.sum(x, axis=(1, 2), out=out)
        out *= 1.0 / (x.shape[1] * x.shape[2])

    def global_avgpool_backward(self, dout: Any, dx: Any) -> None:
        scale = 1.0 / (dx.shape[1] * dx.shape[2])
        self.xp.multiply(dout[:, None, None, :], scale, out=dx)

    # layout, loss, update ------------------------------------------------------------------

    def nchw_to_nhwc(self, x: Any, out: Any) -> None:
        out[...] = x.transpose(0, 2, 3, 1)

    def softmax_cross_entropy(self, logits: Any, labels: Any, dlogits: Any) -> tuple[float, int]:
        """No ``(batch, classes)`` temporary (a language model's vocabulary makes it large):
        the softmax is formed in ``dlogits`` itself; the loss summed in float64."""
        xp = self.xp
        n = logits.shape[0]
        rows = xp.arange(n)
        xp.subtract(logits, logits.max(axis=1, keepdims=True), out=dlogits)
        picked = dlogits[rows, labels].astype(xp.float64)
        correct = (xp.argmax(logits, axis=1) == labels).sum()
        xp.exp(dlogits, out=dlogits)
        total = dlogits.sum(axis=1, keepdims=True)
        loss = xp.log(total[:, 0].astype(xp.float64)) - picked
        xp.divide(dlogits, total, out=dlogits)
        dlogits[rows, labels] -= 1
        xp.multiply(dlogits, 1.0 / n, out=dlogits)
        return float(loss.mean()), int(correct)

    def sgd_update(
        self, params: Any, grads: Any, velocity: Any, lr: float, momentum: float, scratch: Any
    ) -> None:
        xp = self.xp
        direction = grads
        if momentum:
            xp.multiply(velocity, momentum, out=velocity)
            xp.add(velocity, grads, out=velocity)
            direction = velocity
        xp.multiply(direction, lr, out=scratch)
        xp.subtract(params, scratch, out=params)

    def adam_update(self, params: Any, grads: Any, m: Any, v: Any, scalars: Any, scratch: Any):
        """One Adam/AdamW step (:func:`microbench.kernels.loops.adam_serial`) with in-place
        array operations; ``scratch`` (shaped like the gradients) holds the gradient as used."""
        xp = self.xp
        scale, l2, b1, b2, decay, step, rsq, eps = (float(s) for s in scalars)
        xp.multiply(grads, scale, out=scratch)
        if l2:
            scratch += l2 * params
        xp.multiply(m, b1, out=m)
        m += (1 - b1) * scratch
        xp.multiply(v, b2, out=v)
        v += (1 - b2) * scratch * scratch
        xp.sqrt(v, out=scratch)
        scratch *= rsq
        scratch += eps
        xp.divide(m, scratch, out=scratch)
        if decay != 1.0:
            params *= decay
        params -= step * scratch
