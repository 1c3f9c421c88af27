"""How much slower one core's work runs while k cores of the node run the same work at once.

    python benchmarks/node_fill.py [--procs 1,2,4,8,16] [--seconds 1.5] [--out FILE.json]

Ranks on one node share the memory bandwidth, the last-level cache, the power budget (the
all-core clock is below the one-core clock) and the cores the operating system needs for its
own work. A calibration at 1-2 ranks on a many-core node sees little of this, yet a prediction
at every core of the node carries all of it. This benchmark measures the machine's side alone,
with no MPI and no communication: k independent processes (one thread each) start together at
a barrier and time the same kernel, for k = 1, 2, 4, ... up to the cores. Three kernels span
what a training step is made of:

* ``gemm``: a 512^3 float32 GEMM (compute-bound, its operands in the core's own caches);
* ``stream``: ``a = b + c`` over float32 arrays twice the last-level cache per process
  (memory-bound; 12 bytes a pass per element);
* ``calls``: 200 NumPy calls on 256-element arrays (per-call overhead: the clock and the
  core's own caches, and any time the operating system takes from the core).

Reported per k: the median over processes of each one's median call time, the slowest
process's median, and both over k = 1. Every raw sample is written with the machine's metadata
(``--out``). Warm-up calls are discarded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_name] = "1"  # before NumPy loads here or in a spawned worker

KERNELS = ("gemm", "stream", "calls")
WARMUP_CALLS = 3
GEMM_N = 512
CALLS_PER_SAMPLE = 200
CALLS_ELEMENTS = 256


def _kernel(name: str, stream_elements: int):
    """A no-argument callable running one call of kernel ``name``."""
    import numpy as np

    rng = np.random.default_rng(os.getpid())
    if name == "gemm":
        a, b = (rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32) for _ in range(2))
        return lambda: a @ b
    if name == "stream":
        a, b, c = (np.ones(stream_elements, dtype=np.float32) for _ in range(3))
        return lambda: np.add(b, c, out=a)
    x, y, z = (rng.standard_normal(CALLS_ELEMENTS, dtype=np.float32) for _ in range(3))

    def calls() -> None:
        for _ in range(CALLS_PER_SAMPLE):
            np.multiply(x, y, out=z)

    return calls


def _worker(barrier, results, seconds: float, stream_elements: int) -> None:  # noqa: ANN001
    out = {}
    for name in KERNELS:
        run = _kernel(name, stream_elements)
        for _ in range(WARMUP_CALLS):
            run()
        barrier.wait()  # every process starts each kernel together
        samples, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
        out[name] = samples
        barrier.wait()  # and none starts the next while another still times this one
    results.put(out)


def fill(k: int, seconds: float, stream_elements: int) -> list[dict[str, list[float]]]:
    """Raw samples of every kernel from each of ``k`` processes run at once."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(barrier, results, seconds, stream_elements))
             for _ in range(k)]  # fmt: skip
    for proc in procs:
        proc.start()
    out = [results.get(timeout=120 + 10 * seconds) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    return out


def _levels(text: str | None, cores: int) -> list[int]:
    if text:
        return [int(v) for v in text.split(",")]
    levels = [1]
    while levels[-1] * 2 < cores:
        levels.append(levels[-1] * 2)
    return levels + ([cores] if cores > 1 else [])


def main() -> int:
    import numpy as np

    from microbench.machine import machine_metadata
    from microbench.reference import DEFAULT_LLC_BYTES, last_level_cache_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", help="process counts, e.g. 1,2,4 (default: powers of two "
                        "up to the cores, and the cores)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per kernel")
    parser.add_argument("--out", type=Path, help="JSON file for the raw samples")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    llc = last_level_cache_bytes() or DEFAULT_LLC_BYTES
    stream_elements = 2 * llc // 4 // 3  # three arrays: twice the cache per process
    levels = _levels(args.procs, cores)
    print(f"{cores} cores, last-level cache {llc >> 20} MiB; stream arrays "
          f"{3 * stream_elements * 4 >> 20} MiB per process")  # fmt: skip
    print(f"{'k':>3} " + " ".join(f"{n + ' ms':>10} {'x1':>6} {'slowest':>7}" for n in KERNELS))
    runs, base = [], {}
    for k in levels:
        samples = fill(k, args.seconds, stream_elements)
        medians = {n: [float(np.median(s[n])) for s in samples] for n in KERNELS}
        base = base or {n: float(np.median(m)) for n, m in medians.items()}
        cells = [f"{1e3 * np.median(m):10.3f} {np.median(m) / base[n]:6.2f} "
                 f"{max(m) / base[n]:7.2f}" for n, m in medians.items()]  # fmt: skip
        print(f"{k:>3} " + " ".join(cells), flush=True)
        runs.append({"procs": k, "samples_s": samples})
    if args.out:
        doc = {"benchmark": "node_fill", "kernels": list(KERNELS), "gemm_n": GEMM_N,
               "stream_elements": stream_elements, "calls_per_sample": CALLS_PER_SAMPLE,
               "warmup_calls": WARMUP_CALLS, "seconds": args.seconds, "runs": runs,
               "machine": machine_metadata()}  # fmt: skip
        args.out.write_text(json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
