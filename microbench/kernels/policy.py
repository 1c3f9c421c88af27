"""How the CPU kernels run a call, as plain numbers: which loops go parallel, how col2im is
chunked. Kept free of numba so that the simulator can enumerate a step's kernel calls
(:mod:`microbench.kernels.calls`) by the very rules :mod:`microbench.kernels.cpu` follows."""

from __future__ import annotations

# Below this many elements an elementwise loop runs serially: a parallel launch costs more.
PARALLEL_MIN_ELEMENTS = 1 << 15
# The input gradient of a convolution goes through dcols in chunks of samples this many bytes
# at most, so that col2im reads what the GEMM just wrote from cache (one core's L2 holds it),
# not from memory: 1.5-2x faster than one whole-batch GEMM and col2im.
COL2IM_CHUNK_BYTES = 5 << 18


def runs_parallel(elements: int, threads: int) -> bool:
    """Whether an elementwise loop over ``elements`` runs its parallel driver at ``threads``."""
    return elements >= PARALLEL_MIN_ELEMENTS and threads > 1


def col2im_chunk_samples(rows_per_sample: int, width: int, itemsize: int = 4) -> int:
    """Samples per chunk of a convolution's input-gradient GEMM and col2im."""
    return max(1, COL2IM_CHUNK_BYTES // (rows_per_sample * width * itemsize))
