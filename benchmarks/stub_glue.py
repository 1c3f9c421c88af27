"""The Python between a training step's kernels, timed on its own: every kernel a no-op.

    python benchmarks/stub_glue.py [WORKLOAD.json:BATCH ...]

The step model's glue (``per_op_s`` x op calls + ``per_step_s``) is fitted jointly with the
interplay factor on the step benchmark's networks. Here it is measured directly: the same
training step (:func:`microbench.kernels.steps.step_fn`) with numpy's GEMMs and copies and every
numba loop of :mod:`microbench.kernels.cpu` replaced by functions that return at once, so that
what is left is the layers' Python, the allocations and the dispatch. Printed per network (the
step benchmark's at one and two threads, then any given): the stubbed step's median, its dense
and conv2d layers, and a non-negative least-squares law over those counts fitted to the
benchmark's networks, with its error on the networks given (never fitted to them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibration.stats import nonneg_relative_fit
from microbench.kernels.record import kernels_replaced
from microbench.kernels.steps import glue_workloads, step_fn, step_workloads
from microbench.sampling import SamplingPolicy, median_s
from microbench.threads import set_threads
from microbench.workload import Workload, load_workload

POLICY = SamplingPolicy(warmup=10, min_samples=100, max_samples=200, time_cap_s=0.2)
KINDS = ("dense", "conv2d")


def _noop(*args: object, **kwargs: object) -> None:
    return None


def _stub(name: str, fn: object) -> object:
    """A kernel that returns at once (the loss: a zero loss, nothing correct)."""
    return (lambda *args, **kwargs: (0.0, 0)) if name == "softmax_xent" else _noop


def stubbed_seconds(workload: Workload, batch: int) -> float:
    """Median seconds of a training step of ``workload`` with every kernel a no-op."""
    with kernels_replaced(_stub):
        return median_s(step_fn(workload, batch), POLICY)


def counts(workload: Workload) -> list[float]:
    """The law's columns: dense layers, conv2d layers, one."""
    return [*(float(sum(x.kind == k for x in workload.layers)) for k in KINDS), 1.0]


def _given(spec: str) -> tuple[Workload, int]:
    name, _, batch = spec.rpartition(":")
    if not name or not batch.isdigit():
        raise SystemExit(f"stub_glue.py: expected WORKLOAD:BATCH, got {spec!r}")
    path = Path(name)
    if path.suffix == ".json":
        return Workload.from_dict(json.loads(path.read_text())), int(batch)
    return load_workload(name), int(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("networks", nargs="*", help="WORKLOAD.json:BATCH or preset:BATCH")
    args = parser.parse_args()
    given = [_given(s) for s in args.networks]
    set_threads(1)
    bench = [(w, 1) for w in glue_workloads()]
    bench += step_workloads(24)[len(glue_workloads()) :]
    seconds = [stubbed_seconds(w, b) for w, b in bench]
    for (w, b), s in zip(bench, seconds, strict=True):
        print(f"{w.name:16s} batch {b:4d}  {s * 1e6:7.1f} us  dense/conv2d {counts(w)[:2]}")
    law, _ = nonneg_relative_fit(np.array([counts(w) for w, _ in bench]), np.array(seconds))
    print("law: " + ", ".join(f"{v * 1e6:.1f} us per {k}" for k, v in zip(KINDS, law, strict=False))
          + f", {law[-1] * 1e6:.1f} us per step")  # fmt: skip
    errors = []
    for w, b in given:
        s = stubbed_seconds(w, b)
        errors.append(float(np.array(counts(w)) @ law / s - 1))
        print(f"{w.name:16s} batch {b:4d}  {s * 1e6:7.1f} us  law {errors[-1]:+.1%}")
    if errors:
        print(f"law on the networks given: median |error| {np.median(np.abs(errors)):.1%}")


if __name__ == "__main__":
    main()
