"""``pdlsim validate``: a tiny real run (MLP, serial + threads, few steps) and bad input."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from microbench.errors import UserError
from microbench.records import SCHEMA, SCHEMA_VERSION, TruncatedRecordWarning
from microbench.workload import load_workload
from pdlsim.cli.main import main
from pdlsim.validate.calibrate import calibrated_ranks
from pdlsim.validate.report import COLUMNS, by_ranks, format_report
from pdlsim.validate.run import (
    RunSpec,
    ValidateConfig,
    plan_matrix,
    run_validation,
    steps_for,
    warmup_steps,
)
from tests.profiles import STEP_TABLES

pytestmark = pytest.mark.long_module  # its validations take most of a minute

PROFILE = str(STEP_TABLES)
TINY_LOG: list[str] = []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("validate") / "report"
    cfg = ValidateConfig(
        out=out, profile=PROFILE, repeats=2, steps=12, models=("mlp",), modes=((1, 1), (1, 2)),
        batches=(16,), band_samples=4, target_run_s=0.01, max_steps=12, parallel=("data",),
        heldout_workloads=1, heldout_batches=1,
    )  # fmt: skip
    return out, run_validation(cfg, log=TINY_LOG.append)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """``--parallel model`` alone: the serial baseline, then P = 2 training and inference."""
    out = tmp_path_factory.mktemp("validate") / "model"
    cfg = ValidateConfig(
        out=out, profile=PROFILE, repeats=1, steps=12, models=("mlp",), modes=((2, 2),),
        batches=(16,), band_samples=4, target_run_s=0.01, max_steps=12, parallel=("model",),
        heldout_workloads=0,
    )  # fmt: skip
    return out, run_validation(cfg, log=lambda s: None)


def test_tiny_run_writes_csv_json_and_plots(tiny: tuple[Path, dict]) -> None:
    out, report = tiny
    with (out / "validation.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and tuple(rows[0]) == COLUMNS
    assert [r["set"] for r in rows] == ["held-out", "held-out", "in-sample", "in-sample"]
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
        # CPU steal while it ran (None where /proc/stat has no steal column)
        assert row["steal_max"] is None or 0.0 <= row["steal_max"] <= 1.0
        # memory: training's arrays are at least the weights and gradients predicted
        weights = 4 * load_workload(row["workload_file"]).param_count
        assert row["measured_model_state_bytes"] >= 2 * weights
        assert row["measured_peak_rss_bytes"] > row["measured_model_state_bytes"]
        assert row["predicted_memory_bytes"] > 2 * weights
        # energy: one power model on the measured and on the predicted step and compute time,
        # so the two stand in the ratio of their node joules per step, whatever the noise
        e_meas = row["measured_activity_energy_j_per_sample"]
        e_pred = row["predicted_energy_j_per_sample"]
        assert e_meas > 0 and e_pred > 0
        compute_s = sum(row[f"measured_{phase}_s"] for phase in ("forward", "backward", "update"))
        ratio = _node_joules(row, m, compute_s) / _node_joules(
            row, row["predicted_step_s"], row["predicted_compute_s"]
        )
        assert e_meas / e_pred == pytest.approx(ratio, rel=1e-9)
    serial = next(r for r in doc["rows"] if r["threads"] == 1)
    assert serial["measured_speedup"] == pytest.approx(1.0)
    for name in ("speedup-mlp.png", "parity.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "runs" / "mlp-p1t2-b16" / "r0" / "rank0.jsonl").exists()
    held = doc["heldout"]
    assert held["seed"] == 0 and len(held["workloads"]) == 1 and held["batches"][0] != 16
    assert doc["summary"]["held-out"]["configurations"] == 2
    assert [t["corrections"] for t in doc["ablation"]][:3] == ["all", "none", "all - glue"]


def test_the_report_leads_with_the_heldout_figures(tiny: tuple[Path, dict]) -> None:
    _, report = tiny
    lines = format_report(report).splitlines()
    assert lines[0].startswith("held-out (workloads and batches the calibration never ran): 2")
    assert lines[1].startswith("in-sample (the calibration's workloads and batches): 2")
    assert any(line.startswith("corrections ") and "held-out" in line for line in lines)


def test_the_table_prints_whole_workload_names(tiny: tuple[Path, dict]) -> None:
    """Two files named alike for twelve characters stay apart in the printed table."""
    _, report = tiny
    rows = [{**r, "model": f"my-long-workload-{i}"} for i, r in enumerate(report["rows"])]
    lines = format_report({**report, "rows": rows}).splitlines()
    table = [line for line in lines if "my-long-workload-" in line]
    assert [line.split()[1] for line in table] == [r["model"] for r in rows]
    at = next(line for line in lines if line.startswith("set ")).index(" mode") + 1
    assert all(line[at - 1] == " " and line[at] != " " for line in table)  # columns aligned


def _node_joules(row: dict, step_s: float, compute_s: float) -> float:
    """Joules per step of one node under validate's power model (one socket of this machine's
    cores) for a step and its compute time."""
    from microbench.threads import available_cores
    from pdlsim.prediction.energy import StepActivity, estimate_energy, power_model_for

    power = power_model_for(cpu_sockets=(1, available_cores()))
    activity = StepActivity(step_s, min(compute_s, step_s), 1, row["procs"], row["threads"], "cpu")
    return estimate_energy(activity, power, 1.0, 1)["joules_per_step"]


def test_matrix_quick_keeps_the_middle_batch_and_flags_oversubscription(tmp_path: Path) -> None:
    specs = plan_matrix(ValidateConfig(out=tmp_path, quick=True))
    data = {s.batch for s in specs if s.parallel == "data"}
    assert data == {32} and {s.model for s in specs} == {"mlp", "cnn"}
    modes = {(s.procs, s.threads) for s in specs}
    assert modes == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert RunSpec("mlp", 4, 1, 32).oversubscribed(2) and not RunSpec(
        "mlp", 2, 1, 32
    ).oversubscribed(2)
    assert warmup_steps(100) == 10 and warmup_steps(20) == 5 and warmup_steps(3) == 2
    cfg = ValidateConfig(out=tmp_path, steps=20, max_steps=300)
    assert steps_for(cfg, 1e-3) == 300 and steps_for(cfg, 0.05) == 40
    assert steps_for(cfg, 1e-3, oversubscribed=True) == 20  # no time budget from a collapse


@pytest.mark.parametrize(
    "argv",
    [
        ["--profile", "no-such-profile"],
        ["--repeats", "0"],
        ["--modes", "1y1"],
        ["--modes", "1x1,2x1,1x1"],  # twice: its runs would collide in one folder
        ["--modes", "1000x1000"],  # as train refuses it, not skipped as oversubscribed
        ["--batches", "100000000000"],
        ["--parallel", "pipeline"],
        ["--corrections", "magic"],
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
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_out_is_a_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    assert main(["validate", "--profile", PROFILE, "--out", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file" in err


def test_measured_sync_is_the_ranks_mean_wait_not_the_slowest_ranks(tmp_path: Path) -> None:
    """Two ranks, 20 steps (the first 5 discarded): rank 1 computes 3.5 ms and waits 0, rank
    0 computes 2.5 ms and waits 1 ms (its records say 0.1 ms less in all). The step is the
    slowest rank's (rank 1, 3.5 ms), its phases are rank 1's (wait 0), and the skew is the
    mean wait over ranks, 0.5 ms."""
    from pdlsim.validate.run import measured_step_times

    for rank, (compute, wait) in enumerate(((2.5e-3, 1e-3), (3.5e-3, 0.0))):
        lines = [
            json.dumps(
                {
                    "type": "train_step",
                    "rank": rank,
                    "global_step": step,
                    "step_s": compute + wait - 1e-4 * (rank == 0),
                    "phases_s": {"forward": compute, "wait": wait},
                }
            )  # fmt: skip
            for step in range(20)
        ]
        (tmp_path / f"rank{rank}.jsonl").write_text(HEADER + "\n".join(lines) + "\n")
    steps, phases = measured_step_times(tmp_path)
    assert len(steps) == 15 and steps == pytest.approx([3.5e-3] * 15)
    assert phases == pytest.approx({"forward": 3.5e-3, "wait": 0.0, "skew": 0.5e-3})


HEADER = json.dumps({"type": "header", "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                     "machine": {}, "run": {}}) + "\n"  # fmt: skip


def test_a_launchs_records_are_read_as_records_files_are(tmp_path: Path) -> None:
    """A last line cut off by a killed writer is skipped with a warning; a damaged line
    elsewhere is one line naming the file, not a traceback."""
    from pdlsim.validate.run import measured_step_times

    step = {"type": "train_step", "rank": 0, "step_s": 1e-3, "phases_s": {"forward": 1e-3}}
    lines = [json.dumps({**step, "global_step": i}) for i in range(8)]
    path = tmp_path / "rank0.jsonl"
    path.write_text(HEADER + "\n".join(lines) + '\n{"type": "train_st')
    with pytest.warns(TruncatedRecordWarning):
        steps, _ = measured_step_times(tmp_path)
    assert len(steps) == 8 - warmup_steps(8)
    path.write_text(HEADER + "\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(UserError, match=r"rank0\.jsonl:3: corrupt line.*a new --out"):
        measured_step_times(tmp_path)


def test_a_failed_launch_quotes_what_the_training_said(tmp_path: Path, monkeypatch) -> None:
    import pdlsim.train.launch
    from pdlsim.validate.measure import launch_train
    from pdlsim.validate.plan import RunSpec

    def failing(command, env, stdout, stderr):
        stderr.write("starting\npdlsim: error: --out: no space left on device\n\n")
        return 2

    monkeypatch.setattr(pdlsim.train.launch, "run_supervised", failing)
    with pytest.raises(UserError, match=r"status 2 \(pdlsim: error: --out: no space left"):
        launch_train(RunSpec("mlp", 1, 1, 8), 3, tmp_path / "r0")


def test_breakdown_table_has_a_line_per_configuration(tiny: tuple[Path, dict]) -> None:
    from pdlsim.validate.report import format_breakdown

    _, report = tiny
    lines = format_breakdown(report["rows"]).splitlines()
    assert len(lines) == 2 + len(report["rows"])
    assert "peak RSS" in lines[0] and "pred mJ" in lines[1]
    assert "consistency check" in lines[0]  # the energy columns say what they are
    assert all(" P1T" in line for line in lines[2:])


def test_model_parallel_rows_say_their_mode_and_scale_against_serial(tiny_model) -> None:
    """Strong scaling: speedup = serial step / step at the same (global) batch; inference
    against the serial run's forward part; predicted against the prediction's one-rank step."""
    out, report = tiny_model
    rows = {(r["parallel"], r["inference"], r["procs"]): r for r in report["rows"]}
    assert all(r["set"] == "in-sample" for r in report["rows"])
    assert set(rows) == {("data", False, 1), ("model", False, 2), ("model", True, 2)}
    serial, train, infer = rows["data", False, 1], rows["model", False, 2], rows["model", True, 2]
    assert train["mode"] == infer["mode"] == "model" and train["batch"] == 16
    assert train["measured_speedup"] == pytest.approx(serial["measured_s"] / train["measured_s"])
    forward = sum(serial[f"measured_{p}_s"] for p in ("data", "h2d", "forward"))
    assert infer["measured_speedup"] == pytest.approx(forward / infer["measured_s"])
    for row in (train, infer):
        assert row["predicted_speedup"] == pytest.approx(
            row["predicted_serial_s"] / row["predicted_p50_s"]
        )
        assert row["measured_allgather_s"] > 0 and row["predicted_comm_s"] > 0
        # each rank holds about half of the 235,146 weights
        assert 4 * 235_146 / 2 < row["measured_model_state_bytes"] < 3 * 4 * 235_146
    assert train["measured_allreduce_s"] > 0 and train["measured_backward_s"] > 0
    assert infer["measured_allreduce_s"] == infer["measured_backward_s"] == 0.0
    assert infer["predicted_serial_s"] < train["predicted_serial_s"]  # forward only
    with (out / "validation.csv").open() as handle:
        csv_rows = list(csv.DictReader(handle))
    assert [r["parallel"] for r in csv_rows] == ["data", "model", "model"]
    for name in ("speedup-mlp-model.png", "speedup-mlp-model-inference.png", "parity.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "runs" / "mlp-p2t1-b16-model-inference" / "r0" / "rank1.jsonl").exists()
    text = format_report(report)
    assert "model-inf" in text and "model parallel: serial step" in text


def test_matrix_adds_two_quick_model_parallel_configurations(tmp_path: Path) -> None:
    base = plan_matrix(ValidateConfig(out=tmp_path, quick=True, parallel=("data",)))
    both = plan_matrix(ValidateConfig(out=tmp_path, quick=True))
    added = [s for s in both if s not in base]
    assert added == [
        RunSpec("mlp", 2, 1, 64, "model", False),
        RunSpec("mlp", 2, 1, 64, "model", True),
    ]
    assert added[1].label == "mlp-p2t1-b64-model-inference"
    full = plan_matrix(ValidateConfig(out=tmp_path))
    assert sum(s.parallel == "model" for s in full) == 2 * 3 * 2  # models x batches x modes


def test_checkpoint_writes_are_measured_and_predicted_from_the_same_profile(tiny) -> None:
    """``pdlsim train --checkpoint-every 4`` on the serial MLP: the median of rank 0's
    ``write_s`` against ``pdlsim predict``'s ``checkpoint_cost_s`` from the validation's profile."""
    import statistics

    from calibration.profile import load_profile
    from pdlsim.validate.checkpoint import CHECKPOINTS, EVERY_STEPS, STEPS, measured_checkpoints

    out, report = tiny
    doc = report["checkpoint"]
    records = measured_checkpoints(Path(doc["run_dir"]))
    writes = [r["write_s"] for r in records]
    assert [r["global_step"] for r in records] == list(range(EVERY_STEPS, STEPS + 1, EVERY_STEPS))
    assert doc["checkpoints"] == len(writes) == CHECKPOINTS == 10
    assert doc["measured_s"] == statistics.median(writes) > 0
    assert (doc["measured_low_s"], doc["measured_high_s"]) == (min(writes), max(writes))
    weights = 4 * 235_146  # plain SGD: the checkpoint holds the weights (and a small header)
    assert doc["predicted_state_bytes"] == weights < doc["file_bytes"] < weights + 64 * 1024
    bandwidth = doc["predicted_write_bytes_per_s"] or math.inf
    assert doc["predicted_s"] == pytest.approx(doc["predicted_latency_s"] + weights / bandwidth)
    has_storage = load_profile(PROFILE).models.get("storage") is not None
    assert (doc["cost_source"] == "profile (storage)") == has_storage
    if not has_storage:
        assert doc["predicted_s"] == pytest.approx(0.01 + weights / 1e9)  # the stated defaults
    m = doc["measured_s"]
    assert doc["rel_error"] == pytest.approx(abs(doc["predicted_s"] - m) / m, rel=1e-12)
    assert json.loads((out / "validation.json").read_text())["checkpoint"] == doc
    line = next(s for s in format_report(report).splitlines() if s.startswith("checkpoint write"))
    assert f"{m * 1e3:.3f} ms" in line and doc["cost_source"] in line


def test_launches_go_round_robin_over_the_configurations(tiny: tuple[Path, dict]) -> None:
    """Every configuration's first launch before any second one: a configuration's launches
    are apart in time, so its interval sees the machine at different moments."""
    out, report = tiny
    launches = [line.split("]")[0] for line in TINY_LOG if line.startswith("[launch")]
    assert launches == [f"[launch {k}/2, {i}/4" for k in (1, 2) for i in range(1, 5)]
    labels = [line.split("] ")[1].split(":")[0] for line in TINY_LOG if line.startswith("[launch")]
    assert labels[4:] == labels[2:4] + labels[:2]  # the second round starts half-way along
    for row in report["rows"]:
        assert len(row["launch_medians_s"]) == 2
        assert row["measured_low_s"] <= row["measured_s"] <= row["measured_high_s"]
    assert sorted(p.name for p in (out / "runs").glob("mlp-p1t*-b16/r*") if p.is_dir()) == [
        "r0", "r0", "r1", "r1"
    ]  # fmt: skip


@pytest.mark.parametrize("n, repeats", [(42, 3), (14, 3), (2, 2), (5, 1), (3, 5)])
def test_each_round_launches_every_configuration_once_from_a_new_start(
    n: int, repeats: int
) -> None:
    """Every round is the list rotated, each starting n / repeats further along, so that the
    configurations at the end of one round are not at the end of the next."""
    from pdlsim.validate.run import launch_rounds

    rounds = launch_rounds(n, repeats)
    assert len(rounds) == repeats
    starts = [r[0] for r in rounds]
    for order, start in zip(rounds, starts, strict=True):
        assert order == [(start + i) % n for i in range(n)]
    assert starts == [k * n // repeats for k in range(repeats)]
    if repeats <= n:
        assert len(set(starts)) == repeats  # no two rounds alike
    if (n, repeats) == (42, 3):  # the full matrix: the last configuration ends round 1 only
        assert [r.index(41) for r in rounds] == [41, 27, 13]


def test_elapsed_counts_the_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --profile, the reported time is what the user waited for: calibration included
    (a calibration that takes an hour on validate's clock, and returns the packaged profile)."""
    import time
    from types import SimpleNamespace

    import pdlsim.validate.calibrate as validate_calibrate
    import pdlsim.validate.run

    hour_s = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + hour_s[0])
    monkeypatch.setattr(pdlsim.validate.run, "time", clock)

    def hour_long_calibration(cfg: ValidateConfig, log: object) -> tuple[str, list[str]]:
        hour_s[0] = 3600.0
        return PROFILE, ["the hypervisor took up to 11% of the CPU during calibration (speed-1)"]

    monkeypatch.setattr(validate_calibrate, "calibrate_now", hour_long_calibration)
    cfg = ValidateConfig(
        out=tmp_path / "report", profile=None, repeats=1, steps=4, models=("mlp",),
        modes=((1, 1),), batches=(16,), band_samples=2, target_run_s=0.01, max_steps=4,
        parallel=("data",), heldout_workloads=0,
    )  # fmt: skip
    report = run_validation(cfg, log=lambda s: None)
    assert 3600.0 < report["elapsed_s"] < 3600.0 + 300.0
    assert report["provenance"]["profile"] == PROFILE
    # what disturbed the calibration stays with the result, in the JSON and the text report
    (warning,) = report["provenance"]["calibration_warnings"]
    assert f"warning: {warning}" in format_report(report)


def test_machine_difference_names_what_differs_and_ignores_what_is_unknown() -> None:
    from pdlsim.validate.calibrate import machine_difference

    here = {"cpu_model": "Xeon", "cores_available": 2, "arch": "x86_64"}
    assert machine_difference(dict(here), here) is None
    assert machine_difference({"cpu_model": None, "cores_available": 2}, here) is None
    there = {**here, "cpu_model": "EPYC", "cores_available": 64}
    assert machine_difference(there, here) == "CPU EPYC there, Xeon here; cores 64 there, 2 here"


@pytest.mark.parametrize("same_machine", [True, False])
def test_a_profile_from_another_machine_is_flagged_before_the_runs(
    tmp_path: Path, same_machine: bool
) -> None:
    from microbench.machine import machine_identity

    doc = json.loads(Path(PROFILE).read_text())
    doc["machine"].update(machine_identity())
    if not same_machine:
        doc["machine"].update(cpu_model="Imaginary CPU 9000", cores_available=128)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(doc))
    cfg = ValidateConfig(
        out=tmp_path / "report", profile=str(profile), repeats=1, steps=4, models=("mlp",),
        modes=((1, 1),), batches=(16,), band_samples=2, target_run_s=0.01, max_steps=4,
        parallel=("data",), heldout_workloads=0,
    )  # fmt: skip
    log: list[str] = []
    report = run_validation(cfg, log=log.append)
    prov = report["provenance"]
    assert prov["measured_on"].startswith(f"{doc['machine']['cpu_model']}, ")
    warnings = [line for line in log if "measured on another machine" in line]
    if same_machine:
        assert warnings == [] and "machine_warning" not in prov
        return
    assert len(warnings) == 1 and log.index(warnings[0]) < 2  # before any run
    assert "CPU Imaginary CPU 9000 there" in warnings[0] and "cores 128 there" in warnings[0]
    assert f"warning: {prov['machine_warning']}" in format_report(report)


def _row(set_: str, procs: int, error: float, oversubscribed: bool = False) -> dict:
    return {"set": set_, "model": f"m{procs}", "procs": procs, "threads": 1, "batch": 8,
            "parallel": "data", "device": "cpu", "prefetch": False, "inference": False,
            "rel_error": error, "in_band": error < 0.2, "oversubscribed": oversubscribed,
            "predicted_p50_s": 1.0, "predicted_p10_s": 0.9, "predicted_p90_s": 1.2}  # fmt: skip


def test_rows_beyond_the_calibrated_ranks_are_scored_apart() -> None:
    """The extrapolation in ranks per node gets its own lines, held-out first; a matrix
    within the calibrated ranks (or only oversubscribed beyond them) gets none."""
    held = [_row("held-out", p, e) for p, e in ((1, 0.02), (2, 0.06), (4, 0.3), (16, 0.5))]
    rows = [*held, _row("in-sample", 2, 0.04), _row("in-sample", 8, 0.4)]
    split = by_ranks(rows, 2)
    assert split["beyond_ranks"] == [4, 8, 16]
    within, beyond = split["held-out"]["within"], split["held-out"]["beyond"]
    assert (within["configurations"], within["median_rel_error"]) == (2, pytest.approx(0.04))
    assert (beyond["configurations"], beyond["worst_rel_error"]) == (2, 0.5)
    assert beyond["in_band_fraction"] == 0.0
    assert split["in-sample"]["beyond"]["configurations"] == 1
    assert by_ranks(rows[:3], 4) is None
    assert by_ranks([*rows[:2], _row("held-out", 4, 0.3, oversubscribed=True)], 2) is None


def test_the_calibrated_ranks_are_the_profiles_largest() -> None:
    assert calibrated_ranks("xeon-2core") == 2
    assert calibrated_ranks("h100-16core") == 4  # its bench ran --procs 1,2,4
    assert calibrated_ranks("h200-16core") == 2  # 16 cores, calibrated at 1-2 ranks
