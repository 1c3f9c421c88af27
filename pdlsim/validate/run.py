"""``pdlsim validate``: real training runs against predictions from a microbenchmark profile.

For every configuration (workload, P ranks x T threads, batch per rank) ``pdlsim train`` is
launched ``repeats`` times, each a separate process (or ``mpiexec``) launch into
``OUT/runs/<config>/r<k>``, round-robin over the configurations (every configuration's first
launch, then every second..., each round starting a third further along the list with three
launches: :func:`launch_rounds`), so that a configuration's launches are minutes apart and see
the machine at different moments. A launch's step time
is the median, over the steps after the warm-up (:func:`warmup_steps`: the first max(5, 10%)
steps: numba compiles, first touch), of the per-step ``step_s`` taken as the **maximum over
ranks** (a synchronous step ends when its slowest rank does). The configuration's measured
figure is the median over launches, its interval the **min..max over launches**.

Which configurations run, held-out and in-sample, is :mod:`pdlsim.validate.plan`'s. The
profile is frozen before the first launch: given (``--profile``) or calibrated first, in the
same invocation (:mod:`pdlsim.validate.calibrate`: ``pdlsim bench`` at 1 and 2 ranks, the
calibration's workloads and batches, then the fits). Every prediction comes from it, in the
scenario that ``pdlsim train`` really runs (one bucket holding every gradient, no overlap,
CPU ranks without copies); nothing measured during the validation enters a prediction. Each
configuration is predicted again with other sets of the model's named corrections
(:func:`~pdlsim.validate.plan.ablation_sets`), held-out and in-sample reported apart.

Speedup is the throughput ratio against the serial run (P1T1) at the same batch per rank:
``P x T_serial / T_config``, measured with measured times, predicted with predicted times.
Modes with P x T above the cores are not run; the report says so.

Model parallelism (the ``parallel`` dimension, :mod:`microbench.nn.sliced`): for each
workload and batch, ``pdlsim train --parallel model --procs P`` training and ``--inference``
(forward only), predicted with ``PredictConfig(parallel="model", inference=...)``. Their batch
is the global batch, so their speedup is strong scaling: ``T_serial / T_config`` at the same
batch, measured against the serial (P1T1, data) run's step (for inference rows, that run's data
+ h2d + forward phases: the serial forward pass), predicted against the layer-wise prediction's
own one-rank step. ``--quick`` adds two: the first workload, P = 2, the largest batch.

GPU configurations (``gpu``: "auto" adds them where a GPU is found and the profile has a GPU
model; "on" insists, "off" leaves them out): for every workload and batch of the data rows, one
GPU trained with pageable copies in turn and with pinned copies prefetched behind the compute
(``pdlsim train --device gpu [--pinned --prefetch]``), predicted with ``PredictConfig(gpus=1,
pinned=..., prefetch=...)``. Their speedup is the serial CPU run's step over theirs.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import replace
from typing import Any

from microbench.errors import UserError
from pdlsim.train.config import warmup_steps
from pdlsim.validate.checks import check_before_work, check_out
from pdlsim.validate.measure import measure_launch, measured_step_times, summarize_launches
from pdlsim.validate.plan import (
    GPU_CHOICES,
    RunSpec,
    ValidateConfig,
    ablation_sets,
    check_unseen,
    heldout_matrix,
    mark_unseen,
    plan_matrix,
    steps_for,
)

__all__ = [  # the plan's names too: what a caller of validate needs in one place
    "GPU_CHOICES",
    "RunSpec",
    "ValidateConfig",
    "ablation_sets",
    "check_out",
    "check_unseen",
    "heldout_matrix",
    "launch_rounds",
    "measure_launch",
    "measured_step_times",
    "plan_matrix",
    "predict_spec",
    "run_validation",
    "steps_for",
    "summarize_launches",
    "warmup_steps",
]


def launch_rounds(n: int, repeats: int) -> list[list[int]]:
    """The configurations' indices in launch order, one list per round: every configuration
    once per round (a configuration's launches minutes apart), each round the first one
    rotated by ``n / repeats`` more, so that no configuration sits at the same point of every
    round. On a machine whose speed drifts through a round, a fixed order gives the last
    configurations of each round like moments every time, so their rows share one bias
    (evidence: docs/evidence.md, "Validation order")."""
    return [[(k * n // repeats + i) % n for i in range(n)] for k in range(repeats)]


def _frozen_profile(name: str) -> Any:
    """The frozen profile at path ``name``, or the packaged profile of that name, read once for
    all the predictions made from it (a kernel-table profile takes most of a second to read): a
    path keyed on the file's identity, so a profile written anew at the same path is read
    again; a packaged one (installed with pdlsim) on its name."""
    if not os.path.isfile(name):
        return _read_profile(name, 0, 0)
    stat = os.stat(name)
    return _read_profile(name, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _read_profile(name: str, mtime_ns: int, size: int) -> Any:
    from pdlsim.prediction.config import resolve_profile

    return resolve_profile(name)[0]


def predict_spec(
    spec: RunSpec, cfg: ValidateConfig, corrections: str | None = None, samples: int | None = None
) -> dict[str, Any]:
    """The prediction of what ``pdlsim train`` runs: one bucket with every gradient, no
    overlap, CPU ranks on one node or one GPU (copies pinned and prefetched, or neither); model
    parallelism and inference through :mod:`pdlsim.prediction.layerwise` (``parallel``,
    ``inference``)."""
    from microbench.threads import available_cores
    from microbench.workload import load_workload
    from pdlsim.prediction.config import PredictConfig
    from pdlsim.prediction.core import run_prediction

    grad_mb = load_workload(spec.model).gradient_bytes / 2**20
    profile = _frozen_profile(cfg.profile) if cfg.profile is not None else None
    gpu = spec.device == "gpu"
    # Only the settings that apply: the prediction refuses a GPU setting on CPU ranks and
    # "no overlap" where nothing overlaps (model parallel, inference) as the flags would.
    where: dict[str, Any] = (
        {"gpus": 1, "pinned": spec.prefetch, "prefetch": spec.prefetch}
        if gpu
        else {"procs_per_node": spec.procs, "threads": spec.threads}
    )
    if spec.parallel == "data" and not spec.inference:
        where["overlap"] = False  # pdlsim train: one bucket, reduced after the backward
    pcfg = PredictConfig(
        nodes=1, model=spec.model, batch=spec.batch, profile=profile,
        bucket_mb=math.ceil(grad_mb) + 1.0, iterations=50,
        samples=samples or cfg.band_samples,
        cpu_sockets=(1, available_cores()),  # this machine: one socket of its cores
        parallel=spec.parallel, inference=spec.inference,
        corrections=corrections or cfg.corrections, **where,
    )  # fmt: skip
    return run_prediction(pcfg)


def run_validation(cfg: ValidateConfig, log: Any = print) -> dict[str, Any]:
    """Freeze a profile, then measure and predict every configuration of :func:`plan_matrix`
    and of :func:`heldout_matrix`; write the report."""
    from microbench.threads import available_cores
    from pdlsim.validate.calibrate import (
        calibrate_now,
        calibrated_ranks,
        check_gpu_choice,
        gpu_configurations,
        profile_provenance,
    )
    from pdlsim.validate.checkpoint import validate_checkpoint
    from pdlsim.validate.machine_speed import machine_speed, probe
    from pdlsim.validate.report import ablation, build_rows, by_ranks, summarize, write_outputs

    check_before_work(cfg)  # pdlsim.validate.checks: all it can know, before any work
    if cfg.gpu not in GPU_CHOICES:
        raise UserError(f"--gpu: expected one of {', '.join(GPU_CHOICES)}, got '{cfg.gpu}'")
    problem = check_gpu_choice(cfg.gpu)  # before the calibration: "on" without a GPU
    if problem is not None:
        raise UserError(problem)
    started = time.perf_counter()  # what the user waits for: the calibration included
    calibrated_now = cfg.profile is None
    disturbed: list[str] = []
    if calibrated_now:
        path, disturbed = calibrate_now(cfg, log)
        cfg = replace(cfg, profile=str(path))
    provenance = profile_provenance(cfg.profile, calibrated_now)
    if disturbed:  # the machine's state while the profile was measured, beside the result
        provenance["calibration_warnings"] = disturbed
    if "machine_warning" in provenance:  # before the runs, so the user can stop them
        log(f"pdlsim: warning: {provenance['machine_warning']}")
    cores = available_cores()
    heldout, refused = heldout_matrix(cfg, cores)
    planned = plan_matrix(cfg, gpu=gpu_configurations(cfg.gpu, cfg.profile, log))
    specs = heldout + mark_unseen(cfg.profile, [
        spec for spec in planned if not spec.oversubscribed(cores)
    ])  # fmt: skip
    refused += _refused_rows(planned, cores, cfg.modes)  # in the open, with the held-out ones
    if not specs:  # checks.check_fits refuses the flags that lead here; nothing to measure
        raise UserError(
            f"no configuration fits this machine's {cores} core(s): {'; '.join(refused)}; "
            "list --modes that fit"
        )
    check_unseen(cfg.profile, [s for s in specs if s.heldout])
    for line in refused:
        log(f"pdlsim: not run: {line}")
    predictions = [predict_spec(spec, cfg) for spec in specs]  # from the frozen profile
    steps = [
        steps_for(cfg, pred["band"]["p50_s"], spec.oversubscribed(cores))
        for spec, pred in zip(specs, predictions, strict=True)
    ]
    launches: list[list[dict[str, Any]]] = [[] for _ in specs]
    kernels = _frozen_profile(cfg.profile).model("kernels")  # the machine's speed, reported
    probes: list[dict[str, float]] = []

    def probe_machine() -> None:
        if kernels is not None:
            probes.append(probe(kernels))

    for k, round_order in enumerate(launch_rounds(len(specs), cfg.repeats)):
        probe_machine()
        for position, i in enumerate(round_order):
            launch = measure_launch(specs[i], cfg, steps[i], k)
            launches[i].append(launch)
            log(
                f"[launch {k + 1}/{cfg.repeats}, {position + 1}/{len(specs)}] {specs[i].label}: "
                f"measured {launch['median_s'] * 1e3:.3f} ms, predicted "
                f"{predictions[i]['band']['p50_s'] * 1e3:.3f} ms"
            )
    probe_machine()
    measured = [summarize_launches(launches[i], steps[i]) for i in range(len(specs))]
    rows = build_rows(list(zip(specs, measured, predictions, strict=True)), cores)
    sets = ablation_sets(cfg.corrections)
    log(f"predicting every configuration again with {len(sets)} correction sets ...")
    table = ablation(  # every set at ABLATION_SAMPLES, the chosen one too: bands compare
        rows,
        {
            name: [predict_spec(spec, cfg, corrections, ABLATION_SAMPLES) for spec in specs]
            for name, corrections in sets.items()
        },
        cfg.corrections,
    )
    report = {
        "provenance": {**provenance, "corrections": cfg.corrections},
        "cores": cores,
        "min_steps_per_run": cfg.steps,
        "warmup": "first max(5, 10%) steps of each launch discarded",
        "repeats": cfg.repeats,
        "interval": "min..max of the per-launch medians",
        "speedup": "throughput / throughput of P1T1 at the same batch per rank; model "
        "parallel: serial step / step at the same global batch (inference: serial forward)",
        "heldout": {
            "seed": cfg.seed,
            "workloads": sorted({s.model for s in specs if s.heldout}),
            "batches": sorted({s.batch for s in specs if s.heldout}),
            "refused": refused,
        },
        "machine_speed": machine_speed(probes),  # the machine's state, beside the results
        "elapsed_s": time.perf_counter() - started,
        "summary": summarize(rows),
        "by_ranks": by_ranks(rows, calibrated_ranks(cfg.profile)),
        "ablation": table,
        "rows": rows,
        "checkpoint": validate_checkpoint(cfg, log),  # pdlsim.validate.checkpoint
    }
    report["files"] = write_outputs(report, cfg.out)
    return report


ABLATION_SAMPLES = 10  # band samples of every correction set's predictions in the ablation


def _refused_rows(
    planned: list[RunSpec], cores: int, modes: tuple[tuple[int, int], ...]
) -> list[str]:
    """One line for each planned configuration too wide for the cores that no refused mode's
    line names already (the model-parallel rows' own P = 2 on one core)."""
    return [
        f"{spec.label} (P x T = {spec.procs * spec.threads} threads on {cores} cores)"
        for spec in planned
        if spec.oversubscribed(cores)
        and not (spec.parallel == "data" and (spec.procs, spec.threads) in modes)
    ]
