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
Calls are caught by :class:`microbench.kernels.record.CallRecorder`. Medians over steps after
warm-up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calibration.kernels import KernelModel
from microbench.kernels.calls import op_calls, step_calls
from microbench.kernels.record import CallRecorder
from microbench.kernels.steps import step_fn
from microbench.threads import set_threads
from microbench.workload import load_workload
from pdlsim.prediction.config import resolve_profile

WARMUP, STEPS = 5, 20


def measure(workload_spec, batch: int, threads: int, model: KernelModel) -> dict:
    workload = load_workload(workload_spec)
    step = step_fn(workload, batch)
    with CallRecorder() as rec:
        in_step, walls = [], []
        for i in range(WARMUP + STEPS):
            rec.times.clear()
            rec.keep = i == WARMUP
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
            if i >= WARMUP:
                in_step.append(list(rec.times))
                walls.append(wall)
    replayed = []
    for i in range(WARMUP + STEPS):
        times = []
        for fn, args, kwargs in rec.calls:
            start = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - start)
        if i >= WARMUP:
            replayed.append(times)
    alone = []
    for fn, args, kwargs in rec.calls:
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
    if len(calls) != len(step):
        raise SystemExit(f"{workload.name}: {len(step)} calls caught, {len(calls)} enumerated")
    priced = np.array([model.call_s(c, threads) for c in calls])
    return {
        "workload": workload, "calls": calls, "wall": float(np.median(walls)),
        "step": step, "replay": replay, "alone": np.array(alone), "priced": priced,
    }  # fmt: skip


def report(m: dict, batch: int, threads: int) -> None:
    columns = ("step", "replay", "alone", "priced")
    workload = m["workload"]
    ms = [f"{name} {np.sum(m[name]) * 1e3:.3f}" for name in columns]
    ops = len(op_calls(workload))
    glue = (m["wall"] - np.sum(m["step"])) / ops
    print(
        f"{workload.name} b{batch} t{threads}, ms: wall {m['wall'] * 1e3:.3f}, "
        + ", ".join(ms)
        + f"; {ops} op calls, wall less kernels {glue * 1e6:.2f} us per op call"
    )
    families: dict[str, np.ndarray] = {}
    for call, *t in zip(m["calls"], *(m[c] for c in columns), strict=True):
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
    parser.add_argument("--profile", default=None, help="default: what pdlsim predict uses")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = KernelModel.from_dict(resolve_profile(args.profile)[0].models["kernels"])
    set_threads(args.threads)
    for run in args.runs:
        name, _, batch = run.rpartition(":")
        report(measure(name, int(batch), args.threads, model), int(batch), args.threads)


if __name__ == "__main__":
    main()
