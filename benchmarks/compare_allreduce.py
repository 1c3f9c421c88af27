"""Our Python Allreduce against a C benchmark of the same MPI library, timed the same way.

    python benchmarks/compare_allreduce.py [--ranks 2] [--runs 5] [--max 64MiB] [--off-cache 0]

Builds ``benchmarks/c_allreduce/allreduce.c`` with the ``mpicc`` beside this Python (the mpich
wheel's) into ``build/c_allreduce/``, as a program and as a shared library, then measures under
``mpiexec -n RANKS``, ``--runs`` times:

- separate launches: the C program, then this script's Python worker (mpi4py's buffer
  ``Allreduce``, out of place as the C program's, timed by :func:`microbench.sampling.time_loop`;
  microbench itself times it in place, :mod:`microbench.collectives`), alternating which goes
  first;
- same processes: one Python launch that takes C samples (the library, through ctypes, on the
  same numpy buffers) and Python samples alternately. On a shared virtual machine the speed of
  a launch varies by tens of percent from one launch to the next (where the host places the
  vCPUs, what else runs), which separate launches can only average away; here both sides see
  the same placement, and the ratio column is the median ratio of neighbouring samples, which
  slow drifts in the machine's load cancel out of.

Both sides use IMB's method: repetitions = min(1000, 40 MiB / size), one untimed warm-up loop of
a tenth of them, then per sample a barrier and the loop timed as a whole, the sample being the
max over ranks of the per-repetition average. A run reports the median of its samples per size;
the table gives the median over runs, the ratio Python / C, and the difference in microseconds:
what the Python layer (mpi4py's argument handling, the interpreter's loop) adds to each call.
Both sides ask for the same MPI thread level (``--thread-level``, default ``multiple``: mpi4py's
default, which microbench runs with; MPICH takes a lock in every call at that level).
``--off-cache BYTES`` rotates both sides through buffer copies spanning 2 x BYTES (IMB's
``-off_cache``; pass the last-level cache size).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "benchmarks" / "c_allreduce" / "allreduce.c"
BUILD = REPO / "build" / "c_allreduce"
MSGS_PER_SAMPLE = 1000
OVERALL_VOL_BYTES = 40 << 20
CACHE_LINE_BYTES = 64
TARGET_FROM_BYTES = 64 << 10  # the agreement target (10%) applies from here up
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def repetitions_for(nbytes: int) -> int:
    return max(1, min(MSGS_PER_SAMPLE, OVERALL_VOL_BYTES // nbytes))


def copies_for(nbytes: int, off_cache_bytes: int) -> tuple[int, int]:
    """(buffer copies, floats between copies), as the C program computes them."""
    stride_bytes = -(-nbytes // CACHE_LINE_BYTES) * CACHE_LINE_BYTES
    if not off_cache_bytes:
        return 1, stride_bytes // 4
    copies = -(-2 * off_cache_bytes // stride_bytes)
    return max(1, min(repetitions_for(nbytes), copies)), stride_bytes // 4


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        sys.exit(f"compare_allreduce: no {name} beside {sys.executable} or on PATH")
    return found


def build() -> tuple[Path, Path]:
    BUILD.mkdir(parents=True, exist_ok=True)
    program, library = BUILD / "allreduce", BUILD / "liballreduce.so"
    mpicc = tool("mpicc")
    subprocess.run([mpicc, "-O2", "-Wall", "-o", str(program), str(SOURCE)], check=True)
    subprocess.run(
        [mpicc, "-O2", "-Wall", "-DALLREDUCE_LIBRARY", "-shared", "-fPIC", "-o", str(library)]
        + [str(SOURCE)],
        check=True,
    )
    return program, library


# ---------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    """Under mpiexec: Python samples (and C samples through the library when ``--library``)."""
    import mpi4py
    import numpy as np

    mpi4py.rc.thread_level = args.thread_level
    from mpi4py import MPI

    sys.path.insert(0, str(REPO))
    from microbench.sampling import time_loop

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    c_sample = None
    if args.library:
        lib = ctypes.CDLL(args.library)
        lib.allreduce_sample_world.restype = ctypes.c_double
        lib.allreduce_sample_world.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_long] * 4
        c_sample = lib.allreduce_sample_world
    nbytes = args.min
    while nbytes <= args.max:
        reps = repetitions_for(nbytes)
        count = nbytes // 4
        copies, step = copies_for(nbytes, args.off_cache)
        send = np.full(copies * step, rank + 1, dtype=np.float32)
        recv = np.full(copies * step, -1.0, dtype=np.float32)
        calls = [
            functools.partial(
                comm.Allreduce, send[i * step :][:count], recv[i * step :][:count], MPI.SUM
            )
            for i in range(copies)
        ]
        py_samples: list[float] = []
        c_samples: list[float] = []
        c_args = (send.ctypes.data, recv.ctypes.data, count, reps, copies, step)
        time_loop(calls, max(1, reps // 10), comm)  # warm-up
        if c_sample is not None:
            c_sample(*c_args[:3], max(1, reps // 10), *c_args[4:])
        for i in range(args.samples):
            if c_sample is not None and i % 2 == 0:
                c_samples.append(c_sample(*c_args))
            py_samples.append(time_loop(calls, reps, comm))
            if c_sample is not None and i % 2 == 1:
                c_samples.append(c_sample(*c_args))
        if not np.all(recv[:count] == comm.Get_size() * (comm.Get_size() + 1) / 2):
            sys.exit(f"compare_allreduce: wrong Allreduce result at {nbytes} bytes")
        if rank == 0:
            line = f"{nbytes} {reps} {statistics.median(py_samples):.9e}"
            if c_samples:  # and the median ratio of neighbouring samples, which drift cancels in
                ratios = [p / c for p, c in zip(py_samples, c_samples, strict=True)]
                paired = statistics.median(ratios)
                line += f" {statistics.median(c_samples):.9e} {paired:.6f}"
            print(line, flush=True)
        nbytes *= 2


# ---------------------------------------------------------------------------- driver


def run_once(command: list[str]) -> dict[int, list[float]]:
    """``bytes -> [the other columns after reps]`` from one launch."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"compare_allreduce: {' '.join(command)} failed:\n{result.stderr}")
    columns = {}
    for line in result.stdout.splitlines():
        if line.strip() and not line.startswith("#"):
            nbytes, _, *values = line.split()
            columns[int(nbytes)] = [float(v) for v in values]
    return columns


def format_bytes(n: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n // factor} {unit}"
    return f"{n} B"


def driver(args: argparse.Namespace) -> None:
    program, library = build()
    mpiexec = [tool("mpiexec"), "-n", str(args.ranks)]
    common = ["--min", str(args.min), "--max", str(args.max), "--samples", str(args.samples)]
    common += ["--off-cache", str(args.off_cache), "--thread-level", args.thread_level]
    worker_command = [*mpiexec, sys.executable, str(Path(__file__).resolve()), "--worker"]
    c_command = [*mpiexec, str(program), *common]
    py_command = [*worker_command, *common]
    both_command = [*worker_command, *common, "--library", str(library)]
    separate_c, separate_py, same_c, same_py, same_ratio = [], [], [], [], []
    for run in range(args.runs):  # alternate which side goes first, against drift
        order = (c_command, py_command) if run % 2 == 0 else (py_command, c_command)
        for command in order:
            columns = run_once(command)
            target = separate_c if command is c_command else separate_py
            target.append({n: values[0] for n, values in columns.items()})
        columns = run_once(both_command)
        same_py.append({n: values[0] for n, values in columns.items()})
        same_c.append({n: values[1] for n, values in columns.items()})
        same_ratio.append({n: values[2] for n, values in columns.items()})
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)

    print(
        f"Allreduce float32 SUM, {args.ranks} ranks, MPI_THREAD_{args.thread_level.upper()}, "
        f"IMB method; per size the median over {args.runs} runs of the median of "
        f"{args.samples} samples; off_cache {args.off_cache} bytes. Times in microseconds."
    )
    print(f"{'':>14} {'separate launches':^26}   {'same processes, alternating':^34}")
    header = f"{'bytes':>8} {'reps':>5} {'C':>9} {'Python':>9} {'ratio':>6}   "
    print(header + f"{'C':>9} {'Python':>9} {'ratio':>6} {'Py - C':>8}")
    worst = {"separate": 0.0, "same": 0.0}
    for nbytes in sorted(separate_c[0]):
        c1 = statistics.median(r[nbytes] for r in separate_c)
        py1 = statistics.median(r[nbytes] for r in separate_py)
        c2 = statistics.median(r[nbytes] for r in same_c)
        py2 = statistics.median(r[nbytes] for r in same_py)
        paired = statistics.median(r[nbytes] for r in same_ratio)
        if nbytes >= TARGET_FROM_BYTES:
            worst["separate"] = max(worst["separate"], abs(py1 / c1 - 1.0))
            worst["same"] = max(worst["same"], abs(paired - 1.0))
        print(
            f"{format_bytes(nbytes):>8} {repetitions_for(nbytes):>5} {c1 * 1e6:>9.2f} "
            f"{py1 * 1e6:>9.2f} {py1 / c1:>6.3f}   {c2 * 1e6:>9.2f} {py2 * 1e6:>9.2f} "
            f"{paired:>6.3f} {(py2 - c2) * 1e6:>+8.2f}"
        )
    print(
        f"largest |ratio - 1| from {format_bytes(TARGET_FROM_BYTES)} up: "
        f"separate launches {worst['separate']:.1%}, same processes {worst['same']:.1%}"
    )


def parse_size(text: str) -> int:
    lowered = text.strip().lower()
    for unit, factor in (("kib", 1 << 10), ("mib", 1 << 20)):
        if lowered.endswith(unit):
            return int(lowered[: -len(unit)]) * factor
    return int(lowered.removesuffix("b"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=11, help="samples per size and run")
    parser.add_argument("--min", type=parse_size, default=8, help="smallest size (bytes)")
    parser.add_argument("--max", type=parse_size, default=64 << 20, help="largest size")
    parser.add_argument("--off-cache", type=parse_size, default=0, metavar="BYTES")
    parser.add_argument(
        "--thread-level",
        choices=THREAD_LEVELS,
        default="multiple",
        help="MPI thread level on both sides (default multiple: mpi4py's default)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
