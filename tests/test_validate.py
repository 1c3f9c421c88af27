"""``pdlsim validate``: a tiny real run (MLP, serial + threads, few steps) and bad input."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from pdlsim.cli import main
from pdlsim.validate import (
    RunSpec,
    ValidateConfig,
    plan_matrix,
    run_validation,
    steps_for,
    warmup_steps,
)
from pdlsim.validate_report import COLUMNS

PROFILE = str(Path(__file__).resolve().parents[1] / "calibration" / "profiles" / "xeon-2core.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("validate") / "report"
    cfg = ValidateConfig(
        out=out, profile=PROFILE, repeats=1, steps=12, models=("mlp",), modes=((1, 1), (1, 2)),
        batches=(16,), band_samples=4, target_run_s=0.01, max_steps=12,
    )  # fmt: skip
    return out, run_validation(cfg, log=lambda s: None)


def test_tiny_run_writes_csv_json_and_plots(tiny: tuple[Path, dict]) -> None:
    out, report = tiny
    with (out / "validation.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and tuple(rows[0]) == COLUMNS
    doc = json.loads((out / "validation.json").read_text())
    assert doc["schema"] == "pdlsim.validation"
    assert doc["provenance"]["profile"] == PROFILE
    assert "microbenchmarks" in doc["provenance"]["source"]
    for row in doc["rows"]:
        m, p = row["measured_s"], row["predicted_p50_s"]
        assert m > 0 and p > 0
        assert math.isclose(row["rel_error"], abs(p - m) / m, rel_tol=1e-12)
        assert row["in_band"] == (row["predicted_p10_s"] <= m <= row["predicted_p90_s"])
        assert row["measured_low_s"] <= m <= row["measured_high_s"]
        assert row["oversubscribed"] is False
    serial = next(r for r in doc["rows"] if r["threads"] == 1)
    assert serial["measured_speedup"] == pytest.approx(1.0)
    for name in ("speedup-mlp.png", "parity.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "runs" / "mlp-p1t2-b16" / "r0" / "rank0.jsonl").exists()


def test_matrix_quick_keeps_three_batches_and_flags_oversubscription(tmp_path: Path) -> None:
    specs = plan_matrix(ValidateConfig(out=tmp_path, quick=True))
    mlp_batches = {s.batch for s in specs if s.model == "mlp"}
    assert len(mlp_batches) >= 3 and {s.model for s in specs} == {"mlp", "cnn"}
    modes = {(s.procs, s.threads) for s in specs}
    assert modes == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert RunSpec("mlp", 4, 1, 32).oversubscribed(2) and not RunSpec(
        "mlp", 2, 1, 32
    ).oversubscribed(2)
    assert warmup_steps(100) == 10 and warmup_steps(20) == 5 and warmup_steps(3) == 2
    assert steps_for(ValidateConfig(out=tmp_path, steps=20, max_steps=300), 1e-3) == 300


@pytest.mark.parametrize(
    "argv",
    [
        ["--profile", "no-such-profile"],
        ["--repeats", "0"],
        ["--modes", "1y1"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv, tmp_path: Path, capsys) -> None:
    try:
        status = main(["validate", "--out", str(tmp_path / "o"), *argv])
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err


def test_out_is_a_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    assert main(["validate", "--profile", PROFILE, "--out", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file" in err
