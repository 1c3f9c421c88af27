"""Where a training step's compute goes that the kernel tables do not see.

    python benchmarks/step_replay.py [--profile NAME|PATH] [--threads T] WORKLOAD:BATCH ...

(With ``--threads 2``, start it with ``OPENBLAS_THREAD_TIMEOUT=4`` in the environment, as
``pdlsim train`` starts its ranks: :mod:`microbench.kernels.cpu` says why.)

For each workload and batch, every kernel call of a real training step (forward, loss,
backward, SGD update; :class:`microbench.nn.Network`) is timed three ways:

* **in the step**: the network runs as training runs it, each call timed where it happens;
* **replayed**: the same calls with the same arrays, in the same order, back to back with no
  Python of the network between them;
* **alone**: each call repeated on its own arrays, back to back (its operands stay in cache);
* **priced**: the profile's kernel tables (:class:`calibration.kernels.KernelModel`), which
  time each kernel alone, over and over, on operands that stay in cache.

Step against replay is the network's Python; replay against alone, the calls' interplay (what
each leaves in the caches for the next); alone against priced, the tables (their shapes, their
data: a max-pool's branches follow its data). The per-family table says where.
Calls are caught by wrapping the kernel module's ``np.matmul`` and numba loops, so the timer's
own cost (well under a microsecond) is in every call alike. Medians over steps after warm-up.
"""

from __future__ import annotations

import argparse
import time
import types

import numpy as np

from calibration.kernels import KernelModel
from calibration.profile import load_profile
from microbench.kernels import cpu as kernels
from microbench.kernels import loops
from microbench.kernels.calls import step_calls
from microbench.nn import SGD, Network
from microbench.threads import set_threads
from microbench.workload import load_workload

WARMUP, STEPS = 5, 20


class _Recorder:
    """Stands in for the kernel module's numpy and numba loops: times each call; on the first
    recorded step also keeps (function, args) for the replay."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.calls: list[tuple] = []
        self.keep = False

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.times.append(time.perf_counter() - start)
            if self.keep:
                self.calls.append((name, fn, args, kwargs))
            return out

        return timed


def measure(workload_spec: str, batch: int, threads: int, model: KernelModel) -> None:
    workload = load_workload(workload_spec)
    rec = _Recorder()
    fake_np = types.ModuleType("numpy")
    fake_np.__dict__.update(np.__dict__)
    fake_np.matmul = rec.wrap("gemm", np.matmul)
    fake_loops = types.SimpleNamespace(
        **{k: rec.wrap(k, getattr(loops, k)) for k in dir(loops) if callable(getattr(loops, k))}
    )
    real_np, real_loops = kernels.np, kernels.loops
    kernels.np, kernels.loops = fake_np, fake_loops
    try:
        net, opt = Network(workload), SGD(0.0)
        rng = np.random.default_rng(0)
        x = rng.random((batch, *workload.input_shape), dtype=np.float32)
        y = rng.integers(0, workload.num_classes, batch)
        in_step = []
        for i in range(WARMUP + STEPS):
            rec.times.clear()
            rec.keep = i == WARMUP
            net.forward(x, y)
            net.backward()
            opt.step(net.params, net.grads)
            if i >= WARMUP:
                in_step.append(list(rec.times))
    finally:
        kernels.np, kernels.loops = real_np, real_loops
    replayed = []
    for i in range(WARMUP + STEPS):
        times = []
        for _, fn, args, kwargs in rec.calls:
            start = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - start)
        if i >= WARMUP:
            replayed.append(times)
    alone = []
    for _, fn, args, kwargs in rec.calls:
        times = []
        for i in range(WARMUP + STEPS):
            start = time.perf_counter()
            fn(*args, **kwargs)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        alone.append(np.median(times))
    step = np.median(np.array(in_step), axis=0)
    replay = np.median(np.array(replayed), axis=0)
    calls = step_calls(workload, batch, threads, gather=False)
    priced = np.array([model.call_s(c, threads) for c in calls])
    if len(calls) != len(step):
        raise SystemExit(f"{workload.name}: {len(step)} calls caught, {len(calls)} enumerated")
    columns = ("step", "replay", "alone", "priced")
    ms = [
        f"{name} {np.sum(t) * 1e3:.3f}"
        for name, t in zip(columns, (step, replay, alone, priced), strict=True)
    ]
    print(f"{workload.name} b{batch} t{threads}, ms: " + ", ".join(ms))
    families: dict[str, np.ndarray] = {}
    for call, *t in zip(calls, step, replay, alone, priced, strict=True):
        key = call.kernel if call.kernel.startswith("gemm") else call.variant
        families[key] = families.get(key, np.zeros(4)) + np.array(t)
    for key, t in sorted(families.items(), key=lambda kv: -kv[1][0]):
        print(
            f"  {key:30s}"
            + "".join(f" {c} {v * 1e3:8.3f}" for c, v in zip(columns, t, strict=True))
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="WORKLOAD:BATCH")
    parser.add_argument("--profile", default="epyc-2core")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = KernelModel.from_dict(load_profile(args.profile).models["kernels"])
    set_threads(args.threads)
    for run in args.runs:
        name, _, batch = run.rpartition(":")
        measure(name, int(batch), args.threads, model)


if __name__ == "__main__":
    main()
