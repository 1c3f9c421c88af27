"""calibration.formulas / algorithms / communication / transfer / readers: algorithms chosen by
extrapolation across process counts, parameters recovered, two-level model, round trips."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.algorithms import CollectiveModel, InterNode
from calibration.communication import CollectiveModels
from calibration.formulas import ALGORITHMS, coefficients, cost, two_level_coefficients
from calibration.readers import collective_points, copy_points
from calibration.stats import FitError
from calibration.transfer import TransferModel
from microbench.errors import UserError
from tests.train.synthetic_comm import SIZES, collective_params, points_frame, write_records

A, B, G = 5e-6, 1e-10, 2e-11  # 5 us, 10 GB/s, 50 GB/s reduction


def flat(op: str, alg: str, a: float = A, b: float = B, g: float = G):
    return lambda p, q, n: cost(op, alg, p, n, a, b, g)


# ---------------------------------------------------------------------------- formulas


def test_formulas_match_the_textbook_at_a_power_of_two():
    n, p = 1 << 20, 8
    expected = {
        "ring": (14, 2 * n * 7 / 8, n * 7 / 8),
        "recursive_doubling": (3, 3 * n, 3 * n),
        "rabenseifner": (6, 2 * n * 7 / 8, n * 7 / 8),
        "binomial": (6, 6 * n, 3 * n),
    }
    for alg, columns in expected.items():
        assert coefficients("allreduce", alg, p, n)[0] == pytest.approx(columns)
    assert coefficients("bcast", "scatter_allgather", 8, n)[0] == pytest.approx(
        (10, 2 * n * 7 / 8, 0)
    )
    assert coefficients("allgather", "ring", 8, n)[0] == pytest.approx((7, 7 * n, 0))
    assert coefficients("reduce_scatter", "recursive_halving", 8, n)[0] == pytest.approx(
        (3, 7 * n, 7 * n)
    )


def test_formulas_at_one_rank_and_a_non_power_of_two():
    for op, algorithms in ALGORITHMS.items():
        if op != "pingpong":
            for alg in algorithms:
                assert np.all(coefficients(op, alg, 1, 4096) == 0), (op, alg)
    # Recursive doubling at p = 6 folds 2 extra ranks in and out: lg 4 + 2 steps.
    assert coefficients("allreduce", "recursive_doubling", 6, 100)[0] == pytest.approx(
        (4, 400, 300)
    )
    assert coefficients("allreduce", "binomial", 6, 100)[0] == pytest.approx((6, 600, 300))


def test_two_level_formula_composes_reduce_allreduce_bcast():
    n, p, q = 4096.0, 16, 4  # 4 nodes of 4
    cols = two_level_coefficients("allreduce", "ring", p, q, n)[0]
    ring4 = coefficients("allreduce", "ring", 4, n)[0]
    assert cols == pytest.approx([4, 4 * n, ring4[0], ring4[1], 2 * n + ring4[2]])
    with pytest.raises(ValueError, match="no algorithm"):
        coefficients("allreduce", "tree", 4, 8)


# ---------------------------------------------------------------------------- selection


def test_ring_data_chooses_ring_and_predicts_64_ranks():
    df = points_frame("allreduce", [(2, 2), (4, 4), (8, 8)], flat("allreduce", "ring"), seed=1)
    model = CollectiveModel("allreduce", n_boot=50).fit(df)
    assert model.algorithm_ == ["ring"]
    truth = cost("allreduce", "ring", 64, np.array(SIZES, float), A, B, G)
    assert np.max(np.abs(model.predict(SIZES, 64) - truth) / truth) < 0.05
    regime = model.regimes_[0]
    assert regime.a_s == pytest.approx(A, rel=0.03)
    assert regime.b_s_per_byte == pytest.approx(B + G / 2, rel=0.03)  # b absorbs g (2:1)
    assert regime.candidates["ring"] < 0.5 * min(
        v for k, v in regime.candidates.items() if k != "ring"
    )
    assert model.cv_error_ < 0.02 and model.quality_.leave_out_rel_error < 0.02


@pytest.mark.parametrize("alg", ["recursive_doubling", "rabenseifner", "binomial"])
def test_each_algorithm_is_recognised(alg):
    ranks = [2, 3, 4, 6, 8]  # non-powers of two tell recursive doubling from binomial
    df = points_frame("allreduce", [(p, p) for p in ranks], flat("allreduce", alg), seed=2)
    model = CollectiveModel("allreduce", g_s_per_byte=G, n_boot=0).fit(df)
    assert model.algorithm_ == [alg]
    assert model.params_[0]["a_s"] == pytest.approx(A, rel=0.03)
    assert model.params_[0]["b_s_per_byte"] == pytest.approx(B, rel=0.03)  # g given: b itself


def test_size_regimes_with_different_algorithms():
    def truth(p, q, n):
        small = cost("allreduce", "recursive_doubling", p, n, 2e-6, 4e-10)
        large = cost("allreduce", "ring", p, n, 30e-6, 1e-10)
        return np.where(n < 64 << 10, small, large)

    df = points_frame("allreduce", [(2, 2), (4, 4), (8, 8)], truth, seed=3)
    model = CollectiveModel("allreduce", n_boot=0).fit(df)
    assert model.selection_["segmentation"] == "split"
    assert model.algorithm_[-1] == "ring" and model.regimes_[-1].min_bytes == 64 << 10
    assert model.algorithm_[0] in ("recursive_doubling", "binomial")  # same lg p shape at 2^k
    n = np.array(SIZES, float)
    assert np.max(np.abs(model.predict(n, 32) - truth(32, 32, n)) / truth(32, 32, n)) < 0.05


def test_one_process_count_takes_the_default_algorithm():
    df = points_frame("allreduce", [(4, 4)], flat("allreduce", "ring"), seed=4)
    model = CollectiveModel("allreduce", n_boot=0).fit(df)
    assert model.cv_error_ is None and model.quality_.leave_out_rel_error is None
    assert set(model.algorithm_) == {"rabenseifner"}
    assert model.predict(1 << 20, 4) == pytest.approx(
        cost("allreduce", "ring", 4, 1 << 20, A, B, G), rel=0.05
    )


def test_intervals_cover_the_truth_and_contain_the_estimates():
    df = points_frame("allreduce", [(2, 2), (4, 4), (8, 8)], flat("allreduce", "ring", g=0), seed=5)
    regime = CollectiveModel("allreduce", n_boot=100).fit(df).regimes_[0]
    assert regime.intervals["a_s"].contains(regime.a_s)
    assert regime.intervals["b_s_per_byte"].contains(regime.b_s_per_byte)
    width = regime.intervals["b_s_per_byte"].high / regime.intervals["b_s_per_byte"].low - 1
    assert 0 < width < 0.05


# ---------------------------------------------------------------------------- two-level


def two_level_truth(p, q, n, a_e=8e-6, b_e=4e-10):
    if q >= p:
        return cost("allreduce", "ring", p, n, A, B)
    return two_level_coefficients("allreduce", "ring", p, q, n) @ [A, B, a_e, b_e, 0.0]


def test_two_level_recovers_inter_node_parameters():
    groups = [(2, 2), (4, 4), (8, 8), (8, 2), (16, 4), (16, 2), (32, 4)]
    df = points_frame("allreduce", groups, two_level_truth, seed=6)
    model = CollectiveModel("allreduce", n_boot=30).fit(df)
    inter = model.regimes_[0].inter
    assert inter.source == "fitted" and inter.algorithm == "ring"
    assert inter.a_s == pytest.approx(8e-6, rel=0.05)
    assert inter.b_s_per_byte == pytest.approx(4e-10, rel=0.03)
    n = np.array(SIZES, float)
    truth = two_level_truth(256, 8, n)
    assert np.max(np.abs(model.predict(n, 256, 8) - truth) / truth) < 0.05


def test_single_node_records_take_inter_node_parameters_as_given():
    df = points_frame("allreduce", [(2, 2), (4, 4), (8, 8)], two_level_truth, seed=7)
    with pytest.raises(ValueError, match="inter-node"):
        CollectiveModel("allreduce", n_boot=0).fit(df).predict(1024, 64, 8)
    preset = InterNode(8e-6, 4e-10, "ring", source="preset:test")
    model = CollectiveModel("allreduce", inter_node=preset, n_boot=0).fit(df)
    n = np.array(SIZES, float)
    truth = two_level_truth(64, 8, n)
    assert np.max(np.abs(model.predict(n, 64, 8) - truth) / truth) < 0.05
    assert model.predict(n, 8, 8) == pytest.approx(model.predict(n, 8))  # one node: flat
    back = CollectiveModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert back.inter_node == preset and np.allclose(
        back.predict(n, 64, 8), model.predict(n, 64, 8)
    )


# ---------------------------------------------------------------------------- records path


def test_records_to_models_round_trip(tmp_path):
    frames = [
        points_frame("allreduce", [(1, 1), (2, 2), (4, 4)], flat("allreduce", "ring"), seed=8),
        points_frame("bcast", [(2, 2), (4, 4)], flat("bcast", "binomial"), seed=9),
        points_frame("barrier", [(2, 2), (4, 4), (8, 8)], flat("barrier", "dissemination"), [0]),
        points_frame("allgather", [(1, 1)], flat("allgather", "ring"), seed=10),
    ]
    records = write_records(
        tmp_path / "c.jsonl", "collectives", pd.concat(frames), collective_params
    )
    points = collective_points(records)
    assert len(points) == 3 * 24 + 2 * 24 + 3 + 24
    assert isinstance(points["samples"][0], np.ndarray) and points["n_samples"][0] == 20
    models = CollectiveModels(n_boot=20).fit(records)
    assert set(models.models_) == {"allreduce", "bcast", "barrier"}
    assert "allgather" in models.skipped_  # one rank only: nothing to fit
    assert models.models_["allreduce"].selection_["left_out_one_rank_points"] == 24
    assert models.models_["allreduce"].algorithm_ == ["ring"]
    assert models.models_["bcast"].algorithm_ == ["binomial"]
    assert models.predict("barrier", 0, 64) == pytest.approx(6 * A, rel=0.05)
    doc = json.loads(json.dumps(models.to_dict(), allow_nan=False))
    assert doc["model"] == "collectives" and set(doc["collectives"]) == set(models.models_)
    back = CollectiveModels.from_dict(doc)
    n = np.array(SIZES, float)
    assert np.array_equal(back.predict("allreduce", n, 16), models.predict("allreduce", n, 16))
    assert back.quality_dict() == models.quality_dict()
    assert back.models_["allreduce"].hockney_.keys() == models.models_["allreduce"].hockney_.keys()


def test_oversubscribed_points_are_flagged_and_can_be_dropped(tmp_path):
    df = points_frame("allreduce", [(2, 2), (4, 4), (8, 8)], flat("allreduce", "ring"), seed=11)
    machine = {"hostname": "small", "logical_cores": 8, "cores_available": 4}
    records = write_records(tmp_path / "c.jsonl", "collectives", df, collective_params, machine)
    flags = collective_points(records).groupby("ranks")["oversubscribed"].all()
    assert flags.to_dict() == {2: False, 4: False, 8: True}
    kept = CollectiveModel("allreduce", n_boot=0).fit(records)
    assert kept.selection_["oversubscribed_process_counts"] == ["8/8"]
    dropped = CollectiveModel("allreduce", n_boot=0, drop_oversubscribed=True).fit(records)
    assert dropped.selection_["process_counts"] == ["2/2", "4/4"]
    assert dropped.selection_["oversubscribed_process_counts"] == ["8/8"]
    assert dropped.algorithm_ == ["ring"]


def test_no_collectives_is_a_user_error():
    with pytest.raises(UserError, match="no 'collectives' measurements"):
        collective_points(pd.DataFrame({"type": ["measurement"], "benchmark": ["gemm"]}))
    with pytest.raises(FitError, match="2 or more ranks"):
        CollectiveModel("allreduce").fit(
            points_frame("allreduce", [(1, 1)], flat("allreduce", "ring"))
        )


def test_transfer_model_per_direction_and_memory_kind(tmp_path):
    truths = {("h2d", True): (10e-6, 1 / 12e9), ("d2h", True): (10e-6, 1 / 13e9)}
    truths[("h2d", False)] = (20e-6, 1 / 6e9)
    rows = []
    for (direction, pinned), (alpha, beta) in truths.items():
        frame = points_frame("copy", [(1, 1)], lambda p, q, n, a=alpha, b=beta: a + b * n)
        rows.append(frame.assign(direction=direction, pinned=pinned))

    def params(row):
        return {
            "name": row.direction,
            "direction": row.direction,
            "pinned": row.pinned,
            "bytes": row.bytes,
            "device": "gpu",
            "gpu": 0,
        }

    records = write_records(tmp_path / "copies.jsonl", "copies", pd.concat(rows), params)
    assert len(copy_points(records)) == 3 * 24
    model = TransferModel(n_boot=20).fit(records)
    for (direction, pinned), (alpha, beta) in truths.items():
        regime = model.curves_[(direction, pinned)].regimes_[-1]
        assert regime.beta_s_per_byte == pytest.approx(beta, rel=0.03)
        assert model.predict(direction, 1 << 28, pinned) == pytest.approx(
            alpha + beta * 2**28, rel=0.03
        )
    with pytest.raises(KeyError, match="d2h pageable"):
        model.predict("d2h", 1024, pinned=False)
    doc = json.loads(json.dumps(model.to_dict()))
    assert set(doc["directions"]) == {"h2d", "d2h"} and set(doc["directions"]["h2d"]) == {
        "pinned",
        "pageable",
    }
    back = TransferModel.from_dict(doc)
    assert back.predict("h2d", 4096, False) == pytest.approx(model.predict("h2d", 4096, False))
