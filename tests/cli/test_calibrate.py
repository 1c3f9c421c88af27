"""pdlsim bench --quick, then pdlsim calibrate: records in, a loadable profile, its report, plots
and Extra-P file out. The one quick bench run is this module's, so that it runs once even when
the suite is spread over workers by file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from calibration.profile import load_profile
from calibration.report import format_report
from microbench.errors import UserError
from microbench.records import load_dataframe
from tests.conftest import pdlsim_here, run_pdlsim
from tests.kernel_plans import ONE_COUNT

pytestmark = pytest.mark.long_module  # the quick bench alone takes a minute


@pytest.fixture(scope="module")
def quick_bench_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One quick ``pdlsim bench`` at 1 and 2 ranks, shared by the tests that read its records.
    One workload is enough for every stage; each more adds its compute, jitter and speed
    checks. The kernel sweep is skipped there and run here, as the bench's stage would run it,
    on ONE_COUNT's grid: the quick grid takes a minute, and every fit reads any grid alike.
    The checkpoint writes and the node fill, which no test here reads, have tests of their
    own."""
    import microbench.commands.kernels as kernels_command
    from microbench.__main__ import main as microbench_main
    from pdlsim.cli.bench_suite import BenchPlan, plan_stages

    out = tmp_path_factory.mktemp("bench") / "run"
    result = run_pdlsim("bench", "--quick", "--procs", "1,2", "--threads", "1", "--model", "mlp",
                        "--skip", "kernels,storage,nodefill", "--out", str(out),
                        timeout=300)  # fmt: skip
    stage = plan_stages(BenchPlan(out=out, model="mlp", threads=(1,), quick=True))[0]
    assert stage.name == "kernels" and stage.command[1:3] == ("-m", "microbench")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels_command, "plan_from_args", lambda args: ONE_COUNT)
        assert microbench_main(list(stage.command[3:])) == 0
    return out, result


@pytest.fixture(scope="module")
def calibrated_run(quick_bench_run, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of the quick bench run calibrated once on calibrate's defaults: the profile,
    report plots and Extra-P file land in the run directory. Shared, because a calibration
    takes 10-25 s here and the tests below read the same one."""
    run_dir = tmp_path_factory.mktemp("calibrated") / "run"
    shutil.copytree(quick_bench_run[0], run_dir)
    result = run_pdlsim("calibrate", "--from", str(run_dir), "--bootstrap", "5", timeout=300)
    return run_dir, result


def test_quick_bench_runs_every_stage_and_keeps_every_record(quick_bench_run):
    out, result = quick_bench_run
    assert result.returncode == 0, result.stderr + result.stdout
    plan = json.loads((out / "bench.json").read_text())
    assert [r["status"] for r in plan["results"]] == ["ok"] * len(plan["stages"])
    assert not {"kernels", "storage", "nodefill"} & {r["name"] for r in plan["results"]}
    frame = load_dataframe(out, type="measurement")
    sources = set(frame["source"])
    assert {
        "ranks1/compute.jsonl",
        "ranks1/compression.jsonl",
        "ranks1/collectives.jsonl",
        "ranks2/collectives.jsonl",
        "ranks1/speed.jsonl",
        "ranks1/kernels.jsonl",
    } <= sources
    assert {"ranks2/jitter.jsonl", "ranks2/interference.jsonl"} <= sources
    allreduce = frame[(frame["benchmark"] == "collectives") & (frame["params.op"] == "allreduce")]
    assert set(allreduce["params.ranks"]) == {1, 2}
    assert all(len(samples) >= 1 for samples in frame["samples"])
    assert "allreduce" in result.stdout and "GFLOP/s" in result.stdout and "GB/s" in result.stdout
    assert (out / "logs" / "collectives-p2.log").exists()


def test_calibrate_from_a_bench_run_writes_a_profile_report_plots_and_extrap(
    quick_bench_run, calibrated_run
):
    assert quick_bench_run[1].returncode == 0, quick_bench_run[1].stderr
    run_dir, result = calibrated_run
    assert result.returncode == 0, result.stderr
    profile_path = run_dir / "profile.json"
    profile = load_profile(profile_path)
    doc = profile.to_dict()
    assert doc["schema"] == "pdlsim.profile" and doc["schema_version"] == 1
    fitted = {k for k, v in doc["models"].items() if v}
    assert {"collectives", "compute", "jitter", "colocation", "compression"} <= fitted
    assert doc["models"]["transfer"] is None  # no GPU here: no copies were measured
    # co-location: the jitter step of each model at 2 ranks against rank 0 alone
    points = doc["models"]["colocation"]["points"]
    assert set(points) == {"mlp-b32-t1-r2"}
    assert all(p["factor"] > 0 for p in points.values())
    # the compute table holds the whole step and the mini-batch gather at every batch
    table = doc["models"]["compute"]["table"]
    for phase in ("step", "data"):
        assert {(e["model"], e["batch"]) for e in table if e["phase"] == phase} == {
            ("mlp", b) for b in (16, 32, 64)
        }
    assert "collectives.allreduce" in result.stdout and "95% interval" in result.stdout
    assert format_report(doc) in result.stdout
    for name in ("collectives.png", "compute.png", "jitter.png"):
        assert (run_dir / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (run_dir / "extrap.jsonl").read_text().splitlines()
    assert lines and all("params" in json.loads(line) for line in lines[1:3])


def test_calibrate_without_records_runs_the_cpu_bench_with_its_own_options(
    tmp_path, monkeypatch, capsys
):
    """The default path (no --from) hands calibrate's options to the bench; a bench that is
    interrupted keeps its run folder and says where."""
    from pdlsim.cli import bench_suite
    from pdlsim.cli.main import main

    plans = []

    def interrupted(plan):
        plans.append(plan)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_suite, "run_bench", interrupted)
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--quick", "--model", "mlp", "--batch", "8", "--threads", "1"]) == 130
    (plan,) = plans
    assert (plan.model, plan.batches, plan.threads, plan.quick) == ("mlp", (8,), (1,), True)
    assert (tmp_path / plan.out).parent == tmp_path / "runs" / "calibrate" and plan.out.is_dir()
    assert f"finished points are kept in {plan.out}" in capsys.readouterr().err


def test_a_failed_fit_leaves_an_existing_profile_untouched(quick_bench_run, tmp_path):
    run_dir, _ = quick_bench_run
    partial = tmp_path / "partial"
    shutil.copytree(run_dir / "ranks2", partial / "ranks2")  # collectives, jitter: no compute
    profile_path = tmp_path / "profile.json"
    profile_path.write_text("the old profile")
    result = run_pdlsim("calibrate", "--from", str(partial), "--out", str(profile_path))
    assert result.returncode == 2
    assert "no compute records" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert profile_path.read_text() == "the old profile"


def test_a_write_that_fails_after_the_fit_keeps_the_old_profile(
    quick_bench_run, tmp_path, monkeypatch
):
    """The plots and the Extra-P file are written before the profile, so a full disk on the
    way leaves the profile that was there, not a new one beside a failed run."""
    run_dir, _ = quick_bench_run
    profile_path = tmp_path / "profile.json"
    profile_path.write_text("the old profile")

    def full(*args, **kwargs):
        raise UserError(f"{tmp_path}/plots/jitter.png: the disk is full; free space")

    monkeypatch.setattr("pdlsim.plots.plot_calibration", full)
    done = pdlsim_here("calibrate", "--from", str(run_dir), "--out", str(profile_path),
                       "--bootstrap", "5")  # fmt: skip
    assert done.returncode == 2 and "the disk is full" in done.stderr
    assert profile_path.read_text() == "the old profile"


def _a_records_file(tmp: Path) -> Path:
    (tmp / "compute.jsonl").write_text("{}\n")
    return tmp / "compute.jsonl"


def _foreign_jsonl(tmp: Path) -> Path:
    (tmp / "ranks1").mkdir()
    (tmp / "ranks1" / "collectives.jsonl").write_text("garbage\n")
    return tmp


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing", "no such directory"),
        (_a_records_file, "a file, not a directory of records; give the run directory"),
        (lambda tmp: tmp, "no *.jsonl records"),
        (_foreign_jsonl, "none of its 1 *.jsonl files holds pdlsim.records records"),
    ],
)
def test_unreadable_record_directories_are_one_line_errors(tmp_path, make, message):
    result = run_pdlsim("calibrate", "--from", str(make(tmp_path)), timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_calibrating_a_calibrated_run_again_reads_only_records_and_pools_earlier_sweeps(
    calibrated_run, tmp_path
):
    """The profile, plots and Extra-P file land in the run directory by default; a second
    calibration of that directory skips them. A kernel sweep of an earlier run pools into the
    kernel model alone: every other fit is the first calibration's."""
    assert calibrated_run[1].returncode == 0, calibrated_run[1].stderr
    run_dir = tmp_path / "run"
    shutil.copytree(calibrated_run[0], run_dir)
    first = json.loads((run_dir / "profile.json").read_text())
    earlier = tmp_path / "earlier"
    shutil.copytree(run_dir / "ranks1", earlier / "ranks1")  # a second moment's sweep
    done = run_pdlsim("calibrate", "--from", str(run_dir), "--kernels-from", str(earlier),
                      "--bootstrap", "5", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "extrap.jsonl: not a pdlsim.records file, skipped" in done.stdout
    second = json.loads((run_dir / "profile.json").read_text())
    for threads, terms in first["models"]["kernels"]["step_terms"].items():
        pooled = second["models"]["kernels"]["step_terms"][threads]["points"]
        assert len(pooled) == 2 * len(terms["points"])
    assert any(s["path"].startswith(str(earlier)) for s in second["sources"])
    for name, fit in first["models"].items():
        if name != "kernels":  # the same records, the same fits
            assert _fitted(second["models"][name]) == _fitted(fit), name


def _fitted(node):
    """A model section less its bootstrap ``intervals``: scipy's Levenberg-Marquardt, given
    the same residuals, Jacobian and start, can take a step a few 1e-14 apart from one call to
    the next, and the compute roofline's flat directions carry that to other optima, so 5
    rounds' extremes move; every fitted value stays to the bit."""
    if isinstance(node, dict):
        return {k: _fitted(v) for k, v in node.items() if k != "intervals"}
    if isinstance(node, list):
        return [_fitted(v) for v in node]
    return node


def test_kernel_sweeps_from_elsewhere_are_one_line_errors_before_any_profile(
    quick_bench_run, tmp_path
):
    run_dir, _ = quick_bench_run
    foreign = tmp_path / "foreign" / "ranks1"
    foreign.mkdir(parents=True)
    header, rest = (run_dir / "ranks1" / "kernels.jsonl").read_text().split("\n", 1)
    doc = json.loads(header)
    doc["machine"]["cpu_model"] = "Elsewhere CPU"
    (foreign / "kernels.jsonl").write_text(json.dumps(doc) + "\n" + rest)
    no_sweep = tmp_path / "no-sweep"
    shutil.copytree(run_dir / "ranks2", no_sweep / "ranks2")
    out = tmp_path / "profile.json"
    for extra, message in (
        (tmp_path / "missing", "no such directory of records"),
        (foreign.parent, "measured on another machine (cpu_model Elsewhere CPU against"),
        (no_sweep, "no kernel sweep records there"),
    ):
        done = pdlsim_here("calibrate", "--from", str(run_dir), "--kernels-from", str(extra),
                           "--out", str(out), "--bootstrap", "5")  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not out.exists()


def test_a_kernel_sweep_stopped_part_way_is_refused_not_fitted(quick_bench_run, tmp_path):
    """The sweep brackets its points with a start and an end record; one whose end is missing
    (killed part-way) is refused by --from and by --kernels-from, naming how far it got."""
    run_dir, _ = quick_bench_run
    lines = (run_dir / "ranks1" / "kernels.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["type"] for line in lines[1:]]
    assert kinds[0] == "sweep_start" and kinds[-1] == "sweep_end"
    assert kinds.count("sweep_start") == kinds.count("sweep_end") == 1
    for other in ("ranks2/collectives.jsonl", "ranks1/compute.jsonl"):  # every benchmark's run
        types = [json.loads(line)["type"] for line in (run_dir / other).read_text().splitlines()]
        assert types[1] == "sweep_start" and types[-1] == "sweep_end", other
    stopped = tmp_path / "stopped"
    shutil.copytree(run_dir, stopped, ignore=shutil.ignore_patterns("profile*", "plots"))
    kept = lines[: len(lines) // 3]
    (stopped / "ranks1" / "kernels.jsonl").write_text("\n".join(kept) + "\n")
    reached = sum(json.loads(line)["type"] == "measurement" for line in kept[1:])
    out = tmp_path / "profile.json"
    for flags in (("--from", str(stopped)), ("--from", str(run_dir), "--kernels-from",
                                               str(stopped))):  # fmt: skip
        done = pdlsim_here("calibrate", *flags, "--out", str(out), "--bootstrap", "5")
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        stopped_at = f"ranks1/kernels.jsonl: its benchmark run stopped after {reached:,} points"
        assert stopped_at in done.stderr
        assert "run microbench kernels again into that folder with --append" in done.stderr
        assert not out.exists()


def test_kernel_sweeps_of_another_node_of_the_same_kind_are_pooled(monkeypatch):
    """Sweeps pool by the kind of machine (CPU model, cores, architecture), as --from's own
    records do: the host name differs between the nodes of one partition."""
    import pandas as pd

    import calibration.pipeline as pipeline

    def frame(host, model="EPYC"):
        return pd.DataFrame({"benchmark": ["kernels"], "source": ["ranks1/kernels.jsonl"],
                             "machine.hostname": [host], "machine.cpu_model": [model],
                             "machine.logical_cores": [2], "machine.arch": ["x86_64"]})  # fmt: skip

    sweeps = {"node2": frame("node2"), "other": frame("node3", model="Xeon")}
    monkeypatch.setattr(pipeline, "load_measurements", lambda run_dir: sweeps[str(run_dir)])
    pooled = pipeline.with_kernel_sweeps(frame("node1"), ["node2"])
    assert list(pooled["source"]) == ["ranks1/kernels.jsonl", "node2/ranks1/kernels.jsonl"]
    with pytest.raises(UserError, match="cpu_model Xeon against EPYC"):
        pipeline.with_kernel_sweeps(frame("node1"), ["other"])
