"""The step benchmark's networks and its measurement: whole training steps against their
kernel calls each timed alone.

A step's kernels, each timed alone, do not add up to the step: the Python between them and
the kernels' slowdown inside a sequence of other kernels make the difference
(:mod:`calibration.step_terms` fits both). :func:`measure_step` times the two side by side, the
calls alone (:mod:`microbench.kernels.record`) then a step that follows another step, as in
training, in each round, so that a slow spell of a shared machine lands on both. The
networks (:func:`step_workloads`) are tiny ones whose kernels do next to no work
(:func:`glue_workloads`) and random ones of the supported layer kinds, MLPs, CNNs and
residual CNNs in turn (:mod:`microbench.randomnets`), at batches log-uniform in
:data:`STEP_BATCHES`, from :data:`STEP_STREAM`, a stream no seed a user gives reaches; the
same networks at every thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from microbench.kernels.record import record_calls, time_alone
from microbench.nn import SGD, Network, random_batch
from microbench.randomnets import random_workloads
from microbench.workload import Workload

__all__ = ["STEP_BATCHES", "STEP_KINDS", "STEP_STREAM", "glue_workloads", "measure_step",
           "paired_rounds", "step_flops", "step_fn", "step_workloads"]  # fmt: skip

STEP_BATCHES = (4, 256)
STEP_STREAM = 0x57E9
# The kinds of random networks, in turn: a factor measured on chains alone priced residual
# networks 10-15% fast at one thread (their steps ran 1.4-1.7x their tables' price, chains'
# 1.2-1.35x, side by side).
STEP_KINDS = ("mlp", "cnn", "res")


def glue_workloads() -> list[Workload]:
    """Tiny networks of 1 to 8 ops of each kind whose kernels do next to no work: their steps
    are the Python between the kernels."""
    out = []
    for depth in (1, 2, 4, 8):
        dense = [{"kind": "dense", "units": 4}, {"kind": "relu"}] * depth
        out.append(
            Workload.from_dict(
                {
                    "name": f"glue-dense{depth}",
                    "input_shape": [4],
                    "layers": [
                        *dense,
                        {"kind": "dense", "units": 2},
                        {"kind": "softmax_cross_entropy"},
                    ],
                }  # fmt: skip
            )
        )
        conv = [{"kind": "conv2d", "filters": 2, "kernel": 1}, {"kind": "relu"}] * depth
        out.append(
            Workload.from_dict(
                {
                    "name": f"glue-conv{depth}",
                    "input_shape": [1, 2, 2],
                    "layers": [
                        *conv,
                        {"kind": "maxpool2d", "size": 2},
                        {"kind": "flatten"},
                        {"kind": "dense", "units": 2},
                        {"kind": "softmax_cross_entropy"},
                    ],
                }  # fmt: skip
            )
        )
    return out


def step_workloads(count: int, most_flops: float | None = None) -> list[tuple[Workload, int]]:
    """The step benchmark's networks, each with its batch, the same at every thread count: the
    tiny networks at batch 1, then ``count`` random ones (:mod:`microbench.randomnets`) drawn
    from the benchmark's own stream, at batches log-uniform in :data:`STEP_BATCHES` one per
    stratum (a Latin hypercube in log batch), so that every thread count's terms are fitted
    over the same steps, small to large. Drawn per thread count, the two-thread networks had
    come out small (their largest step a tenth of the one-thread draw's), and the factor fitted
    on them multiplied steps ten times larger.

    With ``most_flops``, the draw less its steps of more FLOPs (``--quick``: the sweep keeps
    small to large steps but not the few longest). Its six first draws had made a quick
    sweep's networks: their kernels all came to 16-18 ms, and the two-thread factor fitted on
    them priced two-thread rows 15% slow (signed median)."""
    rng = np.random.default_rng(STEP_STREAM)
    low, high = (math.log(b) for b in STEP_BATCHES)
    drawn = random_workloads(rng, count, prefix="step", kinds=STEP_KINDS)
    strata = rng.permutation(len(drawn))
    batches = [
        int(round(math.exp(low + (high - low) * (stratum + rng.uniform()) / len(drawn))))
        for stratum in strata
    ]
    nets = list(zip(drawn, batches, strict=True))
    if most_flops is not None:
        nets = [(w, b) for w, b in nets if step_flops(w, b) <= most_flops]
    return [(w, 1) for w in glue_workloads()] + nets


def step_flops(workload: Workload, batch: int) -> int:
    """The floating-point operations of one training step (forward and backward)."""
    return (workload.forward_flops_per_sample + workload.backward_flops_per_sample) * batch


def step_fn(workload: Workload, batch: int) -> Callable[[], object]:
    """One training step (forward, loss, backward, SGD update) of ``workload`` at ``batch``
    on synthetic data, as ``pdlsim train`` runs it."""
    net, opt = Network(workload), SGD(1e-9)
    x, y = random_batch(workload, batch, np.random.default_rng(0))

    def step() -> None:
        net.forward(x, y)
        net.backward()
        opt.step(net.params, net.grads)

    return step


def measure_step(
    workload: Workload, batch: int, rounds: int, warmup: int = 2
) -> tuple[list[float], list[float]]:
    """``rounds`` whole steps of ``workload`` at ``batch``, each beside the sum of the same
    kernel calls each timed alone (:func:`microbench.kernels.record.time_alone`), in
    :func:`paired_rounds`: (steps, alone), seconds, after ``warmup`` steps."""
    step = step_fn(workload, batch)
    for _ in range(warmup):
        step()
    calls = record_calls(step)
    return paired_rounds(step, lambda: time_alone(calls), rounds)


def paired_rounds(
    step: Callable[[], object],
    alone: Callable[[], float],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], list[float]]:
    """Per round, the calls alone (``alone()``: their seconds), then a step as training runs
    it: right after another step. Training runs its steps back to back, so a step finds the
    previous one's weights, activations and code in the caches; the first step after the calls
    alone finds theirs instead, and runs slower on small networks (evidence: docs/evidence.md,
    "The step benchmark's steps"). So each round runs one step untimed and times the next.
    Returns (steps, alone), seconds."""
    steps, alones = [], []
    for _ in range(rounds):
        alones.append(alone())
        step()  # the step before, as in training
        start = clock()
        step()
        steps.append(clock() - start)
    return steps, alones
