"""Inputs past any real machine, names that are not UTF-8, runs that fail before their first
record, and signals: each is one line (exit 2, or 128 + N for a signal), never a traceback or
a prediction built on nonsense, and nothing written is lost."""

from __future__ import annotations

import json
import math
import os
import signal
import sys

import pytest

from calibration.loop_table import LoopTable
from microbench import __main__ as microbench_main
from microbench.commands import storage
from microbench.fileio import atomic_write_text
from microbench.records import RecordWriter, read_records
from pdlsim.cli import main as cli_main
from pdlsim.cli import progress
from pdlsim.cli.main import main
from pdlsim.costmodel.presets import HARDWARE
from pdlsim.sim import engine
from tests.conftest import REPO, run_pdlsim

FAST = ["--iterations", "2", "--samples", "2"]


@pytest.fixture(autouse=True)
def no_progress_lines(monkeypatch):
    monkeypatch.setattr(progress, "FIRST_AFTER_S", math.inf)


def _status(argv: list[str], entry=main) -> int:
    try:
        return entry(argv)
    except SystemExit as usage:  # argparse's own errors
        return usage.code


def _refused(capsys, *args: str, entry=main) -> str:
    assert _status(list(args), entry) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _preset_file(tmp_path, kind: str, name: str, **changes) -> str:
    _, fields = HARDWARE.entry(name)
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({**fields, **changes}))
    return str(path)


# --------------------------------------------------------------- data-sheet figures in files
@pytest.mark.parametrize(
    ("kind", "flag", "preset", "field", "value"),
    [
        ("gpu", "--gpu-preset", "h100-sxm", "fp32_flops_per_s", 1e-300),  # was a traceback
        ("gpu", "--gpu-preset", "h100-sxm", "hbm_bandwidth_bytes_per_s", 1e-300),
        ("gpu", "--gpu-preset", "h100-sxm", "pcie_bytes_per_s", 1e300),
        ("gpu", "--gpu-preset", "h100-sxm", "tf32_tensor_flops_per_s", 1e300),
        ("gpu", "--gpu-preset", "h100-sxm", "memory_bytes", 10**17),
        ("node", "--node", "dgx-h100", "gpu_link_bytes_per_s", 1e300),
        ("network", "--network", "ib-ndr", "bandwidth_bytes_per_s", 1e-300),
        ("network", "--network", "ib-ndr", "latency_s", 1e300),
        ("network", "--network", "ib-ndr", "oversubscription", 1e300),
    ],
)  # fmt: skip
def test_a_preset_file_with_a_figure_past_any_machine_is_refused(
    capsys, tmp_path, kind, flag, preset, field, value
):
    path = _preset_file(tmp_path, kind, preset, **{field: value})
    args = ["predict", "--nodes", "2", "--gpus", "8", *FAST, flag, path]
    err = _refused(capsys, *args)
    assert f"{field} must be" in err and path in err
    if kind != "gpu":  # the collectives read nodes and networks too
        _refused(capsys, "collective", "allreduce", "--nodes", "2", flag, path)


def test_an_assumption_in_seconds_past_centuries_is_refused(capsys, tmp_path):
    doc = {"assumptions": {"gpu_kernel_launch_s": {"value": 1e300, "low": 1e300, "high": 1e301}}}
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(doc))
    err = _refused(capsys, "predict", "--nodes", "1", "--gpus", "2", *FAST,
                   "--hardware", str(path))  # fmt: skip
    assert "gpu_kernel_launch_s" in err and "seconds" in err


# ------------------------------------------------------------------------- what-if factors
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--network-scale", "1e-300"], "--network-scale must be a factor from 1e-06 to 1e+06"),
        (["--latency-scale", "1e300"], "--latency-scale must be a factor"),
        (["--slow-ranks", "1", "--slow-factor", "1e300"], "--slow-factor must be a factor"),
        (["--speeds", "1,1e-300"], "--speeds must be a factor"),
        (["--bucket-mb", "1e300"], "--bucket-mb must be from 9.54e-07 (1 byte) to 1,048,576"),
        (["--bucket-mb", "1e-300"], "--bucket-mb must be from 9.54e-07 (1 byte)"),
        (["--gpus", "1", "--mfu", "1e-300"], "--mfu is a fraction of the GPU's peak from 1e-06"),
    ],
)
def test_a_factor_no_machine_differs_by_is_refused(capsys, args, message):
    """These priced steps of 1e184 seconds and more."""
    assert message in _refused(capsys, "predict", "--nodes", "2", *FAST, *args)


def test_a_varied_factor_past_the_range_is_refused(capsys, tmp_path):
    out = tmp_path / "sweep"
    err = _refused(capsys, "sweep", "--nodes", "2", "--vary", "network-scale=1,1e300",
                   "--out", str(out), *FAST)  # fmt: skip
    assert "--network-scale must be a factor" in err
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------ counts past numpy's integers
def test_counts_past_int64_are_one_line_not_a_traceback(capsys, tmp_path):
    """A [2**31-1, 2**31-1] input flattened into a dense layer: its kernels' element counts
    are Python integers past int64, which np.log could not take (TypeError). The workload
    checks refuse a sample of more than 2^36 values, naming it."""
    workload = {
        "name": "huge",
        "input_shape": [2**31 - 1, 2**31 - 1],
        "layers": [{"kind": "flatten"}, {"kind": "dense", "units": 10},
                   {"kind": "softmax_cross_entropy"}],
    }  # fmt: skip
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(workload))
    args = ["predict", "--nodes", "1", "--model", str(path), *FAST, "--json",
            "--allow-oversubscribed-memory"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the 68,719,476,736 one sample may hold" in err


def test_a_loop_table_prices_a_count_past_int64():
    table = LoopTable.from_points([(1000, 1, 1e-6), (100000, 1, 1e-4)])
    assert table.time_s(10**30) == pytest.approx(1e21, rel=1e-6)
    assert table.beyond_log(10**30) > 0


# --------------------------------------------------------------------------------- seeds
@pytest.mark.usefixtures("no_inherited_rank")
def test_a_negative_seed_is_a_usage_error(capsys, tmp_path):
    err = _refused(capsys, "kernels", "--seed", "-1", "--out", str(tmp_path / "k"),
                   entry=microbench_main.main)  # fmt: skip
    assert "argument --seed: must be >= 0, got -1" in err
    err = _refused(capsys, "validate", "--seed", "-3", "--out", str(tmp_path / "v"))
    assert "argument --seed: expected an integer >= 0" in err


# ------------------------------------------------------------------ names that are not UTF-8
def test_records_and_files_take_names_that_are_not_utf8(tmp_path):
    """A name typed as bytes that are not UTF-8 comes in as lone surrogates ('\\udcff'): it is
    written as a JSON escape that reads back as the same name, not a UnicodeEncodeError."""
    name = str(tmp_path / "\udcffrun")
    with RecordWriter(tmp_path / "r.jsonl", {"hostname": "h"}, {"out": name}) as writer:
        writer.write({"type": "sample", "path": name})
    header, records = read_records(tmp_path / "r.jsonl")
    assert header["run"]["out"] == name and records[-1]["path"] == name
    atomic_write_text(tmp_path / "doc.json", json.dumps({"p": name}, ensure_ascii=False))
    assert json.loads((tmp_path / "doc.json").read_text(encoding="utf-8"))["p"] == name


@pytest.mark.skipif(sys.platform != "linux", reason="file names as raw bytes")
def test_train_into_a_folder_whose_name_is_not_utf8(tmp_path):
    out = os.fsdecode(bytes(tmp_path) + b"/\xffrun")
    result = run_pdlsim("train", "--samples", "64", "--max-steps", "2", "--test-samples", "32",
                        "--out", out, "--checkpoint-every", "1", timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads((tmp_path / os.fsdecode(b"\xffrun") / "summary.json").read_text())


# --------------------------------------------------- a run that fails before its first record
def test_a_writer_stopped_before_its_first_record_leaves_no_file(tmp_path):
    bare, kept = tmp_path / "bare.jsonl", tmp_path / "kept.jsonl"
    with pytest.raises(MemoryError), RecordWriter(bare, {"hostname": "h"}):
        raise MemoryError
    assert not bare.exists()
    with pytest.raises(MemoryError), RecordWriter(kept, {"hostname": "h"}) as writer:
        writer.write({"type": "sample", "value": 1})
        raise MemoryError
    assert len(kept.read_text().splitlines()) == 2
    before = kept.read_bytes()
    with pytest.raises(MemoryError), RecordWriter(kept, {"hostname": "h"}, append=True):
        raise MemoryError  # an appended file is the user's: it stays whole
    assert kept.read_bytes() == before


@pytest.mark.usefixtures("no_inherited_rank")
def test_a_benchmark_that_fails_before_its_first_record_can_be_rerun(capsys, tmp_path):
    huge = tmp_path / "huge.json"
    # activations that fit (refused up front otherwise), weights that no machine allocates
    huge.write_text(json.dumps({"name": "huge", "input_shape": [2**20], "layers": [
        {"kind": "dense", "units": 2**20}, {"kind": "softmax_cross_entropy"}]}))  # fmt: skip
    out = tmp_path / "run"
    args = ["jitter", "--model", str(huge), "--quick", "--out", str(out)]
    err = _refused(capsys, *args, entry=microbench_main.main)
    assert "not enough memory" in err
    assert not (out / "jitter.jsonl").exists()  # so the retry needs no --append


# --------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_any_command_with_one_line(monkeypatch, capsys, signum):
    """They killed predict, sweep and the benchmarks silently; now each command stops as on
    Ctrl-C, says so, exits 128 + N, and the handlers it had come back."""
    before = signal.getsignal(signum)

    def signalled(args):
        os.kill(os.getpid(), signum)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(cli_main, "_cmd_workload_list", signalled)
    assert main(["workload", "list"]) == 128 + signum
    assert capsys.readouterr().err == f"pdlsim: stopped by {signal.Signals(signum).name}\n"
    assert signal.getsignal(signum) == before


def test_sigterm_inside_a_simulated_process_stops_predict_with_one_line(monkeypatch, capsys):
    """SimPy re-raises a process's exception rebuilt from its args (the signal's name): a
    SIGTERM that landed inside a simulated rank was "error: 'SIGTERM' is not a valid
    Signals", exit 2, in place of the stop."""
    original = engine._passes

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "_passes", signalled)
    assert main(["predict", "--nodes", "2", "--iterations", "2", "--samples", "2"]) == 143
    assert capsys.readouterr().err == "pdlsim: stopped by SIGTERM\n"


@pytest.mark.usefixtures("no_inherited_rank")
def test_sigterm_stops_a_benchmark_with_one_line(monkeypatch, capsys, tmp_path):
    def signalled(args):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(storage, "run", signalled)
    status = microbench_main.main(["storage", "--out", str(tmp_path / "s")])
    assert status == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m microbench storage: stopped by SIGTERM; the records of finished "
                   "points are kept"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--lr", "1e300"], "--lr must be at most 1000, got 1e+300"),
        (["train", "--optimizer", "adamw", "--weight-decay", "1e9"], "--weight-decay must be"),
        (["predict", "--nodes", "4", "--sync-every", "10**12".replace("10**12", str(10**12))],
         "--sync-every must be at most 1,000"),
    ],
)  # fmt: skip
def test_steps_no_training_or_simulation_can_take_are_refused(argv, message, capsys):
    assert _status(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_whole_number_longer_than_any_count_is_not_a_document(tmp_path, capsys):
    """A 300-digit count in a node file is refused where it is read, with its place, instead
    of being quoted back whole by whichever check meets it."""
    node = {"name": "n", "gpu": "h100-sxm", "gpus_per_node": 10**300, "fabric": "nvlink",
            "gpu_link_bytes_per_s": 1e11, "nvls": False, "nics": 1, "network": "ib-hdr",
            "source": "x"}  # fmt: skip
    path = tmp_path / "node.json"
    path.write_text(json.dumps(node))
    assert _status(["predict", "--nodes", "2", "--gpus", "8", "--node", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "a whole number of 301 digits (at most 18)" in err
    assert len(err) < 300


_LONG = "9" * 400


@pytest.mark.parametrize(
    ("kind", "flag", "preset", "changes", "message"),
    [
        ("gpu", "--gpu-preset", "h100-sxm", {"memory_bytes": _LONG},
         "memory_bytes: expected a number, got '9999999999999999999..."),
        ("gpu", "--gpu-preset", "h100-sxm", {"memory_bytes": list(range(500))},
         "memory_bytes: expected a number, got [0, 1, 2, 3"),
        ("node", "--node", "dgx-h100", {"gpus_per_node": True},
         "gpus_per_node: expected a number, got True"),
        ("network", "--network", "ib-ndr", {"x" * 300: 1, **{f"k{i}": 1 for i in range(50)}},
         "unknown field(s) k0, k1, k10, k11, k12 and 46 more"),
        ("network", "--network", "ib-ndr", {"latency_s": "slow" * 500},
         "latency_s: expected a number, got 'slowslowslowslowslo..."),
    ],
)  # fmt: skip
def test_a_long_value_in_a_preset_file_is_quoted_cut_short(
    capsys, tmp_path, kind, flag, preset, changes, message
):
    """A value (a pasted string, a list, a key) of hundreds of characters is quoted by its
    first ones and '...', not whole: the error stays one readable line."""
    path = _preset_file(tmp_path, kind, preset, **changes)
    err = _refused(capsys, "predict", "--nodes", "2", "--gpus", "8", *FAST, flag, path)
    assert message in err and len(err) < 600, err


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"kind": "dense", "name": "d", "units": _LONG}, "'units' must be an integer, got '999"),
        ({"kind": "dense", "name": "d", "units": list(range(500))}, "got [0, 1, 2, 3, 4, 5, 6..."),
        ({"kind": "r" * 5000, "name": "d"}, "unknown kind 'rrrrrrrrrrrrrrrrrrr...; known kinds:"),
        ({"kind": "dense", "name": "d", "units": 8, "z" * 3000: 1},
         "unknown setting(s) zzzzzzzzzzzzzzzzzzzz... for dense"),
    ],
)  # fmt: skip
def test_a_long_value_in_a_workload_file_is_quoted_cut_short(capsys, tmp_path, layer, message):
    path = tmp_path / "w.json"
    loss = {"kind": "softmax_cross_entropy", "name": "loss"}
    path.write_text(json.dumps({"input_shape": [8], "layers": [layer, loss]}))
    err = _refused(capsys, "predict", "--nodes", "2", *FAST, "--model", str(path))
    assert message in err and len(err) < 600, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("flag", ["--node", "--network", "--gpu-preset"])
def test_a_fifo_given_as_a_preset_file_is_named_not_taken_for_a_preset(
    capsys, tmp_path, monkeypatch, flag
):
    """A FIFO (or a device) without '.json' or '/' in its name is a file on disk, refused as
    what it is, not looked up as an unknown preset name."""
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, "predict", "--nodes", "2", "--gpus", "8", *FAST, flag, "fifo")
    assert f"{flag} fifo: is a FIFO; give a JSON file" in err


@pytest.mark.parametrize("where", ["top", "models"])
def test_a_long_key_in_a_profile_is_quoted_cut_short(capsys, tmp_path, where):
    doc = json.loads((REPO / "calibration" / "profiles" / "xeon-2core.json").read_text())
    (doc if where == "top" else doc["models"])["k" * 3000] = {}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    err = _refused(capsys, "predict", "--nodes", "2", *FAST, "--profile", str(path))
    assert "kkkkkkkkkkkkkkkkkkkk...: unknown" in err and len(err) < 600, err
