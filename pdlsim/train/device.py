"""Where the arrays live: numpy on the CPU, CuPy on an NVIDIA GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from microbench.errors import UserError


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "gpu"
    xp: Any  # the array module: numpy or cupy
    name: str
    synchronize: Callable[[], None]  # waits for queued device work, so timers see it
    kernel_backend: str = "auto"  # microbench.kernels backend; "array" runs the GPU kernels

    def to_device(self, host: np.ndarray, staging: np.ndarray | None = None) -> Any:
        """Copy a host array to the device (through ``staging``, page-locked, if given)."""
        if self.kind == "cpu":
            return host
        if staging is not None:
            staging[...] = host
            host = staging
        return self.xp.asarray(host)


def _no_sync() -> None:
    return None


def cpu_device() -> Device:
    return Device(kind="cpu", xp=np, name="cpu", synchronize=_no_sync)


def gpu_device(rank_on_node: int = 0) -> Device:
    """The GPU this rank uses (one rank per GPU, round robin on the node); UserError if none."""
    try:
        import cupy
    except ImportError:
        raise UserError(
            "--device gpu needs CuPy and an NVIDIA GPU, but CuPy is not installed "
            "(pip install 'pdlsim[gpu]' on a machine with a GPU, or use --device cpu)"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken: CuPy raises its own types
        raise UserError(
            f"--device gpu: no usable GPU ({type(exc).__name__}: {exc}); use --device cpu"
        ) from None
    if count < 1:
        raise UserError("--device gpu: no GPU found on this machine; use --device cpu")
    index = rank_on_node % count
    cupy.cuda.Device(index).use()
    props = cupy.cuda.runtime.getDeviceProperties(index)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def synchronize() -> None:
        cupy.cuda.get_current_stream().synchronize()

    return Device(kind="gpu", xp=cupy, name=f"gpu{index}:{name}", synchronize=synchronize)


def pinned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A page-locked host array (faster, asynchronous-capable host-to-device copies)."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)
