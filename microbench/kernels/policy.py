"""How the CPU kernels run a call, as plain numbers: which loops go parallel, how col2im is
chunked. Kept free of numba so that the simulator can enumerate a step's kernel calls
(:mod:`microbench.kernels.calls`) by the very rules :mod:`microbench.kernels.cpu` follows."""

from __future__ import annotations

# Below this many elements of work (:func:`microbench.kernels.calls.call_features`: a pool's
# window taps, an im2col's column entries, an elementwise loop's elements) a loop runs its
# serial driver at any thread count. A parallel launch wakes sleeping worker threads: 60-80 us
# on a VM, where the wake goes through the hypervisor (a few us on bare metal), more than the
# serial loop takes below this size. On the 2-core Xeon VM the loop tables, each driver timed
# alone, put the crossovers at 2^15-2^18 elements, and at 2^20-2^21 for the streaming loops
# (relu, its mask, the SGD update); at 2^17 no loop loses more than about 0.1 ms a call to the
# driver not taken (benchmarks/parallel_crossover.py). The streaming loops keep the common
# figure: inside a step they read what threaded GEMMs just wrote on both cores, and a serial
# update of the MLP preset's gradients at 2 threads ran 4-5x its time alone, 1.7x the parallel
# one.
PARALLEL_MIN_ELEMENTS = 1 << 17
# The input gradient of a convolution goes through dcols in chunks of samples this many bytes
# at most, so that col2im reads what the GEMM just wrote from cache (one core's L2 holds it),
# not from memory: 1.5-2x faster than one whole-batch GEMM and col2im.
COL2IM_CHUNK_BYTES = 5 << 18


def runs_parallel(elements: int, threads: int) -> bool:
    """Whether a loop of ``elements`` of work runs its parallel driver at ``threads``."""
    return elements >= PARALLEL_MIN_ELEMENTS and threads > 1


def col2im_chunk_samples(rows_per_sample: int, width: int, itemsize: int = 4) -> int:
    """Samples per chunk of a convolution's input-gradient GEMM and col2im."""
    return max(1, COL2IM_CHUNK_BYTES // (rows_per_sample * width * itemsize))
