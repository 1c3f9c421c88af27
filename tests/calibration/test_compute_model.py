"""ComputeModel: recovery of a known roofline and thread scaling from synthetic noisy records."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.compute import ComputeModel
from calibration.roofline import roofline_time
from calibration.scaling import amdahl_speedup, fit_scaling, usl_speedup
from microbench.errors import UserError
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe

PEAK, BW = 100e9, 20e9
CLASSES = {  # (kind, phase) -> (e_max, f_half)
    ("dense", "forward"): (0.6, 2e6),
    ("conv2d", "backward"): (0.3, 2e7),
}
BW_EFF, OVERHEAD = 1.5, 2e-6
BATCHES = (8, 32, 128, 512)
GEMM_FLOPS = 2 * 1024**3
TRIAD_BYTES = 3 * 8 * 2**22


def _ops() -> list[dict]:
    """Ops of a fake network: two compute classes, a memory-bound update, an empty flatten."""
    ops = []
    for b in BATCHES:
        for i, per_sample in enumerate((2e5, 1e6)):
            ops.append(("dense", "forward", f"dense{i}", b, b * per_sample, b * 4e3 + 1e5))
        for i, per_sample in enumerate((5e6, 2e7)):
            ops.append(("conv2d", "backward", f"conv{i}", b, b * per_sample, b * 3e4))
        ops.append(("flatten", "forward", "flatten", b, 0.0, 0.0))
        ops.append(("sgd", "update", "update", b, 2e5, 1.2e6))
        ops.append(("sgd", "update", "big_update", b, 2e6, 1.2e7))
    keys = ("kind", "phase", "op", "batch", "flops", "bytes")
    return [dict(zip(keys, op, strict=True)) for op in ops]


def true_time(kind: str, phase: str, flops, nbytes, speedup: float = 1.0):
    e, h = CLASSES.get((kind, phase), (0.5, 1e6))
    return roofline_time(flops, nbytes, PEAK, BW, e, h, BW_EFF, OVERHEAD) / speedup


def write_records(path, seed: int, threads=(1,), speedup=lambda n: 1.0, noise=0.03, n=15):
    rng = np.random.default_rng(seed)

    def samples(t: float) -> np.ndarray:
        return t * rng.lognormal(0.0, noise, n)

    with RecordWriter(path / "compute.jsonl", {"hostname": "test"}) as writer:
        for t in threads:
            s = float(speedup(t))
            base = {"threads": t, "device": "cpu"}
            for name, params, time in (
                ("gemm", {"flops": GEMM_FLOPS, "m": 1024, "n": 1024, "k": 1024}, GEMM_FLOPS / PEAK),
                ("triad", {"bytes": TRIAD_BYTES}, TRIAD_BYTES / BW),
            ):
                m = Measurement(samples(time / s), "compute", name, {**params, **base})
                writer.write(m.to_record())
            for op in _ops():
                time = float(true_time(op["kind"], op["phase"], op["flops"], op["bytes"], s))
                params = {**op, **base, "model": "toy", "layers": [op["op"]]}
                writer.write(Measurement(samples(time), "compute", "op", params).to_record())
    return load_dataframe(path)


def test_recovers_roofline_and_class_curves(tmp_path):
    model = ComputeModel(n_boot=40).fit(write_records(tmp_path, seed=1))
    roof = model.curves_[("cpu", 1)]
    assert roof.peak_flops_per_s == pytest.approx(PEAK, rel=0.03)
    assert roof.bandwidth_bytes_per_s == pytest.approx(BW, rel=0.03)
    assert roof.bandwidth_efficiency == pytest.approx(BW_EFF, rel=0.05)
    assert roof.overhead_s == pytest.approx(OVERHEAD, rel=0.15)
    for (kind, phase), (e, h) in CLASSES.items():
        fitted_e, fitted_h = roof.classes[f"{kind}:{phase}"]
        assert fitted_e == pytest.approx(e, rel=0.05)
        assert fitted_h == pytest.approx(h, rel=0.2)
    quality = model.quality_[("cpu", 1)]
    assert quality["median_rel_error"] < 0.03
    assert quality["leave_out_rel_error"] < 0.05
    # An unseen size of a known class, from the curve:
    f, b = 3e9, 1e6
    expected = true_time("dense", "forward", f, b)
    assert model.predict(f, b, kind="dense", phase="forward") == pytest.approx(expected, rel=0.05)


def test_intervals_contain_the_truth_in_most_seeds(tmp_path):
    hits = {"efficiency_max": 0, "bandwidth_efficiency": 0, "peak_flops_per_s": 0}
    truth = {"efficiency_max": 0.6, "bandwidth_efficiency": BW_EFF, "peak_flops_per_s": PEAK}
    seeds = range(5)
    for seed in seeds:
        (tmp_path / str(seed)).mkdir()
        model = ComputeModel(n_boot=40, seed=seed).fit(write_records(tmp_path / str(seed), seed))
        found = model.intervals_[("cpu", 1)]
        dense = found["classes"]["dense:forward"]["efficiency_max"]
        for name, interval in (
            ("efficiency_max", dense),
            ("bandwidth_efficiency", found["scalars"]["bandwidth_efficiency"]),
            ("peak_flops_per_s", found["scalars"]["peak_flops_per_s"]),
        ):
            assert interval["low"] <= interval["high"]
            hits[name] += interval["low"] <= truth[name] <= interval["high"]
    assert all(count >= 3 for count in hits.values()), hits


def test_measured_ops_come_from_the_table_and_unseen_batches_from_the_curve(tmp_path):
    df = write_records(tmp_path, seed=2)
    model = ComputeModel(n_boot=0).fit(df)
    row = df[(df["params.op"] == "dense1") & (df["params.batch"] == 32)].iloc[0]
    assert model.op_time("dense1", "forward", 32) == pytest.approx(np.median(row["samples"]))
    op = next(o for o in _ops() if o["op"] == "conv1")  # per-sample FLOPs and bytes
    flops, nbytes = op["flops"] / op["batch"] * 64, op["bytes"] / op["batch"] * 64
    expected = true_time("conv2d", "backward", flops, nbytes)
    assert model.op_time("conv1", "backward", 64) == pytest.approx(expected, rel=0.05)
    with pytest.raises(KeyError):
        model.op_time("nonesuch", "forward", 32)


@pytest.mark.parametrize(
    ("law", "truth"),
    [("amdahl", {"serial_fraction": 0.1}), ("usl", {"sigma": 0.05, "kappa": 0.02})],
)
def test_thread_scaling_recovers_amdahl_and_usl(tmp_path, law, truth):
    def speedup(n):
        fn = amdahl_speedup if law == "amdahl" else usl_speedup
        return fn(n, *truth.values())

    df = write_records(tmp_path, seed=3, threads=(1, 2, 4, 8, 16), speedup=speedup, noise=0.01)
    model = ComputeModel(n_boot=20).fit(df)
    fit = model.scaling_["cpu"]["all"]
    assert fit.chosen == law
    for name, value in truth.items():
        assert fit.params[law][name] == pytest.approx(value, rel=0.15, abs=0.005)
        interval = fit.intervals[law][name]
        assert interval.low <= fit.params[law][name] <= interval.high
    assert set(fit.params) == {"amdahl", "usl"}  # both are reported
    # An unmeasured thread count goes through the chosen law:
    op = next(o for o in _ops() if o["op"] == "dense1" and o["batch"] == 32)
    expected = true_time("dense", "forward", op["flops"], op["bytes"], speedup(12))
    assert model.op_time("dense1", "forward", 32, threads=12) == pytest.approx(expected, rel=0.05)


def test_scaling_fit_without_one_thread_uses_relative_speedups():
    n = np.array([4, 8, 16])
    ratio = amdahl_speedup(n, 0.2) / amdahl_speedup(2, 0.2)  # T(2) / T(n): no 1-thread point
    fit = fit_scaling(n, ratio, base_threads=2)
    assert fit.params["amdahl"]["serial_fraction"] == pytest.approx(0.2, abs=1e-6)
    assert fit.speedup_at(1) == pytest.approx(1.0)


def test_gpu_records_get_their_own_curve(tmp_path):
    df = write_records(tmp_path, seed=4)
    gpu = df.copy()
    gpu["params.device"] = "gpu"
    gpu["samples"] = gpu["samples"].map(lambda s: [x / 10 for x in s])
    model = ComputeModel(n_boot=0).fit(pd.concat([df, gpu], ignore_index=True))
    assert model.devices == ["cpu", "gpu"]
    cpu = model.curves_[("cpu", 1)].peak_flops_per_s
    assert model.curves_[("gpu", 1)].peak_flops_per_s == pytest.approx(10 * cpu)
    assert model.scaling_ == {}


def test_round_trip_through_json(tmp_path):
    df = write_records(tmp_path, seed=5, threads=(1, 2), speedup=lambda n: n**0.8)
    model = ComputeModel(n_boot=10).fit(df)
    doc = json.loads(json.dumps(model.to_dict()))
    again = ComputeModel.from_dict(doc)
    assert again.to_dict() == doc
    assert again.predict(1e9, 1e6, threads=4, kind="dense", phase="forward") == pytest.approx(
        model.predict(1e9, 1e6, threads=4, kind="dense", phase="forward")
    )
    assert again.op_time("conv0", "backward", 100, threads=2) == pytest.approx(
        model.op_time("conv0", "backward", 100, threads=2)
    )


def test_without_gemm_and_triad_the_best_ops_are_the_roofs(tmp_path):
    df = write_records(tmp_path, seed=6)
    model = ComputeModel(n_boot=0).fit(df[df["name"] == "op"])
    references = model.references_[("cpu", 1)]
    assert references["peak_source"] == "best_op" and references["gemm_flops"] is None
    ops = df[df["name"] == "op"]
    best = (ops["params.flops"] / ops["samples"].map(np.median)).max()
    assert model.curves_[("cpu", 1)].peak_flops_per_s == pytest.approx(best)
    assert model.quality_[("cpu", 1)]["median_rel_error"] < 0.05


def test_no_op_records_is_a_user_error(tmp_path):
    df = write_records(tmp_path, seed=7)
    with pytest.raises(UserError, match="no compute op records"):
        ComputeModel().fit(df[df["name"] != "op"])
