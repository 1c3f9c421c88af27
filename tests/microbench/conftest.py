"""Fixtures of the kernel tests."""

from __future__ import annotations

import numba
import pytest

from microbench.kernels import cpu, loops, policy
from microbench.threads import set_threads


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request, monkeypatch):
    """Runs a test at 1 and 2 numba threads, every loop parallel at 2 (threshold 0); afterwards
    checks that the numba wrappers took only serial drivers at 1 thread, only parallel at 2."""
    count = request.param
    if count > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba's pool holds {numba.config.NUMBA_NUM_THREADS} thread(s)")
    monkeypatch.setattr(policy, "PARALLEL_MIN_ELEMENTS", 0)
    picked = []
    choose = cpu._loop

    def spy(name, work):
        fn = choose(name, work)
        picked.append(name if fn is getattr(loops, name) else name + "_serial")
        return fn

    monkeypatch.setattr(cpu, "_loop", spy)
    before = numba.get_num_threads()
    set_threads(count)
    try:
        yield count
    finally:
        set_threads(before)
    serial = {name.endswith("_serial") for name in picked}  # empty for the array kernels
    assert serial <= {count == 1}, picked


@pytest.fixture
def loop_work(monkeypatch):
    """The ``work`` each numba wrapper hands ``_loop`` (what decides its driver), by loop."""
    seen: dict[str, int] = {}
    choose = cpu._loop

    def spy(name, work):
        seen[name] = work
        return choose(name, work)

    monkeypatch.setattr(cpu, "_loop", spy)
    return seen
