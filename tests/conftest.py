"""Shared helpers: running ``pdlsim`` as a user would, always with a timeout."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdlsim.cli.main import main as pdlsim_main

REPO = Path(__file__).resolve().parent.parent
MPI_TIMEOUT_S = 120


def run_pdlsim(
    *args: str, timeout: float = MPI_TIMEOUT_S, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m pdlsim ARGS`` in a subprocess; a hang fails the test instead of the suite."""
    return subprocess.run(
        [sys.executable, "-m", "pdlsim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def pdlsim_here(*args: str) -> subprocess.CompletedProcess:
    """``pdlsim ARGS`` run in this process, as :func:`run_pdlsim` reports it (status, stdout,
    stderr), without a new interpreter's second of imports: for the answers of commands that
    start no process and touch no process-wide state (a prediction, a refusal)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = pdlsim_main(list(args))
        except SystemExit as usage:  # argparse's own errors
            status = usage.code if isinstance(usage.code, int) else 2
    return subprocess.CompletedProcess(["pdlsim", *args], status, out.getvalue(), err.getvalue())


def refused_here(*args: str) -> str:
    """The one line of a refused ``pdlsim ARGS`` (:func:`pdlsim_here`): exit status 2, no
    traceback, one ``pdlsim: error:`` line."""
    result = pdlsim_here(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pdlsim: error: "), lines[0]
    return lines[0]


def mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


class LoneComm:
    """Rank 0 of a communicator with nobody else: what the samplers of
    :mod:`microbench.jitter` calls on it, doing nothing."""

    def Barrier(self):  # noqa: N802 - mpi4py's names
        pass

    def Get_rank(self):  # noqa: N802
        return 0

    def Ibarrier(self):  # noqa: N802
        return self

    def Wait(self):  # noqa: N802
        pass


def run_microbench(
    *args: str, ranks: int | None = None, timeout: float = MPI_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """``python -m microbench ARGS``, under ``mpiexec -n RANKS`` when given."""
    command = [sys.executable, "-m", "microbench", *args]
    if ranks is not None:
        command = [mpiexec(), "-n", str(ranks), *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def run_mpi_python(
    code: str, ranks: int = 2, timeout: float = MPI_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """``python -c CODE`` under ``mpiexec -n RANKS``."""
    return subprocess.run(
        [mpiexec(), "-n", str(ranks), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


PACKAGES = ("pdlsim", "microbench", "calibration")


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the packages once, in the controlling process, before any test starts a
    ``python -m pdlsim`` or an ``mpiexec`` of ranks. Where ``PYTHONDONTWRITEBYTECODE`` is set
    (many container images set it) no interpreter writes its ``.pyc`` files, so every process
    the suite starts would compile every module it imports from source again, about 0.4 s
    each; an interpreter may still read them."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did it
        return
    import compileall

    for name in PACKAGES:
        compileall.compile_dir(REPO / name, quiet=2)  # a read-only checkout: as before


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``long_module`` first, the rest in collection order (``pytest -n`` hands
    out whole modules in this order, ``--no-loadscope-reorder``): a long module started last
    would leave the other workers idle while it runs."""
    items.sort(key=lambda item: item.get_closest_marker("long_module") is None)


@pytest.fixture
def no_inherited_rank(monkeypatch):
    """Tests that run microbench without mpiexec must not look like rank 1 of some job."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delitem(os.environ, name, raising=False)


@pytest.fixture
def pdlsim_cli():
    return pdlsim_here


def one_line(info: pytest.ExceptionInfo) -> str:
    """The message of a raised error, asserted to be one line (what the command line prints)."""
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation fails the test: refusals come first."""

    def boom(*args, **kwargs):
        raise AssertionError("simulated before refusing")

    monkeypatch.setattr("pdlsim.sim.simulate", boom)
    monkeypatch.setattr("pdlsim.sim.tensor.simulate_tensor", boom)
    monkeypatch.setattr("pdlsim.sim.pipeline_engine.simulate_pipeline", boom)
