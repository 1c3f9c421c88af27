"""Co-location in place: rank 0's compute alone beside a parallel step's compute, round by
round, gives the factor a prediction of that step at the measured placement uses; a
model-parallel step's part alone is rank 0's slices with its collectives local."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from calibration.insitu import InSituModel
from microbench.insitu import MODEL_INFERENCE, Call, alone_record, insitu_records, split_rounds
from microbench.workload import load_workload, sliced_dense
from tests.conftest import LoneComm
from tests.profiles import STEP_TABLES

ALONE_S = 1e-4  # rank 0's forward and backward alone at the fast level


def colocation_frame(
    factors: dict[int, float],
    levels: tuple[float, ...] = (1.0, 1.5, 1.0, 1.5),
    parallel: str = "data",
    share: float | None = None,
) -> pd.DataFrame:
    """The MLP's ``parallel`` step at 2 ranks, 20 samples per batch in one round per entry of
    ``levels`` (the machine's speed then): the barrier, each rank's compute in place at
    ``factors[batch]`` x the compute alone, and rank 0's compute alone; with ``share``, the
    whole network's alone as well, the part alone being that share of it."""
    level = np.repeat(np.asarray(levels), split_rounds(20, len(levels)))
    records = []
    for batch, factor in factors.items():
        params = {"model": "mlp", "batch": batch, "threads": 1, "ranks": 2,
                  "ranks_per_node": 2, "rounds": len(levels)}  # fmt: skip
        alone = ALONE_S * level
        calls = [Call("barrier", "step", 0, parallel), Call("compute", "step", 0, parallel)]
        table = np.stack([np.full(20, 1e-5), factor * alone])[None].repeat(2, axis=0)
        records += insitu_records(calls, np.moveaxis(table, 1, 2), params, warmup=5)
        records.append(alone_record(alone, {**params, "parallel": parallel}, None))
        if share is not None:
            whole = alone / share
            records.append(alone_record(whole, {**params, "parallel": parallel}, None, "whole"))
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


def profile_with(frame: pd.DataFrame):
    """The packaged profile with its in-place model fitted to ``frame``."""
    from calibration.profile import Profile, load_profile

    doc = copy.deepcopy(load_profile(STEP_TABLES).to_dict())
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    return Profile.from_dict(doc)


def load_profile_with(factors: dict[int, float], parallel: str = "data", share=None):
    """The packaged profile with the MLP's ``parallel`` step timed in place
    (:func:`colocation_frame`)."""
    return profile_with(colocation_frame(factors, parallel=parallel, share=share))


@pytest.fixture(scope="module")
def packaged_with_colocation():
    """The packaged profile with the MLP's data-parallel step in place at 2 ranks per node:
    co-location 1.08 at batch 16 and 1.02 at 64."""
    return load_profile_with({16: 1.08, 64: 1.02})


def _cost(profile, parallel: str | None = "data", ranks_per_node: int = 2):
    from pdlsim.costmodel.model import ProfileCostModel

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


def test_a_model_parallel_prediction_takes_its_own_steps_factor():
    """The model-parallel step's factor in place (1.01) is its own: a model-parallel
    prediction at 2 ranks per node takes it, a data-parallel one keeps the data step's and
    a forward-only one, not timed alone here, the co-location model's."""
    frame = pd.concat([colocation_frame({16: 1.08, 64: 1.02}),
                       colocation_frame({16: 1.01, 64: 1.01}, parallel="model")])  # fmt: skip
    profile = profile_with(frame)
    assert _cost(profile, parallel="model").colocation_factor(1, 32) == pytest.approx(1.01)
    assert _cost(profile).colocation_factor(1, 16) == pytest.approx(1.08)
    model = profile.model("colocation")
    inference = _cost(profile, parallel=MODEL_INFERENCE).colocation_factor(1, 16)
    assert inference == pytest.approx(model.factor("mlp", 1, 2)[0])
    assert "model step in place" in _cost(profile, parallel="model").provenance["co-location"]


def test_one_rank_per_node_has_no_co_location_even_from_a_model_built_for_more():
    """The single-device base of a speedup is the same cost model with one rank per node: the
    factor in place is not for it."""
    cost = _cost(load_profile_with({16: 1.08, 64: 1.02}))
    assert cost.colocation_factor(1, 16) == pytest.approx(1.08)
    assert replace(cost, ranks_per_node=1).colocation_factor(1, 16) == 1.0


# ------------------------------------------------------------------ a layer-wise rank's part


def test_the_share_is_each_rounds_part_over_the_whole_whatever_the_speed():
    """Rounds at two speeds: rank 0's part over the whole network, both alone, 0.6 in each
    round, goes on the barrier's point through the profile's JSON; a step whose whole was
    not timed has none."""
    frame = colocation_frame({16: 1.1, 64: 1.05}, parallel="model", share=0.6)
    model = InSituModel().fit(frame)
    assert [(p.batch, p.share) for p in model.shares("mlp", "model")] == [
        (16, pytest.approx(0.6, rel=1e-9)),
        (64, pytest.approx(0.6, rel=1e-9)),
    ]
    assert InSituModel.from_dict(json.loads(json.dumps(model.to_dict()))).points_ == model.points_
    assert (
        InSituModel().fit(colocation_frame({16: 1.1}, parallel="model")).shares("mlp", "model")
        == []
    )


def test_a_layer_wise_rank_computes_the_measured_share_of_the_whole():
    """A measured share of 0.5: the slices' compute over the ops' predicted share is
    0.5 / predicted, the same at 4 ranks (held); whole layers, 2 threads, a profile without
    the share and a workload whose file is gone keep 1; in the tensor plan every compute op
    moves by that factor but the first layer's mini-batch gather, and the provenance says
    so."""
    from pdlsim.sim import Cluster, Scenario
    from pdlsim.sim.tensor import build_tensor_plan

    profile = load_profile_with({16: 1.0, 64: 1.0}, parallel="model", share=0.5)
    plain = load_profile_with({16: 1.0, 64: 1.0}, parallel="model")
    cost, other = _cost(profile, parallel="model"), _cost(plain, parallel="model")
    assert cost.slice_factor(16, 1) == 1.0  # whole layers
    factor = cost.sliced(2).slice_factor(16, 1)
    mlp = load_workload("mlp")
    part = [sliced_dense(i, -(-i.output_shape[0] // 2)) if i.kind == "dense" else i
            for i in mlp.layers]  # fmt: skip

    def ops(layers):
        return sum(cost._raw_compute(i, ph, 16, 1, "cpu") for i in layers
                   for ph in ("forward", "backward", "update")
                   if ph != "update" or i.param_count)  # fmt: skip

    assert factor == pytest.approx(0.5 * ops(mlp.layers) / ops(part), rel=1e-9)
    assert factor < 0.9  # the ops predict a larger share than measured
    assert cost.sliced(4).slice_factor(16, 1) == factor
    assert cost.sliced(2).slice_factor(16, 2) == 1.0
    assert other.sliced(2).slice_factor(16, 1) == 1.0
    assert replace(cost, workload="gone.json").sliced(2).slice_factor(16, 1) == 1.0
    cluster, scenario = Cluster(1, 2, 1), Scenario(mlp, batch_per_rank=16, jitter=False)
    mine = build_tensor_plan(cluster, scenario, cost).ops
    theirs = build_tensor_plan(cluster, scenario, other).ops
    gather = cost.gather_s(mlp.layers[0], 16, 1)
    for a, b in zip(mine, theirs, strict=True):
        if a.kind != "compute" or a.time_s == 0:
            continue
        first = a.layer == mlp.layers[0].name and a.phase == "forward"
        moved = (a.time_s - gather) / (b.time_s - gather) if first else a.time_s / b.time_s
        assert moved == pytest.approx(factor, rel=1e-9), a
    assert "0.500 at batch 16" in cost.provenance["slices"]


# ------------------------------------------------------------------ the part alone, for real


def test_a_step_that_times_itself_gives_its_own_seconds():
    """A step returning a float is sampled at that float; one returning nothing, at the
    call's seconds on the clock."""
    from microbench.jitter import sample_alone

    own = iter([0.25, 0.5])
    assert list(sample_alone(lambda: next(own), 2, LoneComm())) == [0.25, 0.5]
    ticks = iter([1.0, 3.0, 10.0, 14.0])
    timed = sample_alone(lambda: None, 2, LoneComm(), clock=lambda: next(ticks))
    assert list(timed) == [2.0, 4.0]


def test_rank_zeros_slices_alone_compute_what_the_step_computes_outside_its_collectives():
    """The MLP's part alone at 2 ranks: rank 0's columns of each dense layer, the step's
    collectives in the same order (local: the allgather keeps rank 0's block and zeros the
    rest), finite results, and seconds that leave those local calls out."""
    from microbench.insitu import _sliced_step, _Solo
    from microbench.nn import SGD
    from microbench.nn.sliced import SlicedNetwork, split_columns

    workload = load_workload("mlp")
    net = SlicedNetwork(workload, _Solo(2), seed=0)
    assert [layer["columns"] for layer in net.split_layers()] == [
        list(split_columns(units, 2)[0]) for units in (256, 128, 10)
    ]
    x = np.random.default_rng(0).standard_normal((16, 784), dtype=np.float32)
    y = np.arange(16) % 10
    start = time.perf_counter()
    own = _sliced_step(net, SGD(lr=0.0), x, y, inference=False)
    wall = time.perf_counter() - start
    calls = [(op, layer, nbytes) for op, layer, nbytes, _ in net.call_log]
    assert calls == [
        ("allgather", "dense0", 16 * 256 * 4), ("allgather", "dense2", 16 * 128 * 4),
        ("allgather", "dense4", 16 * 10 * 4), ("allreduce", "dense4", 16 * 128 * 4),
        ("allreduce", "dense2", 16 * 256 * 4),
    ]  # fmt: skip
    local_s = sum(seconds for *_, seconds in net.call_log)
    assert 0 < own == pytest.approx(wall - local_s, abs=1e-3)
    assert np.isfinite(net.grads).all() and np.abs(net.grads).sum() > 0
    gathered = net._workspace(True, 16)[0]["gathered"]  # dense0's whole activation
    assert np.abs(gathered[:, :128]).sum() > 0 and not gathered[:, 128:].any()
