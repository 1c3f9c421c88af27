"""Output that agrees with itself: the printed step time sits inside its own band, and one
configuration gets the same band from ``predict`` and ``sweep``."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from pdlsim.cli.main import main
from pdlsim.cli.sweep import sweep
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.core import run_prediction

QUICK = PredictConfig(iterations=20, samples=7)
CONFIGS = {
    "cpu ranks": replace(QUICK, nodes=4, procs_per_node=2),
    "cpu hybrid threads": replace(QUICK, nodes=2, threads=2, model="mlp"),
    "gpus": replace(QUICK, nodes=2, gpus=4),
    "one gpu": replace(QUICK, gpus=1, model="mlp", batch=64),
    "model parallel": replace(QUICK, nodes=1, gpus=4, parallel="model", model="mlp"),
    "pipeline": replace(QUICK, nodes=2, gpus=2, parallel="pipeline", stages=2, microbatches=4),
    "inference": replace(QUICK, nodes=2, gpus=2, inference=True),
    "slow ranks": replace(QUICK, nodes=4, gpus=1, slow_ranks=1, slow_factor=2.0),
    "fp16, local sgd": replace(QUICK, nodes=4, gpus=2, compression="fp16", sync_every=2),
    "slow network": replace(QUICK, nodes=4, procs_per_node=1, network_scale=0.1),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_step_time_is_the_bands_p50_in_every_mode(name):
    out = run_prediction(CONFIGS[name])
    band, step = out["band"], out["step_time_s"]
    assert band["p10_s"] <= step <= band["p90_s"], name
    assert band["p50_s"] == step
    assert band["p10_s"] < band["p90_s"]  # the draws' spread is kept, not collapsed


def test_sweep_rows_have_predicts_band_and_keep_the_step_inside_it():
    base = replace(QUICK, gpus=2)
    frame = sweep(base, (1, 2), (2,), (16, 32))
    assert (frame["p10_s"] <= frame["step_time_s"]).all()
    assert (frame["step_time_s"] <= frame["p90_s"]).all()
    for row in frame.itertuples():
        out = run_prediction(replace(base, nodes=row.nodes, batch=row.batch))
        assert out["step_time_s"] == row.step_time_s
        assert out["band"] == {"p10_s": row.p10_s, "p50_s": row.p50_s, "p90_s": row.p90_s}


def test_predict_and_sweep_default_to_the_same_band(tmp_path, capsys):
    args = ["--nodes", "2", "--procs-per-node", "2", "--iterations", "20"]
    assert main(["predict", *args, "--json"]) == 0
    import json

    band = json.loads(capsys.readouterr().out)["band"]
    assert main(["sweep", *args, "--out", str(tmp_path)]) == 0
    row = pd.read_csv(tmp_path / "sweep.csv").iloc[0]
    assert row["p10_s"] == pytest.approx(band["p10_s"], rel=1e-12)
    assert row["p90_s"] == pytest.approx(band["p90_s"], rel=1e-12)
    assert row["p10_s"] <= row["step_time_s"] <= row["p90_s"]


def test_train_and_predict_share_one_epoch_per_workload(monkeypatch):
    """One definition (pdlsim.prediction.epoch): change it and both move."""
    from microbench.workload import load_workload
    from pdlsim.prediction import epoch
    from pdlsim.train.config import TrainConfig
    from pdlsim.train.epoch import prepare_data

    monkeypatch.setitem(epoch.DATASET_SAMPLES, "mlp", 96)
    train, _ = prepare_data(TrainConfig(model="mlp", test_samples=8), load_workload("mlp"))
    assert len(train.y) == 96
    assert run_prediction(replace(QUICK, model="mlp", samples=2))["dataset_samples"] == 96


def test_train_summary_reports_the_steady_step_and_the_warm_up_apart():
    """A first step that compiles (60 ms) must not be averaged into a 0.2 ms step."""
    from pathlib import Path

    from pdlsim.cli.train_summary import format_summary
    from pdlsim.train.config import TrainConfig
    from pdlsim.train.loop import PHASES, EpochResult, TrainResult

    def step(forward_s: float) -> dict[str, float]:
        return {name: (forward_s if name == "forward" else 0.0) for name in PHASES}

    steps = [step(0.060)] + [step(0.0002)] * 99
    mean = {name: sum(s[name] for s in steps) / len(steps) for name in PHASES}
    epoch = EpochResult(0, 100, 1.0, 0.5, 0.5, 0.08, 400.0, mean, 1, None,
                        {"weights": 1, "total": 1})  # fmt: skip
    result = TrainResult(TrainConfig(), Path("run"), [epoch], step_phases_s=steps)
    text = format_summary(result)
    assert "step time 0.20 ms in steady state (rank 0, mean of 90 steps after 10 warm-up" in text
    assert "warm-up steps of 6.18 ms mean" in text  # (60 + 9 x 0.2) / 10
    assert "forward        0.200   100.0%" in text
