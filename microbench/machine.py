"""Machine metadata stamped into every records file.

A number without the machine it came from cannot be compared or trusted later, so every records
header carries :func:`machine_metadata`: CPU, cores, memory, numpy's BLAS and its threads, MPI
library and layout, GPUs and driver, package versions and the date.

Collecting it must never abort a benchmark run: each piece is gathered on its own and a piece
that cannot be found on an odd machine becomes ``None`` (JSON null). The shape of the dict is the
same on every machine, so loaded frames have the same ``machine.*`` columns everywhere.

mpi4py is touched only when a communicator is passed, or when ``mpi4py.MPI`` is already imported
and initialised: importing ``mpi4py.MPI`` initialises MPI, which a serial caller must not pay for
(and which can hang or abort outside a launcher on some clusters).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from .memory import cgroup_memory_limit_bytes, memory_total_bytes

T = TypeVar("T")

# Variables that decide how many threads BLAS, OpenMP and numba use; recorded when set.
_THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMBA_NUM_THREADS",
)
_NVIDIA_SMI_TIMEOUT_S = 5.0


def utc_now() -> str:
    """The current UTC time in ISO 8601 with a ``Z`` suffix, microsecond resolution."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _safe(fn: Callable[[], T]) -> T | None:
    """``fn()``, or ``None`` when it fails in any way: metadata must never abort a run."""
    try:
        return fn()
    except Exception:
        return None


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def _package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it (numba's import is slow)."""
    try:
        return metadata.version(name)
    except Exception:
        return None


def _cpu_model() -> str | None:
    try:
        for line in _read_text("/proc/cpuinfo").splitlines():
            key, _, value = line.partition(":")
            # x86 says "model name"; some ARM and POWER kernels say "Model", "cpu" or "Processor".
            if key.strip().lower() in ("model name", "model", "cpu", "processor") and value:
                value = value.strip()
                if value and not value.isdigit():
                    return value
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _physical_cores() -> int | None:
    """Distinct (package, core) pairs from sysfs, else /proc/cpuinfo; None if neither says."""
    pairs: set[tuple[str, str]] = set()
    for topo in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            package = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            continue
        pairs.add((package, core))
    if pairs:
        return len(pairs)
    package = core = None
    for line in _read_text("/proc/cpuinfo").splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            package = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key and core is not None:  # blank line ends one logical CPU's block
            pairs.add((package or "0", core))
            package = core = None
    return len(pairs) or None


def _cores_available() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def _cgroup_cpu_quota_cores() -> float | None:
    """CPU limit of this container (cgroup v2 ``cpu.max``) in cores; None when unlimited."""
    quota, period = _read_text("/sys/fs/cgroup/cpu.max").split()
    return None if quota == "max" else int(quota) / int(period)


def gpu_name(machine: Mapping[str, Any]) -> str | None:
    """The name the driver gave the first GPU of ``machine`` (metadata as
    :func:`machine_metadata` records it), or None: a CPU machine, or metadata that does not
    say."""
    gpus = machine.get("gpus")
    first = gpus[0] if isinstance(gpus, list) and gpus else None
    name = first.get("name") if isinstance(first, Mapping) else None
    return name if isinstance(name, str) and name.strip() else None


def _blas() -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    """numpy's BLAS (library, version, threads) and every thread pool loaded in the process.

    Other packages (scipy, torch) may load a second BLAS; numpy's is the one whose file lies in
    numpy's own directory (``numpy.libs`` for wheels), else the only BLAS loaded, else the first.
    """
    import numpy as np

    try:
        from threadpoolctl import threadpool_info

        pools = [{k: v for k, v in p.items() if _is_plain(v)} for p in threadpool_info()]
    except Exception:
        pools = None
    build = _safe(lambda: np.show_config(mode="dicts")["Build Dependencies"]["blas"])
    blas_pools = [p for p in pools or [] if p.get("user_api") == "blas"]
    numpy_dir = str(Path(np.__file__).parent)
    own = [p for p in blas_pools if str(p.get("filepath", "")).startswith(numpy_dir)]
    chosen = (own or blas_pools or [None])[0]
    if chosen is None and build is None:
        return None, pools
    chosen = chosen or {}
    blas = {
        "name": chosen.get("internal_api"),
        "version": chosen.get("version"),
        "num_threads": chosen.get("num_threads"),
        "threading_layer": chosen.get("threading_layer"),
        "architecture": chosen.get("architecture"),
        "filepath": chosen.get("filepath"),
        "build_name": build.get("name") if isinstance(build, dict) else None,
        "build_version": build.get("version") if isinstance(build, dict) else None,
    }
    return blas, pools


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _gpus() -> list[dict[str, Any]] | None:
    """NVIDIA GPUs from nvidia-smi: [] when the tool is absent, None when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=index,name,memory.total,driver_version"
    try:
        out = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        index, name, memory_mib, driver = fields
        gpus.append(
            {
                "index": int(index) if index.isdecimal() else None,
                "name": name,
                "memory_total_bytes": int(memory_mib) * 2**20 if memory_mib.isdecimal() else None,
                "driver_version": driver,
            }
        )
    return gpus


def _first_line(text: str) -> str:
    """First non-blank line with runs of blanks collapsed ("MPICH Version:      4.2" -> ...)."""
    return " ".join(text.strip().splitlines()[0].split())


def _mpi(comm: Any) -> dict[str, Any]:
    """MPI library, standard and layout. Collective over ``comm`` when one is given."""
    info: dict[str, Any] = {
        "library_version": None,
        "standard_version": None,
        "mpi4py_version": _package_version("mpi4py"),
        "ranks": None,
        "rank": None,
        "ranks_per_node": None,
        "nodes": None,
    }
    mpi_mod = sys.modules.get("mpi4py.MPI")
    if comm is None:
        initialised = _safe(lambda: mpi_mod.Is_initialized() and not mpi_mod.Is_finalized())
        if not initialised:
            return info
        # No communicator: report what needs no collective call (a collective here would hang
        # a caller that did not expect one on every rank).
        comm_local = mpi_mod.COMM_WORLD
    else:
        from mpi4py import MPI

        mpi_mod = MPI
        comm_local = comm
    info["library_version"] = _safe(lambda: _first_line(mpi_mod.Get_library_version()))
    info["standard_version"] = _safe(lambda: "{}.{}".format(*mpi_mod.Get_version()))
    info["ranks"] = _safe(comm_local.Get_size)
    info["rank"] = _safe(comm_local.Get_rank)
    if comm is not None:
        # Every rank must reach this allgather, so the host name is always a string.
        host = _safe(socket.gethostname) or "?"
        hosts = _safe(lambda: comm.allgather(host))
        if hosts is not None:
            info["ranks_per_node"] = hosts.count(host)
            info["nodes"] = len(set(hosts))
    return info


# The fields of the machine metadata that must agree for records to describe one machine:
# calibration refuses records that differ in one, and an append onto another machine's file is
# refused. Not the host name: the ranks of a cluster run land on other nodes of one partition
# from one srun to the next; not the cores available, which a launcher's binding narrows.
IDENTITY_KEYS = ("cpu_model", "logical_cores", "arch")


def machine_identity() -> dict[str, Any]:
    """CPU model, cores (all, and those available) and architecture as
    :func:`machine_metadata` has them, cheaply: no BLAS, MPI or GPU probes. Machines that
    differ in these do not time the same code alike."""
    uname = _safe(platform.uname)
    return {
        "cpu_model": _safe(_cpu_model),
        "logical_cores": _safe(os.cpu_count),
        "cores_available": _safe(_cores_available),
        "arch": uname.machine if uname else None,
    }


def identity_difference(there: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """How the machine metadata ``there`` differs from ``here`` in :data:`IDENTITY_KEYS`
    (``"cpu_model 'Xeon' there, 'EPYC' here"``), or None where they agree or a side does not
    say."""
    diffs = [
        f"{key} {there[key]!r} there, {here[key]!r} here"
        for key in IDENTITY_KEYS
        if there.get(key) is not None and here.get(key) is not None and there[key] != here[key]
    ]
    return "; ".join(diffs) or None


def machine_metadata(
    comm: Any = None, threads: int | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Describe this machine and process as a JSON-serialisable dict.

    ``comm``: an mpi4py communicator. When given, this call is collective over it (all its
    ranks must call it) and fills ``mpi.ranks``, ``mpi.rank``, ``mpi.ranks_per_node`` and
    ``mpi.nodes``. Without it, MPI is only reported if ``mpi4py.MPI`` is already initialised
    (library, ranks and rank of COMM_WORLD; no per-node count, which would need a collective).
    ``threads``: the thread count the run uses, recorded as given. ``extra``: merged in last, so
    its keys win (e.g. a GPU benchmark adding its cupy version).
    """
    blas, pools = _safe(_blas) or (None, None)
    uname = _safe(platform.uname)
    md: dict[str, Any] = {
        "hostname": _safe(socket.gethostname),
        "os": uname.system if uname else None,
        "kernel": uname.release if uname else None,
        "platform": _safe(platform.platform),
        "arch": uname.machine if uname else None,
        "python_version": _safe(platform.python_version),
        "python_implementation": _safe(platform.python_implementation),
        "cpu_model": _safe(_cpu_model),
        "logical_cores": _safe(os.cpu_count),
        "physical_cores": _safe(_physical_cores),
        "cores_available": _safe(_cores_available),
        "cpu_quota_cores": _safe(_cgroup_cpu_quota_cores),
        "memory_total_bytes": _safe(memory_total_bytes),
        "memory_limit_bytes": _safe(cgroup_memory_limit_bytes),
        "numpy_version": _safe(lambda: __import__("numpy").__version__),
        "blas": blas,
        "threadpools": pools,
        "numba_version": _package_version("numba"),
        "mpi": _safe(lambda: _mpi(comm)),
        "threads": threads,
        "thread_env": {v: os.environ[v] for v in _THREAD_ENV_VARS if v in os.environ},
        "gpus": _safe(_gpus),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pdlsim_version": _package_version("pdlsim"),
        "collected_utc": utc_now(),
    }
    if extra:
        md.update(extra)
    return md


def _main() -> None:
    """``python -m microbench.machine``: print this machine's metadata as JSON."""
    import json

    print(json.dumps(machine_metadata(), indent=2))


if __name__ == "__main__":
    _main()
