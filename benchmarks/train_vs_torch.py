"""Samples/s of one training step, pdlsim's network against PyTorch CPU, side by side.

One step is the work ``pdlsim train`` does per step on one rank: forward (mean loss as a Python
float and the count of correct predictions), backward, SGD update with momentum. Both run the
same model (a workload preset), data, batch and thread count (``microbench.threads.set_threads``
for ours, ``torch.set_num_threads`` for torch), interleaved A, B, A, B ... for several rounds so
that machine noise hits both alike; warm-up steps are discarded and medians reported.

    python benchmarks/train_vs_torch.py [--batch 64] [--threads 1 2] [--models mlp cnn ...]

Each side runs in its own process, started by this one and driven turn by turn: torch and
numba both load the GNU OpenMP runtime (``libgomp.so.1``), and one process holds only one, set
up from the environment when it loads, so in a shared process one side would run with the
other's settings. The side not running sleeps; a pause before each turn lets the other side's
idle threads stop spinning.

``--openblas-timeout`` is the ``OPENBLAS_THREAD_TIMEOUT`` our process starts with (OpenBLAS
reads it only when it loads): ``4`` lets OpenBLAS's idle threads sleep at once instead of
spinning ~0.1 s after every GEMM, which starves numba's threads between GEMMs when threads equal
cores; ``default`` leaves it unset. torch does not use OpenBLAS.

torch (``pip install torch==2.13.0``, or ``.[bench]``) is needed here; its twin of each workload is
:mod:`microbench.torch_twin`, which imports nothing of torch itself.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

Step = Callable[[], None]
SIDES = ("ours", "torch")


@dataclass(frozen=True)
class Row:
    model: str
    threads: int
    batch: int
    ours_step_s: float
    torch_step_s: float

    @property
    def ratio(self) -> float:
        """Ours / torch in samples per second (above 1: ours is faster)."""
        return self.torch_step_s / self.ours_step_s


def make_step(side: str, model: str, threads: int, args: argparse.Namespace) -> Step:
    """One training step of ``side`` on the same data for both sides (seeded)."""
    import numpy as np

    from microbench.nn import random_batch
    from microbench.threads import set_threads
    from microbench.workload import load_workload

    workload = load_workload(model)
    x, y = random_batch(workload, args.batch, np.random.default_rng(0))
    if side == "ours":
        from microbench.nn import SGD, Network

        set_threads(threads)
        net, opt = Network(workload, seed=0), SGD(args.lr, args.momentum)

        def step() -> None:
            net.forward(x, y)
            net.backward()
            opt.step(net.params, net.grads)

        return step

    import torch

    from microbench.torch_twin import torch_twin

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    module = torch_twin(workload, torch)
    torch_opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_train_step() -> None:
        torch_opt.zero_grad()
        logits = module(tx)
        flat = logits.reshape(-1, logits.shape[-1])  # a row per token, if so
        loss = loss_fn(flat, ty.reshape(-1))
        loss.backward()
        torch_opt.step()
        loss.item(), int((flat.argmax(1) == ty.reshape(-1)).sum())

    return torch_train_step


def time_steps(step: Step, steps: int) -> list[float]:
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return samples


def serve(side: str, model: str, threads: int, args: argparse.Namespace, conn: Connection) -> None:
    """A side's process: build the step, then time as many steps as asked until told None."""
    if side == "ours" and args.openblas_timeout != "default":
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = args.openblas_timeout  # before numpy loads
    step = make_step(side, model, threads, args)
    info = {"pid": os.getpid()}
    if side == "ours":
        import numba

        step()  # starts numba's thread pool
        info["numba_layer"] = numba.threading_layer()
    conn.send(info)
    while (count := conn.recv()) is not None:
        conn.send(time_steps(step, count))


def compare(model: str, threads: int, args: argparse.Namespace) -> tuple[Row, dict]:
    ctx = multiprocessing.get_context("spawn")
    conns, procs, info = {}, [], {}
    for side in SIDES:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(side, model, threads, args, child), daemon=True)
        proc.start()
        conns[side] = parent
        procs.append(proc)
    try:
        for side in SIDES:
            info[side] = conns[side].recv()
            conns[side].send(args.warmup)
            conns[side].recv()
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                time.sleep(args.settle_s)  # the other side's idle threads stop spinning
                conns[side].send(2)  # re-warm caches, not timed
                conns[side].recv()
                conns[side].send(args.steps)
                samples[side] += conns[side].recv()
    finally:
        for side in SIDES:
            conns[side].send(None)
        for proc in procs:
            proc.join(timeout=30)
    row = Row(
        model=model,
        threads=threads,
        batch=args.batch,
        ours_step_s=statistics.median(samples["ours"]),
        torch_step_s=statistics.median(samples["torch"]),
    )
    return row, info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    p.add_argument(
        "--models", nargs="+", default=["mlp", "cnn", "rescnn", "transformer"],
        help="workload presets or files",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=5, help="A/B rounds (default 5)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per side per round")
    p.add_argument("--warmup", type=int, default=5, help="discarded steps per side at the start")
    p.add_argument(
        "--settle-s", type=float, default=0.3, help="pause before each side's turn (seconds)"
    )
    p.add_argument(
        "--openblas-timeout",
        default="4",
        help="OPENBLAS_THREAD_TIMEOUT for our process (4..30), or 'default' to leave it unset",
    )
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    args = p.parse_args()

    results = [compare(m, t, args) for t in args.threads for m in args.models]
    layer = results[0][1]["ours"]["numba_layer"]
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores; ours: numba {layer} layer, "
        f"OPENBLAS_THREAD_TIMEOUT={args.openblas_timeout}; one process per side; "
        f"{args.rounds} rounds x {args.steps} steps per side, medians"
    )
    print(
        f"{'model':<11} {'threads':>7} {'batch':>5} {'ours ms':>8} {'torch ms':>8} "
        f"{'ours samples/s':>14} {'torch samples/s':>15} {'ours/torch':>10}"
    )
    for r, _ in results:
        print(
            f"{r.model:<11} {r.threads:>7} {r.batch:>5} {1e3 * r.ours_step_s:>8.3f} "
            f"{1e3 * r.torch_step_s:>8.3f} {r.batch / r.ours_step_s:>14,.0f} "
            f"{r.batch / r.torch_step_s:>15,.0f} {r.ratio:>10.2f}"
        )


if __name__ == "__main__":
    main()
