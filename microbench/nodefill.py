"""Node fill: one core's work timed while k processes of the node run the same work at once.

Ranks on one node share its memory bandwidth, its last-level cache, its power budget (the
all-core clock is below the one-core clock) and, on a virtual machine, physical cores behind
the vCPUs. A calibration at 1-2 ranks on a many-core node sees little of this, yet a
prediction at every core of the node carries all of it (evidence: docs/evidence.md,
"Co-location beyond the calibrated ranks"). This measures the machine's side alone, with no
MPI and no communication: k independent processes, one thread each, start each kernel
together at a barrier and time it for a fixed while, for k = 1, 2, 4, ... up to the cores
(:func:`levels`). Three kernels span what a training step is made of:

* ``gemm``: a :data:`GEMM_N`^3 float32 GEMM, bound by the core (its operands in its own caches);
* ``stream``: ``a = b + c`` over float32 arrays twice the last-level cache per process, bound
  by the memory;
* ``calls``: :data:`CALLS_PER_SAMPLE` NumPy calls on :data:`CALLS_ELEMENTS` elements, bound by
  the per-call overhead: the clock, the core's own caches, and whatever time the operating
  system takes from the core.

Which cores k processes land on is the scheduler's (and the hypervisor's) choice, and two of
them sharing a physical core is a different machine from two that do not; each level is
therefore run in several launches, fresh processes each, and a fit takes the median over
launches (:mod:`calibration.nodefill`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .threads import thread_env

__all__ = ["CALLS_ELEMENTS", "CALLS_PER_SAMPLE", "GEMM_N", "KERNELS", "NodeFillError", "fill",
           "levels", "stream_elements"]  # fmt: skip

KERNELS = ("gemm", "stream", "calls")
GEMM_N = 512
CALLS_PER_SAMPLE = 200
CALLS_ELEMENTS = 256
WARMUP_CALLS = 3
_REPORT_GRACE_S = 60.0  # beyond the timed seconds, for a process to start and report


class NodeFillError(RuntimeError):
    """The processes of one level could not be started or did not all report."""


def levels(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, and ``cores``."""
    out = [1]
    while out[-1] * 2 < cores:
        out.append(out[-1] * 2)
    return out + ([cores] if cores > 1 else [])


def stream_elements(cache_bytes: int, memory_bytes: int | None, processes: int) -> int:
    """Float32 elements of each of the stream's three arrays: twice ``cache_bytes`` per process
    in all, at most an eighth of ``memory_bytes`` over every process (``processes``)."""
    total = 2 * cache_bytes
    if memory_bytes:
        total = min(total, memory_bytes // (8 * max(processes, 1)))
    return max(total // (3 * 4), 1024)


def _kernel(name: str, elements: int) -> Callable[[], Any]:
    """A no-argument callable running one call of kernel ``name``."""
    import numpy as np

    rng = np.random.default_rng(os.getpid())
    if name == "gemm":
        a, b = (rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32) for _ in range(2))
        return lambda: a @ b
    if name == "stream":
        a, b, c = (np.ones(elements, dtype=np.float32) for _ in range(3))
        return lambda: np.add(b, c, out=a)
    x, y, z = (rng.standard_normal(CALLS_ELEMENTS, dtype=np.float32) for _ in range(3))

    def calls() -> None:
        for _ in range(CALLS_PER_SAMPLE):
            np.multiply(x, y, out=z)

    return calls


def _worker(barrier: Any, results: Any, seconds: float, elements: int, parent: int) -> None:
    # A terminal's Ctrl-C reaches the whole process group: the parent stops these (fill's
    # finally), and a KeyboardInterrupt here would print one child traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        results.put(_timed_kernels(barrier, seconds, elements, parent))
    except _Orphaned:
        pass  # nobody is left to report to
    except threading.BrokenBarrierError:  # another process failed (it reports why) or hung
        results.put({"broken": True})
    except Exception as exc:  # reported by the parent in one line, not as a child's traceback
        barrier.abort()  # the others stop waiting for this one
        results.put({"error": f"{type(exc).__name__}: {exc}"})


class _Orphaned(Exception):
    """The parent is gone (killed outright, so its finally never ran): stop measuring."""


def _timed_kernels(
    barrier: Any, seconds: float, elements: int, parent: int
) -> dict[str, list[float]]:
    out = {}
    wait_s = _REPORT_GRACE_S + len(KERNELS) * seconds  # a sibling killed: stop waiting for it
    for name in KERNELS:
        run = _kernel(name, elements)
        for _ in range(WARMUP_CALLS):
            run()
        barrier.wait(wait_s)  # every process starts each kernel together
        samples: list[float] = []
        end = time.perf_counter() + seconds
        while not samples or time.perf_counter() < end:  # at least one, however short
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
            if os.getppid() != parent:
                raise _Orphaned
        out[name] = samples
        barrier.wait(wait_s)  # and none starts the next while another still times this one
    return out


@contextmanager
def _one_thread_children() -> Iterator[None]:
    """Spawned processes read these at start: one BLAS, OpenMP and numba thread each."""
    one = thread_env(1)
    saved = {name: os.environ.get(name) for name in one}
    os.environ.update(one)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def fill(k: int, seconds: float, elements: int) -> list[dict[str, list[float]]]:
    """Every kernel's raw samples (seconds per call) from each of ``k`` processes run at once,
    ``seconds`` of timed calls per kernel after :data:`WARMUP_CALLS` untimed ones."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    out: list[dict[str, list[float]]] = []
    try:
        barrier, results = ctx.Barrier(k), ctx.Queue()
        with _one_thread_children():
            for _ in range(k):
                procs.append(ctx.Process(target=_worker, daemon=True,
                                         args=(barrier, results, seconds, elements,
                                               os.getpid())))  # fmt: skip
                procs[-1].start()
        deadline = time.monotonic() + _REPORT_GRACE_S + len(KERNELS) * seconds
        broken = 0  # processes whose barrier broke: one that failed reports why, else all
        while len(out) < k:
            try:
                item = results.get(timeout=0.5)
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise NodeFillError(f"a process exited with status {failed[0]}") from None
                if time.monotonic() > deadline:
                    raise NodeFillError("a process did not report in time") from None
                continue
            if "error" in item:
                raise NodeFillError(f"a process failed: {item['error']}")
            if "broken" in item:
                broken += 1
                if len(out) + broken == k:  # no process failed: they timed out waiting
                    raise NodeFillError("the processes stopped waiting for each other")
                continue
            out.append(item)
    except OSError as exc:  # no semaphores or processes to be had here
        raise NodeFillError(f"cannot start {k} processes ({exc})") from None
    finally:
        _stop(procs, finished=len(out) == k)
    return out


def _stop(procs: list[Any], finished: bool) -> None:
    """Reap ``procs``: those that reported exit by themselves; on any other way out (a failed
    process, a signal, Ctrl-C) the rest are stopped at once, not waited for one by one."""
    if not finished:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
