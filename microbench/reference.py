"""Machine references next to the network's ops: square float32 GEMM and the STREAM triad.

GEMM (``c = a @ b``, n x n, float32, 2 n^3 FLOPs) is what dense and conv layers reduce to, so
its GFLOP/s bounds theirs; triad (``a = b + s * c``, float64, numba ``prange`` on the CPU, an
elementwise kernel on the GPU) measures the memory bandwidth that relu, pooling, im2col and
the update are bound by. Triad bytes follow STREAM's counting: 3 arrays x 8 B x n per pass
(reads of b and c, the write of a; no write-allocate traffic).

Triad's arrays must not fit in the last-level cache, or it measures the cache. Their total
(3 arrays) is :data:`TRIAD_CACHE_FACTOR` times the last-level cache, read from sysfs and summed
over its instances (:data:`DEFAULT_LLC_BYTES` when sysfs does not say), at least
:data:`TRIAD_MIN_TOTAL_BYTES`, and at most 1/:data:`TRIAD_MEMORY_DIVISOR` of the memory
available now, so that a benchmark on a shared node cannot push it into swapping. On a GPU
the same rule uses its L2 and free device memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numba import njit, prange

from microbench import kernels  # noqa: F401  (sets numba's threading layer before any launch)
from microbench.sampling import Point

__all__ = [
    "DEFAULT_LLC_BYTES",
    "TriadArrays",
    "gemm_point",
    "last_level_cache_bytes",
    "triad_elements",
]

DEFAULT_LLC_BYTES = 64 << 20
TRIAD_CACHE_FACTOR = 4
TRIAD_MIN_TOTAL_BYTES = 64 << 20
GPU_TRIAD_MIN_TOTAL_BYTES = 1 << 30  # a pass must outlast a kernel launch by far
TRIAD_MEMORY_DIVISOR = 8
TRIAD_SCALAR = 3.0
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _cache_size_bytes(text: str) -> int:
    """sysfs cache sizes: ``"48K"``, ``"2048K"``, ``"32M"``, or plain bytes."""
    text = text.strip()
    if text and text[-1].upper() in _UNITS:
        return int(text[:-1]) * _UNITS[text[-1].upper()]
    return int(text)


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """The last-level data cache's size summed over its instances (one per socket, say), from
    sysfs; None when sysfs does not describe the caches."""
    caches: dict[tuple[int, str], int] = {}
    for index in root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            caches[(level, shared)] = _cache_size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
    if not caches:
        return None
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def triad_elements(cache_bytes: int, memory_bytes: int | None, minimum_total: int) -> int:
    """Elements per triad array under the size rule of the module docstring."""
    total = max(TRIAD_CACHE_FACTOR * cache_bytes, minimum_total)
    if memory_bytes is not None:
        total = min(total, memory_bytes // TRIAD_MEMORY_DIVISOR)
    return max(1, total // (3 * 8))


def gemm_point(xp: Any, n: int, base_params: dict[str, Any], seed: int = 0) -> Point:
    """``c = a @ b`` on n x n float32 matrices of module ``xp`` (numpy or cupy)."""
    rng = np.random.default_rng(seed)
    a = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    c = xp.empty((n, n), dtype=xp.float32)
    params = {**base_params, "m": n, "n": n, "k": n, "flops": 2 * n**3, "dtype": "float32"}
    return Point("gemm", params, lambda: xp.matmul(a, b, out=c))


class TriadArrays:
    """The three float64 arrays of the triad, allocated once and filled in parallel (first
    touch by the threads that will use them), on the CPU (numba) or a GPU (``gpu``)."""

    def __init__(self, elements: int, gpu: Any = None) -> None:
        self.elements = elements
        self.gpu = gpu
        if gpu is None:
            self.a, self.b, self.c = (np.empty(elements) for _ in range(3))
            for array, value in ((self.a, 0.0), (self.b, 1.0), (self.c, 2.0)):
                _fill(array, value)
        else:
            cp = gpu.cupy
            self.a = cp.zeros(elements, dtype=cp.float64)
            self.b = cp.full(elements, 1.0, dtype=cp.float64)
            self.c = cp.full(elements, 2.0, dtype=cp.float64)
            self._kernel = cp.ElementwiseKernel(
                "float64 b, float64 c, float64 s", "float64 a", "a = b + s * c", "pdlsim_triad"
            )
            gpu.synchronize()

    @property
    def bytes_per_pass(self) -> int:
        return 3 * 8 * self.elements

    def run(self) -> None:
        if self.gpu is None:
            _triad(self.a, self.b, self.c, TRIAD_SCALAR)
        else:
            self._kernel(self.b, self.c, TRIAD_SCALAR, self.a)

    def check(self) -> bool:
        """Whether the last pass computed ``b + s * c`` (a sample of the result)."""
        expected = 1.0 + TRIAD_SCALAR * 2.0
        probe = self.a[:: max(1, self.elements // 1024)]
        if self.gpu is not None:
            probe = self.gpu.cupy.asnumpy(probe)
        return bool(np.all(probe == expected))

    def point(self, base_params: dict[str, Any]) -> Point:
        params = {**base_params, "bytes": self.bytes_per_pass, "elements": self.elements}
        return Point("triad", {**params, "dtype": "float64"}, self.run)


@njit(parallel=True, cache=True)
def _triad(a, b, c, s):  # pragma: no cover - compiled
    for i in prange(a.size):
        a[i] = b[i] + s * c[i]


@njit(parallel=True, cache=True)
def _fill(a, value):  # pragma: no cover - compiled
    for i in prange(a.size):
        a[i] = value
