"""OverlapModel: IMB-NBC overlap and slowdowns recovered from synthetic interference records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.overlap import OverlapModel, overlap_fraction
from microbench.errors import UserError
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe

T_CPU = 5e-3
# bytes -> (t_comm, overlap fraction, compute slowdown, comm slowdown)
TRUTH = {1 << 16: (1e-3, 0.2, 1.02, 1.5), 1 << 20: (3e-3, 0.6, 1.1, 1.2)}


def write_interference(path, seed: int, ranks: int = 2, n: int = 40, noise: float = 0.01):
    rng = np.random.default_rng(seed)

    def noisy(t: float) -> np.ndarray:
        return t * rng.lognormal(0.0, noise, n)

    with RecordWriter(path / "interference.jsonl", {"hostname": "test"}, append=True) as writer:
        for method in ("nbc", "thread"):
            for nbytes, (t_comm, overlap, compute_slow, comm_slow) in TRUTH.items():
                params = {
                    "method": method,
                    "op": "allreduce",
                    "bytes": nbytes,
                    "ranks": ranks,
                    "ranks_per_node": ranks,
                    "threads": 1,
                    "compute_s_target": T_CPU,
                }
                t_both = t_comm + T_CPU - overlap * min(t_comm, T_CPU)
                thread = method == "thread"
                comm = Measurement(noisy(t_comm), "interference", "comm_alone", params)
                cpu = Measurement(noisy(T_CPU), "interference", "compute_alone", params)
                both = Measurement(noisy(t_both), "interference", "both", params)
                inside = noisy(t_comm * comm_slow) if thread else None
                writer.write(comm.to_record(comm_samples=noisy(t_comm) if thread else None))
                writer.write(cpu.to_record())
                writer.write(
                    both.to_record(compute_samples=noisy(T_CPU * compute_slow), comm_samples=inside)
                )
    return load_dataframe(path)


def test_overlap_fraction_is_imb_nbc():
    assert overlap_fraction(2.0, 5.0, 5.0) == 1.0  # fully hidden
    assert overlap_fraction(2.0, 5.0, 7.0) == 0.0  # serialised
    assert overlap_fraction(2.0, 5.0, 6.0) == pytest.approx(0.5)
    assert overlap_fraction(2.0, 5.0, 8.0) == 0.0  # slower than serial: clamped


def test_recovers_overlap_and_slowdowns(tmp_path):
    model = OverlapModel(n_boot=100).fit(write_interference(tmp_path, seed=0))
    for method in ("nbc", "thread"):
        for nbytes, (_, overlap, compute_slow, comm_slow) in TRUTH.items():
            assert model.hidden_fraction(nbytes, method) == pytest.approx(overlap, abs=0.05)
            assert model.compute_slowdown(nbytes, method) == pytest.approx(compute_slow, rel=0.02)
            if method == "thread":
                assert model.comm_slowdown(nbytes, method) == pytest.approx(comm_slow, rel=0.03)
            else:
                assert model.comm_slowdown(nbytes, method) is None
    # Between the sizes: interpolated in log size; beyond them: held.
    assert model.hidden_fraction(1 << 18, "thread") == pytest.approx(0.4, abs=0.05)
    assert model.hidden_fraction(1 << 30, "thread") == model.hidden_fraction(1 << 20, "thread")
    assert model.quality_dict()["n_points"] == 4


def test_intervals_contain_the_truth_in_most_seeds(tmp_path):
    hits, total = 0, 0
    for seed in range(5):
        (tmp_path / str(seed)).mkdir()
        model = OverlapModel(n_boot=100, seed=seed).fit(
            write_interference(tmp_path / str(seed), seed)
        )
        for point in model.points_:
            _, overlap, compute_slow, _ = TRUTH[point.bytes]
            for name, truth in (("overlap_fraction", overlap), ("compute_slowdown", compute_slow)):
                interval = point.intervals[name]
                assert interval.low <= getattr(point, name) <= interval.high
                hits += interval.low <= truth <= interval.high
                total += 1
    assert hits >= 0.75 * total


def test_one_rank_points_are_left_out_when_more_ranks_were_measured(tmp_path):
    write_interference(tmp_path, seed=1, ranks=1, noise=0.0)
    df = write_interference(tmp_path, seed=1, ranks=2)
    model = OverlapModel(n_boot=0).fit(df)
    assert model.ranks_ == 2
    assert {p.ranks for p in model.points_} == {2}
    only_one = OverlapModel(n_boot=0).fit(df[df["params.ranks"] == 1])
    assert only_one.ranks_ == 1 and only_one.points_


def test_round_trip_through_json(tmp_path):
    model = OverlapModel(n_boot=20).fit(write_interference(tmp_path, seed=2))
    doc = json.loads(json.dumps(model.to_dict()))
    again = OverlapModel.from_dict(doc)
    assert again.to_dict() == doc
    assert again.hidden_fraction(123456, "nbc") == model.hidden_fraction(123456, "nbc")


def test_no_interference_records_is_a_user_error(tmp_path):
    with RecordWriter(tmp_path / "x.jsonl", {"hostname": "test"}) as writer:
        writer.write(Measurement([1.0], "jitter", "step_compute", {}).to_record())
    with pytest.raises(UserError, match="no interference records"):
        OverlapModel().fit(load_dataframe(tmp_path))
