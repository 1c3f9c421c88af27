"""Co-location in place: rank 0's compute alone beside the data-parallel step's compute, round
by round, gives the factor a data-parallel prediction at the measured placement uses."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from calibration.insitu import InSituModel
from microbench.insitu import Call, alone_record, insitu_records, split_rounds
from microbench.workload import load_workload

ALONE_S = 1e-4  # rank 0's forward and backward alone at the fast level


def colocation_frame(
    factors: dict[int, float], levels: tuple[float, ...] = (1.0, 1.5, 1.0, 1.5)
) -> pd.DataFrame:
    """The MLP's data-parallel step at 2 ranks, 20 samples per batch in one round per entry of
    ``levels`` (the machine's speed then): the barrier, each rank's compute in place at
    ``factors[batch]`` x the compute alone, and rank 0's compute alone."""
    level = np.repeat(np.asarray(levels), split_rounds(20, len(levels)))
    records = []
    for batch, factor in factors.items():
        params = {"model": "mlp", "batch": batch, "threads": 1, "ranks": 2,
                  "ranks_per_node": 2, "rounds": len(levels)}  # fmt: skip
        alone = ALONE_S * level
        calls = [Call("barrier", "step", 0, "data"), Call("compute", "step", 0, "data")]
        table = np.stack([np.full(20, 1e-5), factor * alone])[None].repeat(2, axis=0)
        records += insitu_records(calls, np.moveaxis(table, 1, 2), params, warmup=5)
        records.append(alone_record(alone, {**params, "parallel": "data"}, None))
    return pd.json_normalize(records)


def test_the_factor_is_each_rounds_in_place_over_alone_whatever_the_speed():
    """Rounds at two speeds 1.5x apart: the factor is the ratio within each round, 1.08 at
    batch 16 and 1.02 at 64, kept on the barrier's point through the profile's JSON; a step
    without the compute alone has none."""
    frame = pd.concat([colocation_frame({16: 1.08, 64: 1.02}), colocation_frame({32: 1.1})])
    frame = frame[~((frame["params.batch"] == 32) & (frame["params.statistic"] == "alone"))]
    model = InSituModel().fit(frame)
    found = model.colocations("mlp", "data")
    assert [(p.batch, p.op) for p in found] == [(16, "barrier"), (64, "barrier")]
    assert [p.colocation for p in found] == pytest.approx([1.08, 1.02], rel=1e-9)
    again = InSituModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.points_ == model.points_
    assert "colocation" not in next(p for p in model.to_dict()["points"] if p["batch"] == 32)
    assert model.colocations("mlp", "model") == []


@pytest.fixture(scope="module")
def packaged_with_colocation():
    """The packaged profile with the MLP's data-parallel step in place at 2 ranks per node:
    co-location 1.08 at batch 16 and 1.02 at 64."""
    from calibration.profile import Profile, load_profile

    doc = copy.deepcopy(load_profile("xeon-2core").to_dict())
    doc["models"]["insitu"] = InSituModel().fit(colocation_frame({16: 1.08, 64: 1.02})).to_dict()
    return Profile.from_dict(doc)


def _cost(profile, parallel: str | None = "data", ranks_per_node: int = 2):
    from pdlsim.costmodel import ProfileCostModel

    return ProfileCostModel.from_profile(
        profile, workload="mlp", ranks_per_node=ranks_per_node, batch=16, parallel=parallel
    )


def test_a_data_parallel_prediction_at_the_measured_placement_uses_the_factor_in_place(
    packaged_with_colocation,
):
    """Interpolated in the batch and held outside; at 2 threads, model parallel or one rank
    per node the co-location model's factor stays; compute moves by the ratio of the two."""
    cost = _cost(packaged_with_colocation)
    assert cost.colocation_factor(1, 16) == pytest.approx(1.08)
    assert cost.colocation_factor(1, 40) == pytest.approx(1.05)
    assert cost.colocation_factor(1, 128) == pytest.approx(1.02)
    model = packaged_with_colocation.model("colocation")
    jittered = model.factor("mlp", 2, 2)[0]
    assert cost.colocation_factor(2, 16) == pytest.approx(jittered)
    other = _cost(packaged_with_colocation, parallel="model")
    assert other.colocation_factor(1, 16) == pytest.approx(model.factor("mlp", 1, 2)[0])
    assert _cost(packaged_with_colocation, ranks_per_node=1).colocation_factor(1, 16) == 1.0
    layer = load_workload("mlp").layers[1]
    ratio = cost.compute_time(layer, "forward", 16, 1, "cpu") / other.compute_time(
        layer, "forward", 16, 1, "cpu"
    )
    assert ratio == pytest.approx(1.08 / model.factor("mlp", 1, 2)[0])
    assert "data step in place at 2 ranks per node" in cost.provenance["co-location"]
    assert "x1.080 at batch 16" in cost.provenance["co-location"]


def test_one_rank_per_node_has_no_co_location_even_from_a_model_built_for_more(
    packaged_with_colocation,
):
    """The single-device base of a speedup is the same cost model with one rank per node: the
    factor in place is not for it."""
    cost = _cost(packaged_with_colocation)
    assert cost.colocation_factor(1, 16) == pytest.approx(1.08)
    assert replace(cost, ranks_per_node=1).colocation_factor(1, 16) == 1.0
