"""Compute benchmarks: a quick run's records (one per op, phase and batch, the workload's FLOPs),
per-op times adding up to the step, the GPU paths (skipped without a GPU; on a stand-in for
CuPy otherwise), and bad arguments."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from microbench.commands.compute import check_gemm_memory
from microbench.compute import QUICK_POLICY, ComputePlan, format_summary, run_compute
from microbench.errors import UserError
from microbench.gpu import find_gpu
from microbench.measurement import Measurement
from microbench.network_ops import network_points, op_groups
from microbench.nn import SGD, Network, random_batch
from microbench.op_records import layer_bytes, update_cost
from microbench.records import RecordWriter, read_records
from microbench.reference import last_level_cache_bytes, triad_elements
from microbench.sampling import STOP_REASONS
from microbench.workload import load_workload
from tests import fake_cupy
from tests.conftest import REPO

PROG = "python -m microbench compute"
BATCH = 32
OPS = {
    "mlp": ["dense0+relu1", "dense2+relu3", "dense4"],
    "cnn": [
        "conv2d0+relu1+maxpool2d2",
        "conv2d3+relu4+maxpool2d5",
        "flatten6",
        "dense7+relu8",
        "dense9",
    ],
}
LOSS = {"mlp": "softmax_cross_entropy5", "cnn": "softmax_cross_entropy10"}
HAS_GPU = find_gpu()[0] is not None
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def microbench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m microbench ARGS``, not looking like rank 1 of some job (errors print on 0)."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    command = [sys.executable, "-m", "microbench", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run, both models at 1 thread and batch 32, as a user starts it."""
    out = tmp_path_factory.mktemp("compute")
    args = ("compute", "--quick", "--model", "mlp,cnn", "--threads", "1", "--batch", str(BATCH))
    args += ("--gpu-batch", str(BATCH))  # where a GPU is present, --device auto measures it too
    proc = microbench(*args, "--gemm-sizes", "256", "--time-cap", "0.15", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    header, records = read_records(out / "compute.jsonl")
    return proc, header, records


def _cpu(records, name):
    return [r for r in records if r["name"] == name and r["params"]["device"] == "cpu"]


def _ops(records, model):
    return [r for r in _cpu(records, "op") if r["params"]["model"] == model]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_one_record_per_op_and_phase_with_the_workloads_flops(quick_run, model):
    _, _, records = quick_run
    workload = load_workload(model)
    got = [(r["params"]["op"], r["params"]["phase"]) for r in _ops(records, model)]
    expected = (
        [(op, "forward") for op in OPS[model]]
        + [(LOSS[model], "loss")]
        + [(op, "backward") for op in reversed(OPS[model])]
        + [("update", "update"), ("data+step", "step"), ("data+inference", "inference")]
        + [("data", "data")]
    )
    assert got == expected
    by_name = {info.name: info for info in workload.layers}
    for r in _ops(records, model):
        p = r["params"]
        assert (p["batch"], p["threads"], p["device"], p["oversubscribed"]) == (
            BATCH,
            1,
            "cpu",
            False,
        )
        assert p["bytes"] > 0 or p["op"] == "flatten6"
        if p["phase"] in ("forward", "backward"):
            assert p["op"] == "+".join(p["layers"])
            assert p["kind"] == by_name[p["layers"][0]].kind
            per_sample = sum(
                getattr(by_name[name], f"{p['phase']}_flops_per_sample") for name in p["layers"]
            )
            assert p["flops"] == per_sample * BATCH
    step = next(r["params"] for r in _ops(records, model) if r["params"]["op"] == "data+step")
    fwd_bwd = workload.forward_flops_per_sample + workload.backward_flops_per_sample
    assert step["flops"] == BATCH * fwd_bwd + 2 * workload.param_count
    forward_only = next(
        r["params"] for r in _ops(records, model) if r["params"]["phase"] == "inference"
    )
    forward_and_loss = sum(
        r["params"]["flops"]
        for r in _ops(records, model)
        if r["params"]["phase"] in ("forward", "loss")
    )
    assert (forward_only["kind"], forward_only["flops"]) == ("step", forward_and_loss)
    data = next(r["params"] for r in _ops(records, model) if r["params"]["op"] == "data")
    row_bytes = 4 * math.prod(workload.input_shape) + 8  # float32 inputs, int64 label
    assert (data["kind"], data["flops"], data["bytes"]) == ("gather", 0, 2 * BATCH * row_bytes)


def test_figures_pinned_by_hand(quick_run):
    """mlp dense0 + relu1 forward at batch 32: (2*784*256 + 256 + 256) FLOPs per sample."""
    _, _, records = quick_run
    first = _ops(records, "mlp")[0]["params"]
    assert first["flops"] == (2 * 784 * 256 + 256 + 256) * BATCH
    # bytes: dense0 reads x and W, b, writes y; relu1 reads y and writes y
    assert first["bytes"] == BATCH * (784 + 256) * 4 + (784 * 256 + 256) * 4 + BATCH * 2 * 256 * 4
    update = next(r for r in _ops(records, "cnn") if r["params"]["phase"] == "update")["params"]
    assert update["flops"] == 2 * 1_070_794
    assert update["layers"] == ["conv2d0", "conv2d3", "dense7", "dense9"]


def test_samples_stored_and_stop_reasons_valid(quick_run):
    _, header, records = quick_run
    assert header["machine"]["cpu_model"] is not None
    assert header["run"]["settings"]["threads"] == [1]
    measurements = [r for r in records if r["type"] == "measurement"]
    assert {r["name"] for r in measurements} == {"op", "gemm", "triad"}
    for r in measurements:
        assert r["benchmark"] == "compute"
        assert r["stop_reason"] in STOP_REASONS
        assert r["warmup_discarded"] >= 1
        assert len(r["samples"]) == r["summary"]["n"] >= QUICK_POLICY.min_samples
        assert all(s > 0 for s in r["samples"])


def test_references_recorded(quick_run):
    proc, _, records = quick_run
    gemm = [r["params"] for r in _cpu(records, "gemm")]
    assert gemm == [
        {
            "threads": 1,
            "device": "cpu",
            "oversubscribed": False,
            "m": 256,
            "n": 256,
            "k": 256,
            "flops": 2 * 256**3,
            "dtype": "float32",
        }
    ]
    (triad,) = [r["params"] for r in _cpu(records, "triad")]
    assert triad["bytes"] == 3 * 8 * triad["elements"]
    cache = last_level_cache_bytes()
    assert triad["bytes"] > (cache or 0), "triad's arrays fit in the last-level cache"
    assert "GFLOP/s" in proc.stdout and "GB/s" in proc.stdout


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_the_step_and_each_op_are_timed(quick_run, model):
    """Every op, the gather and the whole step have a time: finite and above 0, the step
    longer than its gather. How the ops' sum compares with the step (about 0.8x: an op
    repeated alone finds its operands in cache; docs/evidence.md, "Compute") is the machine's,
    and a shared machine moves it: a figure for the evidence, not an assertion here."""
    _, _, records = quick_run
    medians = {
        (r["params"]["op"], r["params"]["phase"]): Measurement.from_record(r).median
        for r in _ops(records, model)
    }
    step, data = medians.pop(("data+step", "step")), medians.pop(("data", "data"))
    assert all(math.isfinite(t) and t > 0 for t in (step, data, *medians.values())), medians
    assert step > data


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the no-GPU path cannot be exercised")
def test_auto_device_skips_the_gpu_in_one_line(quick_run):
    proc, _, records = quick_run
    notes = [line for line in proc.stdout.splitlines() if line.startswith("no GPU")]
    assert len(notes) == 1 and "skipping" in notes[0]
    assert all(r["params"]["device"] == "cpu" for r in records if r["type"] == "measurement")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the no-GPU path cannot be exercised")
def test_explicit_gpu_without_one_is_an_error(tmp_path):
    proc = microbench("compute", "--device", "gpu", "--quick", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--device gpu: no GPU" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--threads", "0"], "at least 1"),
        (["--threads", "1,x"], "positive integers"),
        (["--model", "nosuchmodel"], "no workload preset or file named 'nosuchmodel'"),
        (["--batch", "32,sixty"], "positive integers"),
        (["--batch", "32.5"], "positive integers"),
        (["--device", "tpu"], "invalid choice"),
        (["--momentum", "1.5"], "[0, 1)"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, args, problem):
    proc = microbench("compute", *args, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and problem in proc.stderr, proc.stderr
    assert proc.stderr.startswith(PROG) and "Traceback" not in proc.stderr


def test_a_gemm_past_the_memory_is_refused_before_anything_is_measured(tmp_path):
    """--gemm-sizes 100000 (three 37 GiB matrices) failed only when reached, after the triad's
    point was recorded: a second try then needed --append. 10**200 overflowed the message."""
    for size in ("100000000", "1" + "0" * 200):
        proc = microbench("compute", "--gemm-sizes", f"256,{size}", "--out", str(tmp_path / "r"))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert "float32 matrices take" in proc.stderr and "; give sizes up to" in proc.stderr
        assert not (tmp_path / "r").exists()


def test_check_gemm_memory_passes_what_fits():
    check_gemm_memory((256, 1024), 3 * 4 * 1024 * 1024)
    check_gemm_memory((10**6,), None)  # memory unknown: the benchmark finds out
    with pytest.raises(UserError, match="--gemm-sizes 1025: .* give sizes up to 1,024"):
        check_gemm_memory((1025,), 3 * 4 * 1024 * 1024)


def test_out_that_is_a_file_gets_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    proc = microbench("compute", "--quick", "--out", str(tmp_path / "file"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is a file; give a directory" in proc.stderr


# ------------------------------------------------------------------------- in-process


def test_op_groups_follow_the_networks_fusion():
    workload = load_workload("cnn")
    groups = op_groups(workload, Network(workload).ops)
    assert [g.name for g in groups] == OPS["cnn"]
    assert [g.kind for g in groups] == ["conv2d", "conv2d", "flatten", "dense", "dense"]


def test_byte_and_update_estimates():
    dense2 = load_workload("mlp").layers[2]  # 256 -> 128, needs an input gradient
    params = (256 * 128 + 128) * 4
    assert layer_bytes(dense2, "forward", 10) == 10 * (256 + 128) * 4 + params
    assert layer_bytes(dense2, "backward", 10) == 10 * (128 + 2 * 256) * 4 + 2 * params
    assert update_cost(100, 0.0) == (200, 1200)
    assert update_cost(100, 0.9) == (400, 2000)


def test_triad_size_rule():
    assert triad_elements(64 << 20, None, 64 << 20) == (256 << 20) // 24
    assert triad_elements(1 << 20, None, 64 << 20) == (64 << 20) // 24  # the floor
    assert triad_elements(64 << 20, 800 << 20, 64 << 20) == (100 << 20) // 24  # memory cap


def test_gpu_path_on_a_stand_in_for_cupy(monkeypatch, tmp_path):
    """The GPU code path's control flow and records, on numpy posing as CuPy (no CUDA)."""
    fake_cupy.install(monkeypatch)
    gpu, why = find_gpu()
    assert gpu is not None, why
    plan = ComputePlan(
        workloads=(load_workload("mlp"),),
        threads=(1,),
        batches=(),
        gpu_batches=(4,),
        gemm_sizes=(),
        gpu_gemm_sizes=(64,),
        policy=QUICK_POLICY,
        cpu=False,
        gpu=gpu,
    )
    with RecordWriter(tmp_path / "compute.jsonl", {}) as writer:
        results = run_compute(plan, writer)
    _, records = read_records(tmp_path / "compute.jsonl")
    # triad, gemm; 3 ops x 2, loss, update, step, forward-only step
    assert len(records) == len(results) == 2 + 10
    assert {r["params"]["device"] for r in records} == {"gpu"}
    assert {r["clock"] for r in records} == {"cuda_event"}
    assert "gpu" in format_summary(records)


def test_no_cupy_means_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert find_gpu() == (None, "CuPy is not installed")


@pytest.mark.parametrize("model", ["rescnn", "transformer"])
def test_graph_networks_time_every_op_on_what_the_step_hands_it(model):
    """A network with skips: each op's forward gets its sources' outputs (a list for an add)
    and each backward the gradient the step hands it (summed where a skip has two readers),
    in the step's own backward order; every point runs."""
    workload = load_workload(model)
    net, opt = Network(workload, seed=0), SGD(0.01, 0.9)
    points = network_points(net, opt, 4, {"model": model}, lambda: None)
    backward = [p.params["op"] for p in points if p.params["phase"] == "backward"]
    groups = op_groups(workload, net.ops)
    _, _, _, handed = net.step_arguments(*random_batch(workload, 4, np.random.default_rng(0)))
    assert backward == [groups[k].name for k, _ in handed]
    assert len(backward) == len(net.ops)  # every op has parameters or feeds one that has
    for point in points:
        point.fn()
        if point.cleanup is not None:
            point.cleanup()
