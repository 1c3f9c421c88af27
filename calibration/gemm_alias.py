"""A GEMM's extra cost when the rows of its right operand lie a large power of two bytes apart.

The BLAS packs the right operand B (k x n; row-major, so its rows are ``4 n`` bytes apart for
float32) into panels before multiplying. Where that stride is a multiple of a large power of
two, the rows of a panel fall into the same few cache sets, and packing them misses the cache
where a stride a few floats longer would not: on a 2-core Xeon VM (OpenBLAS, one thread) a
136 x 512 x 1544 GEMM (``nn``) takes 1.09-1.13x the time per column of a 136 x 520 x 1544 one,
16 x 2048 x 1544 1.58x, while changing m or k instead of n, or reading B transposed (``nt``),
changes nothing (docs/evidence.md, "GEMM strides"). The extra time is a cost of packing B,
paid once per element of B whatever m is:

    extra_s(n, k) = c(stride class of n, k) x k x n

with the **stride class** the largest power of two that divides ``4 n`` bytes, and
``c`` seconds per element of B, per class, interpolated linearly in log k between the k
measured (held outside them). Classes below the smallest measured cost nothing; classes above
the largest take the largest's ``c``.

It matters to the tables because the sweep's grid (:data:`microbench.kernelbench.GEMM_DIMS`)
is powers of two from 64 up: every grid point's n is in a costly class, while most layers'
widths are not. :class:`~calibration.kernel_tables.GemmTable` takes this law's extra off each
measured point before interpolating and adds the extra of the shape it prices, so an aligned
width is priced with its cost and any other without.

Measured by triples (:mod:`microbench.kernelbench`, "gemm_alias"): at each n of
:data:`~microbench.kernelbench.GEMM_ALIAS_N` and a few (m, k), the GEMM at n - 8, n and n + 8
(whole vector tiles all, the outer two of strides in no costly class) one after the other;
each triple gives ``c = (t(n) - (t(n - 8) + t(n + 8)) / 2) / (k n)``, the middle one's time
over the line through its neighbours (exact for any cost affine in n), and a class's ``c`` at
each k is the median over its triples (negative medians, noise, count as 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["AliasLaw", "stride_class_bytes"]

FLOAT_BYTES = 4


def stride_class_bytes(n: float) -> int:
    """The largest power of two dividing the row stride of a float32 ``(k, n)`` array, bytes."""
    stride = int(round(n)) * FLOAT_BYTES
    return stride & -stride if stride > 0 else 0


@dataclass(frozen=True)
class AliasLaw:
    """Per stride class (bytes), the (k, seconds per element of B) measured (module
    docstring)."""

    per_element_s: Mapping[int, tuple[tuple[int, float], ...]]

    @classmethod
    def fit(cls, triples: Iterable[tuple[int, int, int, float, float]]) -> AliasLaw:
        """From ``(m, n, k, seconds at n, seconds on the line through its unaligned
        neighbours)`` (module docstring)."""
        groups: dict[tuple[int, int], list[float]] = {}
        for m, n, k, aligned_s, reference_s in triples:
            if min(m, n, k) <= 0 or min(aligned_s, reference_s) <= 0:
                raise ValueError(f"a stride triple needs positive dims and times, not {m, n, k}")
            extra = aligned_s - reference_s
            groups.setdefault((stride_class_bytes(n), int(k)), []).append(extra / (k * n))
        table: dict[int, list[tuple[int, float]]] = {}
        for (cls_bytes, k), values in sorted(groups.items()):
            table.setdefault(cls_bytes, []).append((k, max(float(np.median(values)), 0.0)))
        return cls({c: tuple(v) for c, v in table.items()})

    @cached_property
    def _curves(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per class, ascending: (class bytes, log k, seconds per element)."""
        out = []
        for cls_bytes, points in sorted(self.per_element_s.items()):
            ks, cs = zip(*points, strict=True)
            out.append((cls_bytes, np.log(ks), np.array(cs)))
        return out

    def c_s(self, n: float, k: float) -> float:
        """Seconds per element of B for a GEMM of width ``n`` and depth ``k``."""
        cls_bytes = stride_class_bytes(n)
        below = [curve for curve in self._curves if curve[0] <= cls_bytes]
        if not below:  # no law, or a class below the smallest measured
            return 0.0
        _, log_k, cs = below[-1]
        return float(np.interp(np.log(max(k, 1.0)), log_k, cs))

    def extra_s(self, n: float, k: float) -> float:
        """Seconds a ``(m x k) @ (k x n)`` GEMM spends beyond one of a stride in no costly
        class, for any m."""
        return self.c_s(n, k) * k * n

    def to_dict(self) -> dict[str, Any]:
        return {
            str(c): [[k, float(f"{s:.4g}")] for k, s in points]
            for c, points in sorted(self.per_element_s.items())
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AliasLaw:
        """The law from :meth:`to_dict`'s form; ValueError naming what is wrong otherwise."""
        form = "a stride class in bytes (a power of two) -> [[k >= 1, seconds >= 0], ...]"
        if not isinstance(doc, Mapping):
            raise ValueError(f"alias_s_per_element must map {form}, got {type(doc).__name__}")
        out: dict[int, tuple[tuple[int, float], ...]] = {}
        for key, points in doc.items():
            try:
                cls_bytes = int(key)
                pts = tuple((int(k), float(s)) for k, s in points)
            except (TypeError, ValueError):
                raise ValueError(f"alias_s_per_element[{key!r}]: expected {form}") from None
            bad_class = cls_bytes < 1 or cls_bytes & (cls_bytes - 1)
            if bad_class or not pts or any(k < 1 or not 0 <= s < np.inf for k, s in pts):
                raise ValueError(f"alias_s_per_element[{key!r}]: expected {form}")
            out[cls_bytes] = pts
        return cls(out)
