"""A numpy-backed stand-in for the few CuPy calls the GPU benchmarks make.

It lets the GPU code paths (compute on ``xp=cupy``, triad, GEMM, host<->device copies) run on a
machine without a GPU, so that their control flow and their records are tested. It says nothing
about CUDA itself: events read ``perf_counter``, "device" arrays are numpy arrays, copies are
``ctypes.memmove``. Install it with :func:`install` (a pytest ``monkeypatch``).
"""

from __future__ import annotations

import ctypes
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

FREE_BYTES = 96 << 20  # small, so that the triad's arrays stay small


class DeviceArray(np.ndarray):
    """An ndarray with CuPy's ``.data.ptr``."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """CuPy's host-to-device copy (asynchronous on ``stream``; done at once here)."""
        if stream is not None:
            stream.copies += 1
        self[...] = arr


def _device(a: np.ndarray) -> DeviceArray:
    return np.asarray(a).view(DeviceArray)


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


class _Stream:
    """A CUDA stream: counts the copies issued on it and the waits for it."""

    ptr = 0

    def __init__(self, non_blocking: bool = False) -> None:
        self.copies = self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1


class _Device:
    attributes = {"L2CacheSize": 1 << 20}

    def __init__(self, index: int = 0) -> None:
        self.index = index

    def use(self) -> None:
        pass


class _Pool:
    def free_all_blocks(self) -> None:
        pass


def _memcpy(dst: int, src: int, size: int, kind: int, stream: int = 0) -> None:
    ctypes.memmove(dst, src, size)


def _elementwise_kernel(in_params: str, out_params: str, body: str, name: str) -> Any:
    assert body == "a = b + s * c", body

    def kernel(b: np.ndarray, c: np.ndarray, s: float, a: np.ndarray) -> None:
        np.add(b, s * c, out=a)

    return kernel


def make_module() -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "0.0-fake"
    for name in ("float32", "float64", "int32", "int64", "uint8", "matmul", "asarray"):
        setattr(cupy, name, getattr(np, name))
    cupy.__getattr__ = lambda name: getattr(np, name)  # everything else as numpy has it
    cupy.empty = lambda *a, **k: _device(np.empty(*a, **k))
    cupy.zeros = lambda *a, **k: _device(np.zeros(*a, **k))
    cupy.full = lambda *a, **k: _device(np.full(*a, **k))
    cupy.asnumpy = np.asarray
    cupy.ElementwiseKernel = _elementwise_kernel
    cupy.get_default_memory_pool = _Pool
    cupy.get_default_pinned_memory_pool = _Pool
    stream = _Stream()
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {
            "name": b"Fake GPU",
            "major": 9,
            "minor": 0,
            "totalGlobalMem": 1 << 30,
        },
        runtimeGetVersion=lambda: 12000,
        driverGetVersion=lambda: 12000,
        memGetInfo=lambda: (FREE_BYTES, 1 << 30),
        memcpy=_memcpy,
        memcpyAsync=_memcpy,
        memcpyHostToDevice=1,
        memcpyDeviceToHost=2,
    )
    cupy.cuda = types.SimpleNamespace(
        Event=_Event,
        Stream=_Stream,
        Device=_Device,
        runtime=runtime,
        get_current_stream=lambda: stream,
        get_elapsed_time=lambda start, end: (end.t - start.t) * 1e3,
    )
    return cupy


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the fake ``cupy`` and ``cupyx`` into ``sys.modules`` for the test."""
    cupy = make_module()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", make_cupyx())
    return cupy


_SHIM = """# made by tests/fake_cupy.py: a process that imports {name} gets the stand-in
import sys

sys.path.insert(0, {repo!r})
from tests import fake_cupy

sys.modules[__name__] = fake_cupy.{maker}()
"""


def make_cupyx() -> types.ModuleType:
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype=float: np.empty(shape, dtype=dtype)
    return cupyx


def write_importable(directory: Path) -> Path:
    """``cupy.py`` and ``cupyx.py`` in ``directory`` that load the stand-in, for processes the
    test starts (put ``directory`` first on their PYTHONPATH): the directory."""
    repo = str(Path(__file__).resolve().parent.parent)
    directory.mkdir(parents=True, exist_ok=True)
    for name, maker in (("cupy", "make_module"), ("cupyx", "make_cupyx")):
        (directory / f"{name}.py").write_text(_SHIM.format(name=name, repo=repo, maker=maker))
    return directory
