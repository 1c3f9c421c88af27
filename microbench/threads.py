"""Explicit per-process thread counts for BLAS and numba.

On a small shared machine, more ranks x threads than cores collapses throughput (OpenBLAS
threads busy-wait), so every process sets its thread count on purpose instead of inheriting
"all cores". Child processes get it through the environment before numpy loads
(:func:`thread_env`); a running process changes it with :func:`set_threads`.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import time
import warnings

# Environment variables read by the BLAS libraries numpy may be linked against, by OpenMP
# runtimes and by numba, at import time.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMBA_NUM_THREADS",
)

# OpenBLAS's idle threads spin for ~0.1 s after every GEMM. Between GEMMs a training step runs
# numba loops on the same cores, and spinning BLAS threads steal them (measured here: the CNN at
# 2 threads on 2 cores ran 1.08x PyTorch's speed with the default, 1.31x with this). Only the
# environment, before numpy loads, sets it; waking sleeping threads costs microseconds.
BLAS_IDLE_ENV = {"OPENBLAS_THREAD_TIMEOUT": "4"}
# With that, a GEMM that OpenBLAS runs on several threads pays their wake-up (25-35 us on the
# 2-core VM) whenever anything at all ran before it (measured: the same GEMM after a 5 us gap
# as after 1 ms); back to back it does not. In a step every GEMM follows other work, so a GEMM
# is timed as a step calls it: after this gap (:func:`let_blas_threads_sleep`).
BLAS_SLEEP_GAP_S = 20e-6

_blas_limiters: list = []  # keep the threadpoolctl limits alive for the life of the process


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


NUMBA_THREADING_LAYERS = ("default", "safe", "forksafe", "threadsafe", "tbb", "omp", "workqueue")
# What OpenMP runtimes accept for OMP_WAIT_POLICY (any case, blanks around it allowed).
OMP_WAIT_POLICIES = ("active", "passive")


def thread_environment_problem() -> str | None:
    """What is wrong with the thread settings in this process's environment, or None.

    The libraries read them when they load, deep inside a run: numba refuses a count of 0 or
    an unknown threading layer with a traceback there, and OpenMP runtimes print a warning and
    go on with their default: for an unknown ``OMP_WAIT_POLICY`` that is threads that spin
    between loops, the slowdown :func:`prepare_numba_threads` avoids, in a run that looks
    normal but for GNU OpenMP's two-line complaint. A count (OpenMP's may list one per nesting
    level, "4,2") must be positive integers; an empty value counts as unset."""
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name, "").strip()
        levels = value.split(",") if name == "OMP_NUM_THREADS" else [value]
        if value and not all(v.strip().isdecimal() and int(v) > 0 for v in levels):
            return f"{name}={value!r} is not a positive thread count; set a number or unset it"
    layer = os.environ.get("NUMBA_THREADING_LAYER", "").strip()
    if layer and layer not in NUMBA_THREADING_LAYERS:
        known = ", ".join(NUMBA_THREADING_LAYERS)
        return f"NUMBA_THREADING_LAYER={layer!r} is unknown to numba ({known}); unset it"
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip()
    if policy and policy.lower() not in OMP_WAIT_POLICIES:
        return (
            f"OMP_WAIT_POLICY={policy!r} is neither ACTIVE nor PASSIVE (OpenMP would ignore it "
            "and let idle threads spin); set PASSIVE, or unset it"
        )
    return None


def unset_empty_thread_settings() -> None:
    """Remove the thread settings set to nothing (``OMP_NUM_THREADS=``) from this process's
    environment, before any library reads them. They count as unset here
    (:func:`thread_environment_problem`), but GNU OpenMP prints "Invalid value for environment
    variable OMP_NUM_THREADS" when it loads and numba warns that it cannot parse one, in this
    process and in every child that inherits it."""
    for name in (*THREAD_ENV_VARS, "NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY"):
        if name in os.environ and not os.environ[name].strip():
            del os.environ[name]


def thread_env(threads: int) -> dict[str, str]:
    """Environment entries that pin a child process to ``threads`` threads."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return {**{name: str(threads) for name in THREAD_ENV_VARS}, **BLAS_IDLE_ENV}


def quiet_idle_blas_threads() -> None:
    """Make BLAS threads sleep soon after a GEMM, unless the user chose otherwise.

    Call before numpy is imported (an entry point's first lines); later it changes nothing.
    """
    for name, value in BLAS_IDLE_ENV.items():
        os.environ.setdefault(name, value)


def let_blas_threads_sleep(gap_s: float = BLAS_SLEEP_GAP_S) -> None:
    """Busy-wait ``gap_s`` on this core, idle BLAS threads falling asleep meanwhile (busy,
    not ``time.sleep``, whose wake-up takes longer than the gap)."""
    end = time.perf_counter() + gap_s
    while time.perf_counter() < end:
        pass


def size_numba_pool(threads: int) -> None:
    """Let numba run ``threads`` threads in this process even above the cores, where a run
    asks for that on purpose: numba sizes its pool once, from ``NUMBA_NUM_THREADS`` (default:
    the cores), when it loads, so call this before; afterwards it changes nothing. A value the
    user set is kept."""
    if "numba" not in sys.modules and threads > available_cores():
        os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))


def _openmp_loaded() -> bool:
    """Whether a GNU OpenMP runtime is already in this process (Linux; False elsewhere)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


def prepare_numba_threads() -> None:
    """Make numba's idle worker threads sleep rather than spin, before numba starts them.

    A training step alternates GEMMs (OpenBLAS's pthreads) with numba loops (numba's pool);
    with as many threads as cores, a pool that busy-waits while idle steals the cores the
    other one needs. So numba uses the GNU OpenMP layer with ``OMP_WAIT_POLICY=PASSIVE`` (by
    default its threads spin for milliseconds after each loop, which can make a small
    network's 2-thread step an order of magnitude slower; evidence: docs/evidence.md,
    "Compute"). OpenMP reads that when it loads, when numba starts its pool (its first
    parallel loop, or :func:`set_threads`); if something else (torch, say) loaded it before,
    with its default policy, numba's workqueue layer (whose threads sleep) is used instead.
    An explicit ``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY`` or
    ``OMP_WAIT_POLICY`` wins. Once numba's pool runs this changes nothing, so it is called
    both where the CPU kernels load and before :func:`set_threads` starts the pool."""
    if "NUMBA_THREADING_LAYER" not in os.environ:
        try:
            import numba
        except ImportError:
            return
        numba.config.THREADING_LAYER = "default"  # the first available of the priority list
        if "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
            passive = "OMP_WAIT_POLICY" in os.environ or not _openmp_loaded()
            first = ["omp", "workqueue"] if passive else ["workqueue", "omp"]
            numba.config.THREADING_LAYER_PRIORITY = [*first, "tbb"]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def set_threads(threads: int) -> None:
    """Use ``threads`` threads in BLAS and numba from now on, in this process. The BLAS that
    numba's compiled ``np.dot`` calls (scipy's, inside numba's own threads: attention's heads)
    keeps one thread, so that its threads do not nest inside numba's."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    prepare_numba_threads()  # before numba.set_num_threads below starts numba's pool
    from threadpoolctl import ThreadpoolController

    _blas_limiters.clear()
    inner_dir = _numbas_blas_dir()
    controller = ThreadpoolController()
    _blas_limiters.append(controller.limit(limits=threads))
    inner = [
        lib.filepath
        for lib in controller.lib_controllers
        if inner_dir and os.path.realpath(lib.filepath).startswith(inner_dir)
    ]
    if inner:
        _blas_limiters.append(controller.select(filepath=inner).limit(limits=1))
    try:
        import numba
    except ImportError:
        return
    # numba's pool is sized once, at first use, from NUMBA_NUM_THREADS (default: all cores);
    # asking for more than it holds is an error, so oversubscription stops at the pool size.
    pool = numba.config.NUMBA_NUM_THREADS
    if threads > pool:
        warnings.warn(
            f"numba's thread pool holds {pool} threads; using {pool}, not {threads} "
            "(set NUMBA_NUM_THREADS before the process starts to allow more)",
            RuntimeWarning,
            stacklevel=2,
        )
    numba.set_num_threads(min(threads, pool))


def _numbas_blas_dir() -> str:
    """The folder of the BLAS library that numba's ``np.dot`` binds to, the one scipy ships
    (``scipy.linalg.cython_blas`` links it), with that library loaded here so that the limits
    reach it. Loaded on its own (milliseconds, where importing ``scipy.linalg`` takes 0.2 s of
    every training launch); when numba later imports ``cython_blas``, the loader finds the
    library already in the process and uses it. "" without scipy."""
    spec = importlib.util.find_spec("scipy")
    if spec is None or spec.origin is None:
        return ""
    folder = os.path.join(os.path.dirname(spec.origin), os.pardir, "scipy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "*openblas*.so*"))):
        ctypes.CDLL(path)
    return os.path.realpath(folder)


# How many threads per core a run on this machine may ask for before it is refused: far past
# any useful oversubscription (which is warned about), short of starting so many processes or
# threads that the machine stops (a typo with extra zeros).
MAX_THREADS_PER_CORE = 64


def too_many_threads(
    ranks: int, threads: int, cores: int | None = None, fix: str = "use fewer --procs or --threads"
) -> str | None:
    """Why ``ranks`` x ``threads`` on this machine is refused (one line ending in ``fix``, the
    flags of the command that asked), or None."""
    cores = available_cores() if cores is None else cores
    most = MAX_THREADS_PER_CORE * cores
    if ranks * threads <= most:
        return None
    return (
        f"{ranks} ranks x {threads} threads = {ranks * threads:,} threads is more than this "
        f"machine can run ({MAX_THREADS_PER_CORE} per core, {most:,} on its {cores} cores); "
        f"{fix}"
    )


def oversubscription(ranks_per_node: int, threads: int, cores: int | None = None) -> str | None:
    """A one-line warning when ranks x threads exceeds the cores, else None."""
    cores = available_cores() if cores is None else cores
    if ranks_per_node * threads <= cores:
        return None
    return (
        f"{ranks_per_node} ranks x {threads} threads = {ranks_per_node * threads} threads on "
        f"{cores} cores: oversubscribed, expect throughput to collapse (BLAS threads busy-wait)"
    )
