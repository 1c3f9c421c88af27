"""Thread counts are set on purpose, above the cores too, where a run asks for that."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time

import pytest

from microbench.threads import available_cores
from tests.conftest import run_pdlsim

POOL = (
    "import sys; from microbench.threads import size_numba_pool; {before}"
    "size_numba_pool({threads}); import numba; print(numba.config.NUMBA_NUM_THREADS)"
)


def _pool(threads: int, before: str = "", env: dict | None = None) -> int:
    clean = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    code = POOL.format(before=before, threads=threads)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**clean, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_numba_pool_grows_to_an_oversubscribed_count_before_numba_loads():
    cores = available_cores()
    assert _pool(cores + 3) == cores + 3
    assert _pool(1) == cores  # fewer than the cores: numba's default, the cores
    assert _pool(cores + 3, before="import numba; ") == cores  # too late: unchanged
    assert _pool(cores + 3, env={"NUMBA_NUM_THREADS": "1"}) == 1  # the user's choice is kept


def test_serial_training_above_the_cores_warns_once_in_one_line(tmp_path):
    """One oversubscription warning, and numba runs the threads asked for (no pool warning)."""
    threads = str(available_cores() + 1)
    args = ("--model", "mlp", "--epochs", "1", "--samples", "64", "--batch", "32")
    result = run_pdlsim("train", *args, "--threads", threads, "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and "oversubscribed" in warnings[0], result.stderr


def test_the_gap_before_a_gemm_sample_lasts_long_enough_for_blas_threads_to_sleep():
    from microbench.threads import BLAS_SLEEP_GAP_S, let_blas_threads_sleep

    start = time.perf_counter()
    let_blas_threads_sleep()
    assert time.perf_counter() - start >= BLAS_SLEEP_GAP_S


def test_the_blas_inside_numba_keeps_one_thread_while_numpys_takes_the_count():
    """Attention's heads call scipy's BLAS from numba's threads: it stays at one thread, so
    that threads do not nest; numpy's BLAS and the OpenMP runtime take the count."""
    code = (
        "from microbench.threads import set_threads; from threadpoolctl import threadpool_info;"
        "set_threads(2); print({i['filepath']: i['num_threads'] for i in threadpool_info()});"
        "import sys; assert 'scipy.linalg' not in sys.modules;"  # the library alone, quickly
        "import scipy.linalg.cython_blas;"  # as numba does where it compiles an np.dot
        "print({i['filepath']: i['num_threads'] for i in threadpool_info()})"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    before, after = (ast.literal_eval(line) for line in result.stdout.splitlines())
    for counts in (before, after):  # scipy's own import finds the limited library loaded
        inner = [n for path, n in counts.items() if "scipy.libs" in path]
        outer = [n for path, n in counts.items() if "numpy.libs" in path]
        assert inner == [1] and outer == [2]


IDLE_CPU = """
import statistics, time
import numpy as np
from microbench.threads import set_threads
set_threads(2)  # starts numba's pool before anything imports the CPU kernels
from microbench.kernels import loops
x, b = np.ones((4096, 256), np.float32), np.zeros(256, np.float32)
burnt = []
for _ in range(5):
    loops.bias_act(x, b, True)  # a parallel loop: numba's worker ran and is now idle
    start = time.process_time()
    time.sleep(0.05)
    burnt.append(time.process_time() - start)
print(statistics.median(burnt))
"""


@pytest.mark.skipif(available_cores() < 2, reason="numba's pool needs two cores to run a worker")
def test_numba_workers_sleep_when_idle_whatever_started_their_pool():
    """Idle numba threads must not spin on the cores OpenBLAS needs next: with the pool
    started by ``set_threads`` before any kernel module loads, as the MPI ranks of ``pdlsim
    train`` do, a spinning OpenMP worker burnt 3.7-7.5 ms of CPU in a 50 ms idle wait; one
    that sleeps burns almost none."""
    chosen = ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER", "GOMP_SPINCOUNT")
    clean = {k: v for k, v in os.environ.items() if k not in chosen}
    result = subprocess.run([sys.executable, "-c", IDLE_CPU], capture_output=True, text=True,
                            timeout=120, env=clean)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < 1e-3, f"{float(result.stdout) * 1e3:.2f} ms of CPU while idle"
