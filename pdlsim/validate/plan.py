"""What ``pdlsim validate`` runs: the held-out and the in-sample configurations.

* **In-sample** (:func:`plan_matrix`): the calibration's own workloads at its batches, every
  mode of ``cfg.modes``; model-parallel training and forward-only rows; one GPU copying in
  turn and prefetching, where a GPU and a GPU model are.
* **Held-out** (:func:`heldout_matrix`): random workloads of the supported layer kinds
  (:mod:`microbench.randomnets`) drawn from ``cfg.seed``, at batches drawn between and up to 4x
  beyond the calibrated ones, in every mode that fits the cores (the others refused in the open).
  :func:`check_unseen` refuses a profile that measured any of them.
* :func:`ablation_sets`: the correction sets every configuration is predicted again with.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import atomic_write_text

__all__ = [
    "FULL_BATCHES",
    "GPU_CHOICES",
    "HELDOUT_BATCHES",
    "MODES",
    "RunSpec",
    "ValidateConfig",
    "ablation_sets",
    "check_unseen",
    "draw_heldout",
    "heldout_matrix",
    "plan_matrix",
    "steps_for",
]

MODES = {(1, 1): "serial", (1, 2): "threads", (2, 1): "mpi", (2, 2): "hybrid", (4, 1): "mpi"}
GPU_CHOICES = ("auto", "on", "off")
FULL_BATCHES = (16, 32, 64)


@dataclass(frozen=True)
class RunSpec:
    """One configuration: a workload, P ranks x T threads, batch per rank (with ``parallel``
    "model": the batch all ranks share), training or forward-only ``inference``; on the CPU, or
    (``device`` "gpu", one rank) on a GPU, copying each batch in turn from pageable memory or,
    with ``prefetch``, from pinned memory one step ahead."""

    model: str
    procs: int
    threads: int
    batch: int
    parallel: str = "data"
    inference: bool = False
    device: str = "cpu"
    prefetch: bool = False
    heldout: bool = False  # a workload and batch the calibration never ran

    @property
    def name(self) -> str:
        """The workload's name: a preset's, or a workload file's stem."""
        return Path(self.model).stem

    @property
    def mode(self) -> str:
        if self.device == "gpu":
            return "gpu+prefetch" if self.prefetch else "gpu"
        if self.parallel == "model":
            return "model"
        return MODES.get((self.procs, self.threads), "hybrid" if self.threads > 1 else "mpi")

    @property
    def label(self) -> str:
        if self.device == "gpu":
            return f"{self.name}-gpu-b{self.batch}" + "-prefetch" * self.prefetch
        tags = "-model" * (self.parallel == "model") + "-inference" * self.inference
        return f"{self.name}-p{self.procs}t{self.threads}-b{self.batch}{tags}"

    @property
    def train_flags(self) -> tuple[str, ...]:
        """What ``pdlsim train`` needs beyond model, ranks, threads and batch."""
        flags = ("--parallel", self.parallel, *(["--inference"] if self.inference else []))
        if self.device == "gpu":
            flags += ("--device", "gpu", *(["--pinned", "--prefetch"] if self.prefetch else []))
        return flags

    def oversubscribed(self, cores: int) -> bool:
        return self.procs * self.threads > cores


@dataclass(frozen=True)
class ValidateConfig:
    out: Path
    profile: str | None = None
    repeats: int = 3
    steps: int = 40
    quick: bool = False
    models: tuple[str, ...] = ("mlp", "cnn")
    modes: tuple[tuple[int, int], ...] = tuple(MODES)
    batches: tuple[int, ...] = FULL_BATCHES
    # Band samples per prediction. With 20, a row's P50 moved 1.6-2.5% from one seed to the
    # next (the 06:38 span profile, 5 seeds); with 100, 0.5-0.9%. Validation errors are a few
    # percent, so the estimate's own noise must be well below that.
    band_samples: int = 60
    target_run_s: float = 2.0  # timed seconds per launch: steps = target / predicted step
    max_steps: int = 300
    parallel: tuple[str, ...] = ("data", "model")
    model_procs: tuple[int, ...] = (2,)  # ranks of the model-parallel configurations
    gpu: str = "auto"  # GPU configurations: auto (where a GPU and a GPU model are), on, off
    seed: int = 0  # draws the held-out workloads and batches
    heldout_workloads: int = 9  # random workloads: MLPs, CNNs, residual CNNs, transformers in turn
    heldout_batches: int = 2  # batches per held-out workload
    corrections: str = "all"  # the named corrections of the headline (pdlsim.costmodel.corrections)


def steps_for(cfg: ValidateConfig, predicted_step_s: float, oversubscribed: bool = False) -> int:
    """Steps per launch: enough for ``target_run_s`` at the *predicted* step time (short MLP
    steps need many to settle), between ``cfg.steps`` and ``cfg.max_steps``; ``cfg.steps`` when
    oversubscribed (the model assumes a core per thread, so its step is no guide there: an
    oversubscribed step can run tens of times slower, and hundreds of them would take minutes;
    evidence: docs/evidence.md, "Compute")."""
    if oversubscribed:
        return cfg.steps
    wanted = math.ceil(cfg.target_run_s / max(predicted_step_s, 1e-6))
    return int(min(max(wanted, cfg.steps), max(cfg.max_steps, cfg.steps)))


def plan_matrix(cfg: ValidateConfig, gpu: bool = False) -> list[RunSpec]:
    """Every (model, mode, batch); --quick keeps all batches for the first model only and the
    middle batch for the others (so at least one workload still has three batch sizes).

    With "model" in ``cfg.parallel``, model-parallel training and inference at each of
    ``cfg.model_procs`` for every (model, batch); --quick: the first model's largest batch
    only. Without "data", the serial runs alone stay, as their baseline. With ``gpu``, one GPU
    without and with prefetch at every (model, batch) of the serial runs."""
    specs = []
    modes = cfg.modes if "data" in cfg.parallel else ((1, 1),)
    for model in cfg.models:
        batches = cfg.batches
        if cfg.quick:
            batches = (sorted(cfg.batches)[len(cfg.batches) // 2],)
        for batch in batches:
            for procs, threads in modes:
                specs.append(RunSpec(model, procs, threads, batch))
            if gpu:
                specs += [
                    RunSpec(model, 1, 1, batch, device="gpu", prefetch=ahead)
                    for ahead in (False, True)
                ]
    if "model" in cfg.parallel:
        models, batches = cfg.models, cfg.batches
        if cfg.quick:
            models, batches = cfg.models[:1], (max(cfg.batches),)
        for model in models:
            for batch in batches:
                for procs in cfg.model_procs:
                    specs += [
                        RunSpec(model, procs, 1, batch, "model", inf) for inf in (False, True)
                    ]
    return specs


HELDOUT_BATCHES = (8, 12, 24, 48, 96, 128, 256)  # between and up to 4x beyond 16, 32, 64
# The held-out networks: chains and graphs (residual CNNs, transformers on tokens), drawn from the
# validation's seed, a stream the step benchmark's random networks never draw from.
HELDOUT_KINDS = ("mlp", "cnn", "res", "tfm")


def heldout_matrix(cfg: ValidateConfig, cores: int) -> tuple[list[RunSpec], list[str]]:
    """The held-out configurations: :func:`microbench.randomnets.random_workloads` drawn from
    ``cfg.seed`` (written to ``OUT/workloads/``), each at ``cfg.heldout_batches`` batches
    drawn from :data:`HELDOUT_BATCHES` less the calibration's, in every mode of ``cfg.modes``
    that fits the cores; with "model" in ``cfg.parallel``, the first two also split layer-wise
    over 2 ranks (training). Returns the configurations and one line for each mode refused
    because it does not fit the cores, and for each layer-wise row that cannot run (a network
    too short to split, one core): listed in the open, never dropped silently."""
    from microbench.nn.sliced import check_splittable

    folder = cfg.out / "workloads"
    folder.mkdir(parents=True, exist_ok=True)
    modes = cfg.modes if "data" in cfg.parallel else ((1, 1),)
    refused = [
        f"{p}x{t} (P x T = {p * t} threads on {cores} cores): every configuration in it "
        "would measure the machine's oversubscription, which the model does not describe"
        for p, t in modes
        if p * t > cores
    ]
    specs = []
    for i, (workload, chosen) in enumerate(draw_heldout(cfg)):
        path = folder / f"{workload.name}.json"
        atomic_write_text(path, json.dumps(workload.to_dict(), indent=1) + "\n")
        for batch in chosen:
            specs += [
                RunSpec(str(path), p, t, batch, heldout=True) for p, t in modes if p * t <= cores
            ]
        if "model" in cfg.parallel and i < 2:
            try:
                check_splittable(workload, 2)
            except UserError as exc:  # the drawn network has too few layers to split
                refused.append(f"{workload.name} model-parallel (P=2): {exc}")
                continue
            if cores < 2:
                refused.append(f"{workload.name} model-parallel (P=2): 2 ranks on {cores} core")
                continue
            specs.append(RunSpec(str(path), 2, 1, chosen[0], "model", heldout=True))
    return specs, refused


def draw_heldout(cfg: ValidateConfig) -> list[tuple[Any, tuple[int, ...]]]:
    """The held-out workloads drawn from ``cfg.seed`` (:func:`microbench.randomnets.
    random_workloads`), each with its ``cfg.heldout_batches`` batches drawn from
    :data:`HELDOUT_BATCHES` less the calibration's (a UserError where ``--batches`` leaves too
    few); nothing written, so that the draw can be checked (names, memory, the profile) before
    any work."""
    import numpy as np

    from microbench.randomnets import random_workloads

    batches = [b for b in HELDOUT_BATCHES if b not in cfg.batches]
    if len(batches) < cfg.heldout_batches:  # numpy's choice would fail with a traceback
        left = ", ".join(map(str, batches)) or "none"
        raise UserError(
            f"--batches {','.join(map(str, cfg.batches))} leaves {left} of the held-out batches "
            f"({', '.join(map(str, HELDOUT_BATCHES))}), and each held-out workload draws "
            f"{cfg.heldout_batches} the calibration never ran; list fewer of them in --batches"
        )
    rng = np.random.default_rng(cfg.seed + 1)
    drawn = random_workloads(cfg.seed, cfg.heldout_workloads, HELDOUT_KINDS)
    return [
        (w, tuple(sorted(int(b) for b in rng.choice(batches, cfg.heldout_batches, replace=False))))
        for w in drawn
    ]


def mark_unseen(profile: str, specs: list[RunSpec]) -> list[RunSpec]:
    """``specs`` with ``heldout`` set where the profile holds no measurement of the workload
    nor of the batch (a workload named by ``--models`` that the calibration never ran, at a
    batch it never ran, is held out as a drawn one is)."""
    text, batches = _measured(profile)
    return [replace(s, heldout=s.heldout or _unseen(s, text, batches)) for s in specs]


def check_unseen(profile: str, specs: list[RunSpec]) -> None:
    """UserError unless the profile holds no measurement of a held-out workload (its name
    anywhere in the document) or batch (a ``batch`` or ``batches`` field)."""
    text, batches = _measured(profile)
    for spec in specs:
        if not _unseen(spec, text, batches):
            raise UserError(
                f"held-out configuration {spec.label} is not held out: the profile "
                f"{profile} measured its workload or its batch; draw another --seed"
            )


def _unseen(spec: RunSpec, text: str, batches: set[int]) -> bool:
    """Neither the spec's workload (its name anywhere in the profile's ``text``) nor its batch
    was measured."""
    return f'"{spec.name}"' not in text and spec.batch not in batches


def _measured(profile: str) -> tuple[str, set[int]]:
    """The profile as JSON text (where a measured workload's name appears) and the batches
    it measured (its ``batch`` and ``batches`` fields), read from that text: a walk of the
    document visits every number of its kernel tables."""
    from calibration.profile import load_profile

    text = load_profile(profile).to_json()
    batches: set[int] = set()
    for match in _BATCH_FIELD.finditer(text):
        found = json.loads(match.group(1))
        for value in found if isinstance(found, list) else [found]:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                batches.add(value)
    return text, batches


# A "batch" or "batches" field and its value: a number or a flat list of them.
_BATCH_FIELD = re.compile(r'"batch(?:es)?": (\[[^\[\]{}]*\]|-?[0-9][0-9.eE+-]*)')


def ablation_sets(chosen: str) -> dict[str, str]:
    """The correction sets the report compares: the chosen one, none, all, and the chosen
    one without each of its terms."""
    from pdlsim.costmodel.corrections import CORRECTIONS, parse_corrections

    on = parse_corrections(chosen)
    sets = {chosen: chosen, "none": "none", "all": "all"}
    for name in CORRECTIONS:
        if name in on and len(on) > 1:
            sets[f"{chosen} - {name}"] = ",".join(sorted(on - {name}))
    return sets
