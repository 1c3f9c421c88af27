"""The machine's speed over the span of a validation: speed checks between its training launches.

A calibration lasts two minutes; the training runs it is checked against last ten or more. On a
machine whose speed switches between levels (:mod:`calibration.drift`) the two minutes may see
mostly one level and the runs mostly the other, and every prediction is then off by the ratio
of the levels however right the model is. So ``pdlsim validate`` runs the same brief speed
check the calibration runs (``python -m microbench speed``: each workload's step at every
validated batch and at every thread count of the runs that fit the cores) before the first
launch, after every
:data:`CHECK_EVERY_LAUNCHES` launches and after the last, into ``OUT/speed/speed.jsonl``,
and predicts from the calibrated profile with those moments added to its drift model
(:func:`span_profile`, written to ``OUT/profile-span.json``): each step's typical time and the
band are then those of the hour the runs took. This is a microbenchmark like the
calibration's, never a training run; the report keeps the predictions from the calibration's
moments alone next to these.
"""

from __future__ import annotations

import os
from pathlib import Path

from microbench.errors import UserError

__all__ = ["CHECK_EVERY_LAUNCHES", "SpeedChecks", "span_profile"]

CHECK_EVERY_LAUNCHES = 5


class SpeedChecks:
    """Numbered speed checks into ``out/speed.jsonl`` (the first creates it)."""

    def __init__(
        self,
        out: Path,
        models: tuple[str, ...],
        batches: tuple[int, ...],
        threads: tuple[int, ...] = (1,),
    ) -> None:
        self.out, self.models, self.batches, self.threads = out, models, batches, threads
        self.done = 0

    def run(self) -> None:
        from microbench.threads import thread_env
        from pdlsim.bench import speed_command
        from pdlsim.launch import run_supervised

        self.done += 1
        command = speed_command(
            ",".join(self.models), self.batches, f"validation {self.done}", self.out,
            append=self.done > 1, threads=self.threads,
        )  # fmt: skip
        self.out.mkdir(parents=True, exist_ok=True)
        log = self.out / "speed.log"
        env = {**os.environ, **thread_env(max(self.threads))}
        with log.open("a") as handle:
            status = run_supervised(command, env, stdout=handle, stderr=handle)
        if status != 0:
            raise UserError(f"speed check {self.done} failed with status {status}; see {log}")


def span_profile(profile: str, speed_dir: Path, out: Path) -> Path:
    """``profile`` with the speed records under ``speed_dir`` added to its drift model, saved at
    ``out``; its sources name both."""
    from calibration.drift import DriftModel
    from calibration.profile import Profile, read_sources
    from microbench.records import load_dataframe
    from pdlsim.predict import resolve_profile

    base, _ = resolve_profile(profile)
    drift = base.model("drift") if base.models.get("drift") else DriftModel()
    drift.add_moments(load_dataframe(speed_dir, type="measurement"))
    _, sources = read_sources([speed_dir])
    spanned = Profile.from_models(
        {**base.models, "drift": drift},
        base.machine,
        (*base.sources, *sources),
        {**base.fit_quality, "drift": drift.quality_dict()},
    )
    return spanned.save(out)
