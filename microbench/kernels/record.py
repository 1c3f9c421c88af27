"""Catch the kernel calls of a real training step, to time them outside it.

:class:`CallRecorder` stands in, for the length of a ``with`` block, for the numpy and the
numba loops that :mod:`microbench.kernels.cpu` calls: every GEMM (``np.matmul``), copy
(``np.copyto``) and loop a step runs goes through it, the calls
:func:`microbench.kernels.calls.step_calls` lists. It can time each call where it happens
(``times``) and keep each call with its very arrays (``calls``), so that the same calls can be
timed again alone (:func:`time_alone`): each call repeated back to back, its operands left in
cache by itself, which is how the kernel tables time a kernel. A whole step against its calls
alone is what a step costs beyond its kernels: the Python between them, and the kernels'
slowdown inside a sequence that leaves other data in the caches
(:mod:`microbench.kernelbench`, "step").

The wrapper's own cost (well under a microsecond) is in every caught call alike; a step timed
for its wall clock runs outside the ``with`` block, unwrapped.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from microbench.kernels import cpu, loops
from microbench.threads import let_blas_threads_sleep

__all__ = ["CallRecorder", "kernels_replaced", "record_calls", "time_alone"]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


@contextmanager
def kernels_replaced(replace: Callable[[str, Callable[..., Any]], Callable[..., Any]]):
    """For the ``with`` block, :mod:`microbench.kernels.cpu` calls ``replace(name, fn)`` in
    place of each kernel ``fn`` it reaches: numpy's ``matmul`` and ``copyto`` and every loop
    of :mod:`microbench.kernels.loops`, by name."""
    fake_np = types.ModuleType("numpy")
    fake_np.__dict__.update(np.__dict__)
    fake_np.matmul = replace("matmul", np.matmul)  # type: ignore[attr-defined]
    fake_np.copyto = replace("copyto", np.copyto)  # type: ignore[attr-defined]
    names = [k for k in dir(loops) if not k.startswith("_") and callable(getattr(loops, k))]
    fake_loops = types.SimpleNamespace(**{k: replace(k, getattr(loops, k)) for k in names})
    saved = cpu.np, cpu.loops
    cpu.np, cpu.loops = fake_np, fake_loops  # type: ignore[assignment]
    try:
        yield
    finally:
        cpu.np, cpu.loops = saved


class CallRecorder:
    """Wraps :mod:`microbench.kernels.cpu`'s GEMMs and loops while active (module docstring):
    ``times`` gets each call's seconds; with ``keep`` set, ``calls`` gets (function, args,
    kwargs) of each."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.calls: list[Call] = []
        self.keep = False
        self._active: ExitStack | None = None

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.times.append(time.perf_counter() - start)
            if self.keep:
                self.calls.append((fn, args, kwargs))
            return out

        return timed

    def __enter__(self) -> CallRecorder:
        self._active = ExitStack()
        self._active.enter_context(kernels_replaced(lambda name, fn: self._wrap(fn)))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._active is not None
        self._active.close()
        self._active = None


def record_calls(step: Callable[[], object]) -> list[Call]:
    """The kernel calls of one run of ``step``, with their arrays (``step`` runs once)."""
    with CallRecorder() as recorder:
        recorder.keep = True
        step()
    return recorder.calls


def time_alone(calls: list[Call], repeats: int = 3) -> float:
    """Seconds of ``calls`` each timed alone as the kernel tables time it: the sum over calls
    of the median of ``repeats`` runs of it back to back (the first run finds what the call
    before it left in the caches; the median, mostly its own operands), each after the gap in
    which idle BLAS threads fall asleep (:func:`microbench.threads.let_blas_threads_sleep`)."""
    total = 0.0
    for fn, args, kwargs in calls:
        times = []
        for _ in range(repeats):
            let_blas_threads_sleep()
            start = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - start)
        total += statistics.median(times)
    return total
