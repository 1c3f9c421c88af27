"""Finding a GPU through CuPy, describing it, and timing work on it with CUDA events.

CuPy is optional: nothing here imports it at module level, and :func:`find_gpu` answers "no
GPU" with the reason (CuPy missing, no driver, no device) instead of raising, so that a suite
run on a CPU-only machine skips its GPU parts with one line. A command that was explicitly asked
for a GPU turns the reason into a usage error itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Gpu", "event_timed", "find_gpu"]


@dataclass(frozen=True)
class Gpu:
    """The GPU in use: the ``cupy`` module, the device index and what to record about it."""

    cupy: Any
    index: int
    name: str
    metadata: dict[str, Any]

    def synchronize(self) -> None:
        """Wait for every piece of work queued on the current stream."""
        self.cupy.cuda.get_current_stream().synchronize()

    def free_memory_bytes(self) -> int:
        free, _total = self.cupy.cuda.runtime.memGetInfo()
        return int(free)

    def l2_cache_bytes(self) -> int | None:
        try:
            return int(self.cupy.cuda.Device(self.index).attributes["L2CacheSize"])
        except Exception:  # an old CuPy without the attribute, an odd device
            return None

    def release_pools(self) -> None:
        """Give cached device and pinned blocks back, so the next point starts from free memory."""
        self.cupy.get_default_memory_pool().free_all_blocks()
        self.cupy.get_default_pinned_memory_pool().free_all_blocks()


def find_gpu(index: int = 0) -> tuple[Gpu | None, str]:
    """``(Gpu, "")`` for device ``index`` made current, or ``(None, why there is none)``."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy whose CUDA libraries fail to load
        if isinstance(exc, ImportError):
            return None, "CuPy is not installed"
        return None, f"CuPy does not load ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, or a broken one: CuPy raises its own types
        return None, f"no usable CUDA driver ({type(exc).__name__})"
    if count < 1:
        return None, "no CUDA device found"
    if not 0 <= index < count:
        return None, f"GPU {index} asked for, but only {count} present"
    try:
        cupy.cuda.Device(index).use()
        props = cupy.cuda.runtime.getDeviceProperties(index)
        raw = props["name"]
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        metadata = {
            "cupy_version": cupy.__version__,
            "device_index": index,
            "device_name": name,
            "compute_capability": f"{props['major']}.{props['minor']}",
            "memory_total_bytes": int(props["totalGlobalMem"]),
            "cuda_runtime_version": int(cupy.cuda.runtime.runtimeGetVersion()),
            "cuda_driver_version": int(cupy.cuda.runtime.driverGetVersion()),
        }
    except Exception as exc:
        return None, f"GPU {index} is not usable ({type(exc).__name__}: {exc})"
    return Gpu(cupy=cupy, index=index, name=name, metadata=metadata), ""


def event_timed(gpu: Gpu, fn: Callable[[], object]) -> Callable[[], float]:
    """A repetition for :func:`microbench.sampling.measure`: ``fn()`` between two CUDA events
    on the current stream; returns the seconds between them.

    The end event is waited for before returning, so a repetition starts on an idle stream and
    the interval also covers any host-side gap between the kernels ``fn`` launches (what a
    training step sees when Python launches small kernels).
    """
    cupy = gpu.cupy
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def repetition() -> float:
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end)) / 1e3

    return repetition
