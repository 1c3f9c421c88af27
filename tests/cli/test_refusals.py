"""Nonsense refused up front: one line, exit 2, before anything is simulated."""

from __future__ import annotations

import io
import json

import pytest

from pdlsim.cli.main import main
from pdlsim.cli.progress import Progress
from pdlsim.prediction import build as build_module


def _refused(capsys, *args: str) -> str:
    try:
        status = main(list(args))
    except SystemExit as usage:  # argparse's own errors
        status = usage.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "1000000"], "--gpus must be at most 64, got 1,000,000"),
        (["--nodes", "2000000"], "--nodes must be at most 1,000,000"),
        (["--procs-per-node", "5000"], "--procs-per-node must be at most 1,024"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--iterations", "0"], "--iterations must be at least 1"),
        (["--batch", "40000"], "a step takes 80,000 samples, more than the epoch's 50,000"),
        (["--gpus", "4", "--batch", "16000", "--parallel", "pipeline", "--stages", "2",
          "--microbatches", "4"], "a step takes 64,000 samples"),  # 4 replicas of 16,000
        # each count in range, their product hours of simulating
        (["--model", "bert-large", "--gpus", "8", "--iterations", "100000"],
         "200,422 simulated steps of the 248 layers of workload bert-large are 49,704,656 layer "
         "steps, more than the 10,000,000"),
        (["--samples", "10000", "--sync-every", "1000"],
         "give a smaller --iterations, --samples or --sync-every"),
        (["--gpus", "4", "--parallel", "pipeline", "--stages", "4", "--microbatches", "100000",
          "--batch", "100000", "--model", "mlp", "--dataset-samples", "10000000"],
         "workload mlp x 100,000 micro-batches are 373,200,000 layer steps"),
    ],
)  # fmt: skip
def test_out_of_range_configurations_are_refused_before_simulating(
    capsys, no_simulation, args, message
):
    nodes = [] if "--nodes" in args else ["--nodes", "2"]
    err = _refused(capsys, "predict", *nodes, *args)
    assert message in err


def test_a_workload_of_many_layers_is_refused_before_hours_of_simulating(
    capsys, no_simulation, tmp_path
):
    """20,000 layers at the default 100 steps and 20 band samples: 12 million layer steps."""
    layers = [{"kind": "dense", "units": 4}, *[{"kind": "relu"}] * 20_000]
    layers += [{"kind": "dense", "units": 2}, {"kind": "softmax_cross_entropy"}]
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps({"name": "deep", "input_shape": [8], "layers": layers}))
    err = _refused(capsys, "predict", "--nodes", "2", "--model", str(deep))
    assert "622 simulated steps of the 20,003 layers of workload deep" in err
    assert "give a smaller --iterations or --samples" in err


def test_a_layout_that_does_not_fit_a_gpu_is_refused_unless_asked_for(capsys, no_simulation):
    args = ["predict", "--nodes", "1", "--gpus", "1", "--gpu-preset", "v100", "--batch", "40000",
            "--dataset-samples", "100000"]  # fmt: skip
    err = _refused(capsys, *args)
    assert "needs 34.0 GB per GPU, the v100 has 32.0 GB" in err
    assert "--allow-oversubscribed-memory" in err
    v100 = ["predict", "--nodes", "1", "--gpu-preset", "v100", "--dataset-samples", "400000"]
    for mode in (
        ["--gpus", "1", "--batch", "150000", "--parallel", "model"],
        ["--gpus", "2", "--batch", "300000", "--parallel", "pipeline", "--stages", "2",
         "--microbatches", "2"],
        ["--gpus", "1", "--batch", "150000", "--inference"],
    ):  # fmt: skip
        err = _refused(capsys, *v100, *mode)
        assert "per GPU, the v100 has 32.0 GB" in err, mode


def test_the_flag_predicts_an_oversubscribed_layout_with_its_warning(capsys):
    args = ["predict", "--nodes", "1", "--gpus", "1", "--gpu-preset", "v100", "--batch", "40000",
            "--dataset-samples", "100000", "--iterations", "2", "--samples", "2", "--json",
            "--allow-oversubscribed-memory"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["warning"].startswith("needs 34.0 GB per GPU, more than the v100's 32.0 GB")


def test_cpu_ranks_are_checked_against_the_hosts_memory(capsys, no_simulation):
    err = _refused(capsys, "predict", "--nodes", "1", "--procs-per-node", "2", "--batch", "20000")
    assert "2 ranks per node share the profile's host memory of 25.3 GB" in err


def test_cpu_ranks_of_a_host_of_unknown_memory_are_predicted(monkeypatch):
    real = build_module.resolve_profile

    def no_memory(name):  # a profile that does not say: no check
        profile, found = real(name)
        profile.machine.pop("memory_total_bytes", None)
        profile.machine.pop("memory_limit_bytes", None)
        return profile, found

    monkeypatch.setattr(build_module, "resolve_profile", no_memory)
    args = ["--nodes", "1", "--procs-per-node", "2", "--batch", "20000", "--iterations", "1"]
    assert main(["predict", *args, "--samples", "2", "--json"]) == 0


def test_sweep_refuses_a_bad_row_before_simulating_the_first(capsys, no_simulation, tmp_path):
    err = _refused(capsys, "sweep", "--nodes", "1,2", "--batch", "16,30000", "--out",
                   str(tmp_path))  # fmt: skip
    assert "a step takes 60,000 samples" in err
    assert not (tmp_path / "sweep.csv").exists()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_rewrites_one_line_on_a_terminal_and_stays_sparse_in_a_file(monkeypatch):
    clock = iter(range(0, 1000, 3))  # 3 s per item
    monkeypatch.setattr("pdlsim.cli.progress.time.monotonic", lambda: next(clock))
    tty = Progress("sweep", "configurations", _Stream(True))
    for i in range(1, 5):
        tty(i, 4)
    assert (
        tty.stream.getvalue()
        == "".join(f"\rsweep: {i}/4 configurations" for i in range(1, 5)) + "\n"
    )
    log = Progress("sweep", "configurations", _Stream(False))
    for i in range(1, 11):
        log(i, 10)
    lines = log.stream.getvalue().splitlines()
    assert lines[-1] == "sweep: 10/10 configurations"
    assert 2 <= len(lines) <= 4  # every 10 s of 30, not every row


def test_sweep_prints_progress_on_stderr_only(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("pdlsim.cli.progress.FIRST_AFTER_S", 0.0)
    args = ["sweep", "--nodes", "1,2", "--iterations", "5", "--samples", "2"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "sweep: 2/2 configurations" in captured.err
    assert "configurations" not in captured.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--nodes", "2", "--nodes", "4"], "--nodes is given twice (2, then 4)"),
        (["predict", "--nodes", "2", "--pinned", "--pageable"], "--pageable contradicts --pinned"),
        (["predict", "--nodes", "2", "--gpus", "4", "--threads", "2"],
         "--threads is for CPU ranks; with --gpus every GPU is one rank"),
        (["predict", "--nodes", "2", "--gpus", "4", "--procs-per-node", "2"],
         "--procs-per-node is for CPU ranks"),
        (["sweep", "--nodes", "2", "--gpus", "4", "--threads", "2", "--out", "unused"],
         "--threads is for CPU ranks"),
        (["predict", "--nodes", "2", "--gpu-preset", "v100"],
         "--gpu-preset describes GPU ranks, and this configuration has none"),
        (["predict", "--nodes", "2", "--prefetch"], "--prefetch describes GPU ranks"),
        (["predict", "--nodes", "2", "--network", "ib-ndr", "--inter-bw", "10GB/s",
          "--inter-lat", "2us"], "--inter-bw and --inter-lat replace every figure of --network"),
        (["predict", "--nodes", "1", "--gpus", "2", "--parallel", "model", "--no-overlap"],
         "--no-overlap is for data-parallel training"),
        (["predict", "--nodes", "2", "--trace", "no-such-folder/t.json"],
         "--trace no-such-folder/t.json: the folder no-such-folder does not exist"),
        (["train", "--inference", "--momentum", "0.9"],
         "--inference updates no weights, so --momentum is unused"),
        (["train", "--pinned"], "--pinned is for copies to a GPU: add --device gpu"),
        (["validate", "--parallel", "model", "--modes", "2x1", "--out", "unused"],
         "--modes lists data-parallel modes, and --parallel model runs none"),
    ],
)  # fmt: skip
def test_ignored_or_contradictory_flags_are_refused(capsys, no_simulation, tmp_path,
                                                    monkeypatch, args, message):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert message in _refused(capsys, *args)
    assert not (tmp_path / "no-such-folder").exists() and not (tmp_path / "unused").exists()


def test_a_network_preset_refined_by_one_figure_is_warned_about_once(capsys):
    args = ["predict", "--nodes", "2", "--network", "ib-ndr", "--inter-bw", "10GB/s",
            "--iterations", "2", "--samples", "2", "--json"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err.count("warning") == 1
    assert "--inter-bw replaces the bandwidth of --network ib-ndr; its latency is kept" in (
        captured.err
    )
    json.loads(captured.out)  # stdout stays one JSON document


def test_the_same_value_twice_and_the_defaults_stay_accepted(capsys):
    args = ["predict", "--nodes", "2", "--nodes", "2", "--gpus", "0", "--iterations", "2",
            "--samples", "2", "--threads", "1"]  # fmt: skip
    assert main(args) == 0
    assert main(["predict", "--nodes", "2", "--gpus", "2", "--pageable", "--iterations", "2",
                 "--samples", "2"]) == 0  # fmt: skip
