"""``pdlsim predict``: a calibrated profile, a cluster, a prediction (``pdlsim sweep``: many).

Defaults (so that ``pdlsim predict --nodes 16 --gpus 4`` works on a fresh install): the packaged
reference profile for the host, the ``cnn`` workload (the CIFAR-10 CNN) at 32 samples per rank,
the ``ib-hdr`` network preset (unless the profile has fitted inter-node parameters), the
``h100-sxm`` GPU preset, 25 MiB buckets with overlap on, pinned copies, 100 iterations.

Definitions: scaling is weak (the batch is per rank); speedup is the throughput over that of one
device of the same kind (one GPU, or one process with the same threads), simulated too;
efficiency = speedup / devices; communication overhead = exposed communication (T_comm -
T_overlap) over T_step; epoch = ceil(dataset / (ranks x batch)) steps, dataset by workload
(:data:`DATASET_SAMPLES`, 50,000 for a workload file unless ``--dataset-samples``).

The band: ``--samples`` K cost models drawn with :meth:`ProfileCostModel.perturbed`, each
simulated with its own jitter seed for min(iterations, :data:`BAND_ITERATIONS`) steps (the mean
of a few steps: cheap, and still carries the jitter); P10/P50/P90 of their mean step times,
relative to their median, around the predicted step (:mod:`pdlsim.prediction.document`): the P50 is
the step time.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from microbench.errors import UserError
from microbench.fileio import check_folder_exists, check_writable
from pdlsim.prediction.build import build, check_config
from pdlsim.prediction.checks import BAND_ITERATIONS, layerwise_mode
from pdlsim.prediction.config import PredictConfig, check_not_an_input
from pdlsim.prediction.document import band_step_times, prediction_document
from pdlsim.prediction.epoch import DATASET_SAMPLES, dataset_samples
from pdlsim.prediction.layerwise import plan_memory, run_layerwise

if TYPE_CHECKING:  # the heavy modules are imported where used: building the parser stays light
    from collections.abc import Callable

    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.sim import Cluster, Scenario

    MemoryOf = Callable[[Cluster, Scenario, ProfileCostModel], dict[str, int]]

__all__ = [
    "DATASET_SAMPLES",
    "check_config",
    "check_prediction",
    "check_trace_path",
    "run_prediction",
]


def check_trace_path(trace: str, cfg: PredictConfig | None = None) -> None:
    """Refuse a ``--trace`` file that cannot be written, before any simulating: a place that
    is no file (:func:`~microbench.fileio.check_writable`), one in a folder that does not
    exist (a mistyped folder is not created silently), or one of ``cfg``'s input files (the
    trace would replace the workload or profile it was computed from). The command line and
    the Python API (``pdlsim.predict(trace=...)``) both pass here."""
    check_writable(trace, "file", "--trace")
    if cfg is not None:
        check_not_an_input(cfg, trace, "--trace")
    check_folder_exists(trace, "--trace", "a file")


def check_prediction(cfg: PredictConfig) -> None:
    """Refuse what :func:`run_prediction` would refuse for ``cfg``, without simulating: the
    configuration's checks, its profile and hardware, its layout (a pipeline's stages against
    its ranks) and memory (:func:`~pdlsim.prediction.build.build`). ``sweep`` and ``sweep
    --vary`` run it over every row first, so that a row refused is refused before the first
    is simulated, not after minutes of them (with progress lines before its one line)."""
    try:
        if layerwise_mode(cfg):
            build(cfg, plan_memory(cfg))
        else:
            build(cfg)
    except ValueError as exc:  # ConfigError and the cost model's own checks, as below
        raise UserError(str(exc)) from None


def run_prediction(cfg: PredictConfig, trace: str | None = None) -> dict[str, Any]:
    """Predict one configuration: the JSON object ``pdlsim predict --json`` prints; with
    ``trace``, a Chrome trace of its timeline written there (:func:`check_trace_path`)."""
    if trace is not None:
        check_trace_path(trace, cfg)
    if layerwise_mode(cfg):  # model or pipeline parallelism, or inference
        return run_layerwise(cfg, trace, BAND_ITERATIONS)

    from pdlsim.sim import Cluster, simulate, write_chrome_trace

    try:
        cluster, scenario, cost, provenance, memory = build(cfg)
        result = simulate(cluster, scenario, cost, trace=trace is not None)
        one = Cluster(1, 1, cluster.threads_per_rank, cluster.device)
        alone = replace(cost, ranks_per_node=1)  # one device: nothing shares its node
        base = result if cluster.ranks == 1 else simulate(one, scenario, alone)
        iterations = min(cfg.iterations, BAND_ITERATIONS)
        band = band_step_times(simulate, cluster, scenario, cost, cfg.samples, cfg.seed, iterations)
    except ValueError as exc:  # ConfigError and the cost model's own checks
        raise UserError(str(exc)) from None
    devices = cluster.ranks
    out = prediction_document(
        cfg, cluster, result.breakdown, band,
        base_step_s=base.step_time_s,
        replicas=devices,
        samples_per_step=devices * scenario.batch_per_rank * scenario.accumulation,
        dataset=dataset_samples(scenario.workload.name, cfg.dataset_samples),
        memory=memory,
        provenance=provenance,
        gpu=cost.gpu,
        buckets=[asdict(x) for x in result.buckets],
    )  # fmt: skip
    if trace is not None and result.timeline is not None:  # last: a failed run keeps the old one
        write_chrome_trace(trace, result.timeline, f"--trace {trace}")
    return out
