"""The machine's speed over the span of a validation: speed checks between its training launches.

A calibration lasts two minutes; the training runs it is checked against last ten or more. On a
machine whose speed switches between levels (:mod:`calibration.drift`) the two minutes may see
mostly one level and the runs mostly the other, and every prediction is then off by the ratio
of the levels however right the model is. So ``pdlsim validate`` runs the same brief speed
check the calibration runs (``python -m microbench speed``: each workload's step at every
validated batch and at every thread count of the runs that fit the cores) before the first
launch, after every
:data:`CHECK_EVERY_LAUNCHES` launches and after the last, into ``OUT/speed/speed.jsonl``,
and predicts from the calibrated profile with those moments added to its drift model as its
span (:func:`span_profile`, written to ``OUT/profile-span.json``): each step's typical time,
speed band and forward-only share are then those of the hour the runs took, from the span's
checks alone (:mod:`calibration.drift`); where the runs include a GPU, each check times the GPU
steps at its rows' batches too, so that theirs are as well. Where the runs include 2 ranks that
fit the cores, each check also times the jitter step at 2 ranks (``microbench jitter
--moment``), and its moments join the jitter models'
(:meth:`calibration.jitter.JitterModel.add_moments`): the 2-rank sync is then the typical skew
of the span, not of the calibration's three moments, two minutes long (the CNN's skew moved
between 3.6% and 8.5% from one moment to the next), and so do the co-location factors'
(:meth:`calibration.colocation.ColocationModel.add_moments`). These are microbenchmarks like
the calibration's, never a training run; the report keeps the predictions from the
calibration's moments alone next to these.
"""

from __future__ import annotations

import os
from pathlib import Path

from microbench.errors import UserError

__all__ = ["CHECK_EVERY_LAUNCHES", "SpeedChecks", "span_profile"]

CHECK_EVERY_LAUNCHES = 5


JITTER_CHECK_SAMPLES = 33  # steps per rank of a check's 2-rank jitter run (the bench's: 66)


class SpeedChecks:
    """Numbered speed checks into ``out/speed.jsonl`` (the first creates it), also of the GPU
    steps at ``gpu_batches`` (the GPU rows' batches); with ``jitter_ranks`` 2 or more, every
    ``jitter_every``-th check from the first also times the jitter step at that many ranks into
    ``out/jitter.jsonl``, labelled with the same moment (4.6 s a check here for both
    workloads: ``--quick`` takes every other one)."""

    def __init__(
        self,
        out: Path,
        models: tuple[str, ...],
        batches: tuple[int, ...],
        threads: tuple[int, ...] = (1,),
        jitter_ranks: int = 1,
        jitter_every: int = 1,
        gpu_batches: tuple[int, ...] = (),
    ) -> None:
        self.out, self.models, self.batches, self.threads = out, models, batches, threads
        self.gpu_batches = gpu_batches
        self.jitter_ranks, self.jitter_every = jitter_ranks, jitter_every
        self.done = 0

    def run(self) -> None:
        from microbench.threads import thread_env
        from pdlsim.bench import speed_command
        from pdlsim.launch import run_supervised

        self.done += 1
        command = speed_command(
            ",".join(self.models), self.batches, f"validation {self.done}", self.out,
            append=self.done > 1, threads=self.threads, gpu_batches=self.gpu_batches,
        )  # fmt: skip
        self.out.mkdir(parents=True, exist_ok=True)
        log = self.out / "speed.log"
        env = {**os.environ, **thread_env(max(self.threads))}
        commands = [command, *self._jitter_commands()]
        with log.open("a") as handle:
            for command in commands:
                status = run_supervised(command, env, stdout=handle, stderr=handle)
                if status != 0:
                    raise UserError(
                        f"speed check {self.done} failed with status {status}; see {log}"
                    )

    def _jitter_commands(self) -> list[list[str]]:
        """The jitter step of every model at ``jitter_ranks`` ranks, one thread, at the
        bench's jitter batch (the middle one), labelled with this check's moment."""
        if self.jitter_ranks < 2 or (self.done - 1) % self.jitter_every:
            return []
        from pdlsim.launch import mpiexec_command

        batch = sorted(self.batches)[len(self.batches) // 2]
        return [
            mpiexec_command(self.jitter_ranks, [
                "-m", "microbench", "jitter", "--model", model, "--batch", str(batch),
                "--threads", "1", "--moment", f"validation {self.done}",
                "--samples", str(JITTER_CHECK_SAMPLES), "--out", str(self.out),
                *(["--append"] if self.done > 1 or k else []),
            ])
            for k, model in enumerate(self.models)
        ]  # fmt: skip


def span_profile(profile: str, speed_dir: Path, out: Path) -> Path:
    """``profile`` with the speed records under ``speed_dir`` added to its drift model, saved at
    ``out``; its sources name both."""
    from calibration.drift import DriftModel
    from calibration.profile import Profile, read_sources
    from microbench.records import load_dataframe
    from pdlsim.predict import resolve_profile

    base, _ = resolve_profile(profile)
    records = load_dataframe(speed_dir, type="measurement")
    drift = base.model("drift") if base.models.get("drift") else DriftModel()
    models = {**base.models, "drift": drift.add_moments(records, span=True)}
    quality = {**base.fit_quality, "drift": drift.quality_dict()}
    for name in ("jitter", "jitter_models", "colocation"):  # the span's 2-rank jitter moments
        if base.models.get(name):
            models[name] = base.model(name).add_moments(records)
            quality[name] = models[name].quality_dict()
    _, sources = read_sources([speed_dir])
    spanned = Profile.from_models(models, base.machine, (*base.sources, *sources), quality)
    return spanned.save(out)
