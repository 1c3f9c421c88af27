"""How the CPU kernels run a call, as plain numbers: which loops go parallel, how a convolution is
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
# A convolution runs over the batch in chunks of samples whose im2col columns are this many
# bytes a thread at most, so that each GEMM reads the columns its im2col (forward) just wrote,
# and each col2im the columns its GEMM (input gradient) just wrote, from cache (each core's L2
# holds its share), not from memory: with few channels the GEMM is skinny and memory-bound,
# and a chunk runs up to 2x faster than one whole-batch im2col and GEMM. Per thread, so that
# at many threads each core's share of a chunk's GEMM stays a GEMM worth splitting.
CONV_CHUNK_BYTES = 5 << 18


def runs_parallel(elements: int, threads: int) -> bool:
    """Whether a loop of ``elements`` of work runs its parallel driver at ``threads``."""
    return elements >= PARALLEL_MIN_ELEMENTS and threads > 1


def conv_chunk_samples(rows_per_sample: int, width: int, threads: int, itemsize: int = 4) -> int:
    """Samples per chunk of a convolution's im2col and GEMM (forward), and of its
    input-gradient GEMM and col2im, at ``threads`` threads: ``rows_per_sample`` output pixels
    a sample, each a column row of ``width`` values."""
    return max(1, CONV_CHUNK_BYTES * threads // (rows_per_sample * width * itemsize))
