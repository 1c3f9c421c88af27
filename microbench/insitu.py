"""Collectives timed where training runs them: inside a real training step, between its layers.

The collectives benchmark (:mod:`microbench.collectives`) times one op back to back, the
standard method (OSU, IMB): its buffers and MPI's shared-memory cells stay in cache and the
ranks arrive together. Training calls the same op after a layer's compute has filled the caches
with weights and activations, on buffers that compute just wrote. For the small calls of a small
network that can cost several times more for the same op and size, and how much more depends on
what the compute before the call left in cache: a cache sweep before each call reproduces the
first collective of a step, not the ones between small layers (evidence: docs/evidence.md,
"Collectives in place"). No synthetic pattern reproduces every case, so this benchmark runs the
real steps, the same code training runs, and times each collective in them:

* **data parallelism**: the training step of :mod:`pdlsim.train.loop` (forward, backward, a
  barrier, one in-place ``Allreduce`` of the whole flat gradient, the SGD update);
* **layer-wise (model) parallelism**: the step of :class:`microbench.nn.sliced.SlicedNetwork`
  (an ``Allgatherv`` after each split dense layer's forward, an ``Allreduce`` of each input
  gradient in backward), when every dense layer has a neuron per rank, and the barrier that
  ends it (:mod:`pdlsim.train.model_loop` starts each step with one, right after the update);
* **its forward-only step** (parallelism :data:`MODEL_INFERENCE`: the allgathers and the
  barrier, what ``pdlsim train --parallel model --inference`` runs). A loop of forward passes
  leaves more in cache than training steps do, so its calls cost less than the training step's,
  and priced at the training step's they make up much of a forward pass's prediction error.

The barriers are timed too (op ``barrier``, layer ``step``): the rank that reaches a barrier
last after a step's compute spends several times a back-to-back barrier's latency in it, and
more after a larger network's step (evidence: docs/evidence.md, "Barrier"), a cost no other term
of the model holds. So is each rank's compute before the barrier (op ``compute``, layer
``step``: not a collective; data parallel the forward and backward, layer-wise the step outside
its collectives), the time the barrier's wait is a share of: the wait of the ranks that arrive
first is the step's skew (T_sync) measured where training has it, which is smaller than what
ranks timing the same step without collectives between steps show (evidence: docs/evidence.md,
"Skew in place"). Data parallel, the SGD update after the allreduce is timed as well (op
``update``, layer ``step``): the ranks run it together, right after the reduction has been
through their caches, which can make it slower than the serial update of the same parameters
(evidence: docs/evidence.md, "Update in place").

Right after each round's steps, rank 0 also times its compute of the step alone while the
other ranks idle (statistic ``alone``, op ``compute``): data parallel the same forward and
backward; layer-wise its own slices' step with the collectives made local (:class:`_Solo`), less
the seconds in those local calls, so that it counts what the step's op ``compute`` counts. The
ranks' compute in place over that, round by round, is how much the other rank and the step's
collectives slow a rank's compute down, at that moment's speed whatever it was. It differs from
the jitter benchmark's co-location factor, whose 2-rank steps have no collective between them,
and it varies with the batch (evidence: docs/evidence.md, "Co-location").

Each step starts after a barrier. The steps are taken in rounds through every workload, batch
and parallelism (:func:`sample_rounds`), each round after ``warmup`` steps that are not kept, so
that a point's samples come from several moments of the machine, not one. Per step and call,
every rank's seconds in the call are kept (its wait for later ranks included), and their minimum
over ranks: the rank that arrived last waits for nobody, so the minimum is the collective's own
cost in place, what :mod:`calibration.insitu` fits. ``bytes`` is the total gathered or reduced,
as the simulator's plans count it (not each rank's block, as the collectives benchmark does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .jitter import sample_alone
from .measurement import Measurement
from .workload import Workload

__all__ = [
    "ALONE",
    "BENCHMARK",
    "MODEL_INFERENCE",
    "Call",
    "Timed",
    "alone_record",
    "data_parallel_pair",
    "gather_calls",
    "insitu_records",
    "layerwise_pair",
    "sample_calls",
    "sample_rounds",
    "split_rounds",
    "splittable",
]

BENCHMARK = "insitu"
MODEL_INFERENCE = "model-inference"  # the parallelism of the layer-wise forward-only step
STOP_REASON = "max_samples"
ALONE = ("alone", "whole")  # rank 0 alone: its compute of the step; the whole network's (model)
Step = Callable[[], list[tuple[str, str, int, float]]]


@dataclass(frozen=True)
class Call:
    """One collective of a step, in the order the step makes it."""

    op: str  # "allreduce", "allgather", "barrier"; "compute", "update": the rank's own work
    layer: str  # the dense layer, "gradients" (the data-parallel allreduce) or "step"
    nbytes: int  # gathered or reduced in total
    parallel: str  # "data", "model" or MODEL_INFERENCE


class _Comm:
    """What :class:`SlicedNetwork` needs of a communicator, over an mpi4py one (host arrays)."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self._mpi, self.mpi_comm = MPI, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def allreduce_sum_(self, buf: np.ndarray) -> None:
        self.mpi_comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)


def _batch(workload: Workload, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *workload.input_shape), dtype=np.float32)
    return x, rng.integers(0, workload.num_classes, batch)


def data_parallel_pair(
    workload: Workload, batch: int, comm: Any, seed: int = 0
) -> tuple[Step, Companions]:
    """The data-parallel training step, and its compute alone (statistic ``alone``). The step
    returns its calls: the barrier after the backward and the gradient allreduce, then the
    ranks' own compute before the barrier and their update after the allreduce; learning rate
    0, so every step computes the same thing (as the jitter benchmark). The compute alone is
    the same network's forward and backward (the step's op ``compute``), which rank 0 times
    while the other ranks idle (:func:`sample_rounds`)."""
    from .nn import SGD, Network

    net, opt, mpi = Network(workload, seed=seed), SGD(lr=0.0), _Comm(comm)
    x, y = _batch(workload, batch, seed)

    def alone() -> None:
        net.forward(x, y)
        net.backward()

    def step() -> list[tuple[str, str, int, float]]:
        begin = time.perf_counter()
        net.forward(x, y)
        net.backward()
        start = time.perf_counter()
        comm.Barrier()
        reduce = time.perf_counter()
        mpi.allreduce_sum_(net.grads)
        end = time.perf_counter()
        opt.step(net.params, net.grads)
        done = time.perf_counter()
        nbytes = int(net.grads.nbytes)
        return [
            ("barrier", "step", 0, reduce - start),
            ("allreduce", "gradients", nbytes, end - reduce),
            ("compute", "step", 0, start - begin),  # what the barrier's wait is a share of
            ("update", "step", 0, done - end),  # in place, as a share of that compute
        ]

    return step, {"alone": alone}


def splittable(workload: Workload, ranks: int) -> bool:
    """Whether every dense layer has at least one output neuron per rank (and one exists)."""
    dense = [info for info in workload.layers if info.kind == "dense"]
    return bool(dense) and all(info.output_shape[0] >= ranks for info in dense)


class _Solo:
    """Rank 0 of ``size`` ranks with its collectives local (what :class:`SlicedNetwork` needs
    of a communicator): the allgather keeps this rank's own block and zeros (never
    uninitialised memory, whose denormals would slow the next layer), the allreduce keeps the
    partial sum. The network then computes rank 0's slices with nobody to wait for."""

    rank = 0

    def __init__(self, size: int) -> None:
        self.size, self.mpi_comm = size, self

    def Allgatherv(self, send: np.ndarray, recv: list[Any]) -> None:  # noqa: N802 - mpi4py's
        buffer = recv[0]
        buffer[:] = 0.0
        buffer[: send.size] = send.reshape(-1)

    def allreduce_sum_(self, buf: np.ndarray) -> None:
        """The sum over one rank: ``buf`` as it is."""


def _sliced_step(net: Any, opt: Any, x: np.ndarray, y: np.ndarray, inference: bool) -> float:
    """One step of ``net`` (``inference``: its forward pass and loss only), as
    :mod:`pdlsim.train.model_loop` runs it; its seconds outside its collectives, whose
    ``(op, layer, nbytes, seconds)`` are left in ``net.call_log``."""
    net.call_log = []
    begin = time.perf_counter()
    net.forward(x, y, training=not inference)
    if not inference:
        net.backward()
        opt.step(net.params, net.grads)
    return time.perf_counter() - begin - sum(seconds for *_, seconds in net.call_log)


def layerwise_pair(
    workload: Workload, batch: int, comm: Any, seed: int = 0, inference: bool = False
) -> tuple[Step, Companions]:
    """The model-parallel training step (``inference``: its forward pass and loss only), and
    what rank 0 times of it alone: its own part (``alone``) and the whole network's
    (``whole``). The step returns its collectives, in order, the barrier that ends it, then
    the ranks' compute outside the collectives. The part alone is the same slices' compute
    with the collectives local (:class:`_Solo`); the whole is the unsplit network run by the
    same code on one rank. Both return their seconds outside the local calls, so that they
    count what the step's op ``compute`` counts: the part over the whole is the share of the
    step a rank computes, at one moment's speed whatever it was."""
    from .nn import SGD
    from .nn.sliced import SlicedNetwork

    x, y = _batch(workload, batch, seed)

    def network(over: Any) -> tuple[Any, Any]:
        return SlicedNetwork(workload, over, seed=seed), SGD(lr=0.0)

    net, opt = network(_Comm(comm))
    part, whole = network(_Solo(comm.Get_size())), network(_Solo(1))

    def step() -> list[tuple[str, str, int, float]]:
        compute = _sliced_step(net, opt, x, y, inference)
        calls, net.call_log = net.call_log, None
        start = time.perf_counter()
        comm.Barrier()  # the step boundary, as the training loop's next step begins
        return [
            *calls,
            ("barrier", "step", 0, time.perf_counter() - start),
            ("compute", "step", 0, compute),  # the step outside its collectives
        ]

    return step, {
        "alone": lambda: _sliced_step(*part, x, y, inference),
        "whole": lambda: _sliced_step(*whole, x, y, inference),
    }


def sample_calls(
    step: Step, samples: int, warmup: int, comm: Any, parallel: str
) -> tuple[list[Call], np.ndarray]:
    """``samples`` steps after ``warmup`` untimed ones, each after a barrier: the calls (the
    same in every step) and this rank's seconds in each, shaped (samples, calls)."""
    if samples < 1 or warmup < 0:
        raise ValueError(f"need samples >= 1 and warmup >= 0, got {samples} and {warmup}")
    for _ in range(warmup):
        comm.Barrier()
        step()
    rows, calls = [], None
    for _ in range(samples):
        comm.Barrier()
        made = step()
        found = [Call(op, layer, nbytes, parallel) for op, layer, nbytes, _ in made]
        if calls is not None and found != calls:
            raise RuntimeError("a step made different collectives than the one before it")
        calls = found
        rows.append([seconds for *_, seconds in made])
    return calls or [], np.asarray(rows, dtype=np.float64).reshape(samples, len(calls or []))


class Timed(NamedTuple):
    """One step's samples from :func:`sample_rounds`."""

    calls: list[Call]
    table: np.ndarray  # this rank's seconds per step and call, (samples, calls)
    alone: dict[str, np.ndarray]  # rank 0's seconds of each companion (ALONE); none elsewhere


Companions = Mapping[str, Callable[[], object]]  # what rank 0 times alone, by statistic


def sample_rounds(
    steps: Sequence[tuple[Step, str]],
    samples: int,
    warmup: int,
    rounds: int,
    comm: Any,
    alone: Sequence[Companions | None] = (),
) -> list[Timed]:
    """Every step of ``steps`` ((step, parallel) pairs) timed ``samples`` times in all, spread
    over ``rounds`` rounds: each round runs every step in turn, ``warmup`` untimed steps and
    then its share of the samples (:func:`split_rounds`). Per step: its calls and this rank's
    seconds, shaped (samples, calls), in time order, round after round.

    The machine's state moves on a scale of seconds (on a shared machine the same in-place
    collective can cost twice as much a few seconds later), so one block of
    consecutive steps measures one moment; rounds measure several, as training's launches do.

    ``alone`` (one entry per step, None for none): right after a step's share of a round,
    rank 0 times each of its companions (:data:`ALONE`) as many times while the other ranks
    idle (:func:`microbench.jitter.sample_alone`), so that each round's in-place compute over
    its compute alone is a co-location factor of that moment, whatever the machine's speed
    was (and a layer-wise step's part over the whole network, its share)."""
    shares = split_rounds(samples, rounds)
    lone = list(alone) or [None] * len(steps)
    if len(lone) != len(steps):
        raise ValueError(f"need one alone entry per step ({len(steps)}), got {len(lone)}")
    tables: list[list[np.ndarray]] = [[] for _ in steps]
    alones: list[dict[str, list[np.ndarray]]] = [{} for _ in steps]
    calls: list[list[Call]] = [[] for _ in steps]
    for share in shares:
        for k, (step, parallel) in enumerate(steps):
            found, table = sample_calls(step, share, warmup, comm, parallel)
            if tables[k] and found != calls[k]:
                raise RuntimeError("a step made different collectives than the one before it")
            calls[k] = found
            tables[k].append(table)
            for statistic, companion in (lone[k] or {}).items():
                timed = sample_alone(companion, share, comm)
                alones[k].setdefault(statistic, []).append(timed)
    return [
        Timed(
            c,
            np.concatenate(t, axis=0),
            {statistic: np.concatenate(parts) for statistic, parts in a.items() if parts[0].size},
        )
        for c, t, a in zip(calls, tables, alones, strict=True)
    ]


def split_rounds(samples: int, rounds: int) -> list[int]:
    """``samples`` split over ``rounds`` (at most one per sample) as evenly as possible, the
    larger shares first: how :func:`sample_rounds` and :mod:`calibration.insitu` agree on
    which samples each round took."""
    if samples < 1 or rounds < 1:
        raise ValueError(f"need samples >= 1 and rounds >= 1, got {samples} and {rounds}")
    rounds = min(rounds, samples)
    return [len(part) for part in np.array_split(np.arange(samples), rounds)]


def gather_calls(local: np.ndarray, comm: Any) -> np.ndarray | None:
    """Every rank's (samples, calls) table as (ranks, samples, calls) on rank 0; collective."""
    local = np.ascontiguousarray(local, dtype=np.float64)
    root = comm.Get_rank() == 0
    table = np.empty((comm.Get_size(), *local.shape), dtype=np.float64) if root else None
    comm.Gather(local, table, root=0)
    return table


def insitu_records(
    calls: Sequence[Call],
    table: np.ndarray,
    params: dict[str, Any],
    warmup: int,
    hosts: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Per call: one "measurement" record per rank (statistic "per_rank") and one of the
    per-step minimum over ranks ("min_over_ranks", rank None). ``params``: model, batch,
    threads, ranks, ranks_per_node; each record adds parallel, layer, position, bytes."""
    records = []
    for k, call in enumerate(calls):
        per_call = table[:, :, k]
        rows = [(r, "per_rank", per_call[r]) for r in range(per_call.shape[0])]
        rows.append((None, "min_over_ranks", per_call.min(axis=0)))
        for rank, statistic, samples in rows:
            measurement = Measurement(
                samples,
                benchmark=BENCHMARK,
                name=call.op,
                params={
                    **params, "parallel": call.parallel, "layer": call.layer, "position": k,
                    "bytes": call.nbytes, "rank": rank, "statistic": statistic,
                },
                warmup_discarded=warmup,
                stop_reason=STOP_REASON,
            )  # fmt: skip
            host = hosts[rank] if hosts is not None and rank is not None else None
            records.append(measurement.to_record(host=host, clock="perf_counter"))
    return records


def alone_record(
    samples: np.ndarray, params: dict[str, Any], host: str | None, statistic: str = "alone"
) -> dict[str, Any]:
    """The record of rank 0's ``statistic`` (:data:`ALONE`) timed alone (:func:`sample_rounds`):
    op ``compute``, layer ``step``; ``params`` as :func:`insitu_records` takes them, with
    parallel."""
    if statistic not in ALONE:
        raise ValueError(f"statistic must be one of {', '.join(ALONE)}, got {statistic!r}")
    measurement = Measurement(
        samples,
        benchmark=BENCHMARK,
        name="compute",
        params={**params, "layer": "step", "rank": 0, "statistic": statistic},
        warmup_discarded=0,
        stop_reason=STOP_REASON,
    )
    return measurement.to_record(host=host, clock="perf_counter")
