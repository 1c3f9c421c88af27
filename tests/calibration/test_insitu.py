"""Collectives in place: the benchmark under mpiexec, its records, the fitted points, and the
excess the cost model adds to the data-parallel and layer-wise plans."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from calibration.insitu import InSituModel
from microbench.insitu import Call, insitu_records, split_rounds, splittable
from microbench.records import load_dataframe
from microbench.workload import PRESETS, load_workload
from tests.conftest import LoneComm, run_microbench
from tests.profiles import STEP_TABLES

PROG = "python -m microbench insitu"

pytestmark = pytest.mark.usefixtures("no_inherited_rank")


# ------------------------------------------------------------------------- the benchmark


def test_two_ranks_time_every_collective_of_both_steps(tmp_path):
    """The MLP at 2 ranks: the barrier and the gradient allreduce (data), three allgathers, two
    input gradient allreduces and the barrier (model), and the three allgathers and the barrier
    of the forward pass alone, each with both ranks' samples and their minimum; and each step's
    compute before its barrier, what the barrier's wait is a share of, the data-parallel
    update after the allreduce, and rank 0's compute of each step alone."""
    args = ["--model", "mlp", "--batch", "8,16", "--samples", "6", "--warmup", "2"]
    result = run_microbench("insitu", *args, "--out", str(tmp_path), ranks=2, timeout=120)
    assert result.returncode == 0, result.stderr
    frame = load_dataframe(tmp_path / "insitu.jsonl", type="measurement")
    assert set(frame["benchmark"]) == {"insitu"}
    own = frame[frame["params.statistic"] == "min_over_ranks"]
    calls = own[own["params.batch"] == 16].sort_values(["params.parallel", "params.position"])
    assert list(zip(calls["params.parallel"], calls["name"], calls["params.layer"],
                    calls["params.bytes"], strict=True)) == [
        ("data", "barrier", "step", 0),  # the training loop's, after the backward
        ("data", "allreduce", "gradients", load_workload("mlp").gradient_bytes),
        ("data", "compute", "step", 0),  # the forward and backward before the barrier
        ("data", "update", "step", 0),  # the SGD update after the allreduce
        ("model", "allgather", "dense0", 16 * 256 * 4),
        ("model", "allgather", "dense2", 16 * 128 * 4),
        ("model", "allgather", "dense4", 16 * 10 * 4),
        ("model", "allreduce", "dense4", 16 * 128 * 4),  # dense4's input gradient
        ("model", "allreduce", "dense2", 16 * 256 * 4),
        ("model", "barrier", "step", 0),  # the step boundary
        ("model", "compute", "step", 0),  # the step outside its collectives
        ("model-inference", "allgather", "dense0", 16 * 256 * 4),  # the forward pass alone
        ("model-inference", "allgather", "dense2", 16 * 128 * 4),
        ("model-inference", "allgather", "dense4", 16 * 10 * 4),
        ("model-inference", "barrier", "step", 0),
        ("model-inference", "compute", "step", 0),
    ]  # fmt: skip
    computes = frame[frame["name"].isin(["compute", "update"])]["samples"]
    assert all(min(s) > 0 for s in computes)
    alone = frame[frame["params.statistic"].isin(["alone", "whole"])]  # rank 0's, alone
    assert sorted(zip(alone["params.statistic"], alone["params.parallel"], alone["params.batch"],
                      strict=True)) == [
        ("alone", p, b) for p in ("data", "model", "model-inference") for b in (8, 16)
    ] + [("whole", p, b) for p in ("model", "model-inference") for b in (8, 16)]  # fmt: skip
    assert set(alone["name"]) == {"compute"} and set(alone["params.rank"]) == {0}
    assert all(len(s) == 6 and min(s) > 0 for s in alone["samples"])
    for _, lone in alone[alone["params.statistic"] == "alone"].iterrows():  # the same work
        mine = per_rank_of(frame, lone["params.parallel"], lone["params.batch"], "compute", 0)
        assert 0.3 < np.median(mine) / np.median(lone["samples"]) < 3
    assert all(len(s) == 6 for s in frame["samples"]) and set(own["params.batch"]) == {8, 16}
    per_rank = frame[frame["params.statistic"] == "per_rank"]
    assert set(per_rank["params.rank"]) == {0, 1}
    for _, group in frame.groupby(["params.batch", "params.parallel", "params.position"]):
        ranks = np.array([s for s in group[group["params.statistic"] == "per_rank"]["samples"]])
        mins = group[group["params.statistic"] == "min_over_ranks"]["samples"].iloc[0]
        assert np.allclose(ranks.min(axis=0), mins)
    assert "allgather dense0 8192 B" in result.stdout
    assert set(frame["params.rounds"]) == {5}  # the default, 6 samples: 2, 1, 1, 1, 1


def per_rank_of(frame: pd.DataFrame, parallel: str, batch: int, op: str, rank: int) -> list:
    """One rank's samples of one call of a step."""
    rows = frame[(frame["params.statistic"] == "per_rank") & (frame["name"] == op)
                 & (frame["params.parallel"] == parallel) & (frame["params.batch"] == batch)
                 & (frame["params.rank"] == rank)]  # fmt: skip
    return list(rows["samples"].iloc[0])


def test_rounds_visit_every_step_in_turn_each_after_its_own_warmup():
    """Two steps, 5 samples in 2 rounds, warm-up 1: a 4 times, b 4 times (round 1: the
    warm-up and 3 samples each), then a 3 times, b 3 times (round 2: the warm-up and 2); each
    step's table keeps its 5 samples in time order, and its calls. Step a's compute alone (A)
    runs right after its share of each round, as many times, then the whole network (W)."""
    from microbench.insitu import sample_rounds

    trace, clock = [], iter(range(1000))

    def make(name):
        def step():
            trace.append(name)
            return [("allgather", name, 8, float(next(clock)))]

        return step

    timed = sample_rounds(
        [(make("a"), "model"), (make("b"), "model")], 5, 1, 2, LoneComm(),
        alone=[{"alone": lambda: trace.append("A"), "whole": lambda: trace.append("W")}, None],
    )  # fmt: skip
    assert "".join(trace) == "aaaaAAAWWWbbbb" + "aaaAAWWbbb"
    (calls_a, table_a, alone_a), (calls_b, table_b, alone_b) = timed
    assert {k: v.shape for k, v in alone_a.items()} == {"alone": (5,), "whole": (5,)}
    assert alone_b == {}
    assert calls_a == [Call("allgather", "a", 8, "model")] and table_a.shape == (5, 1)
    assert list(table_a[:, 0]) == [1, 2, 3, 9, 10]  # the warm-up steps (0, 8) are not kept
    assert list(table_b[:, 0]) == [5, 6, 7, 12, 13]


def test_samples_are_spread_over_rounds_as_evenly_as_possible():
    assert split_rounds(10, 3) == [4, 3, 3]
    assert split_rounds(2, 5) == [1, 1]  # at most one round per sample
    assert split_rounds(7, 1) == [7]
    with pytest.raises(ValueError, match="rounds >= 1"):
        split_rounds(5, 0)


def test_a_model_that_cannot_be_split_is_timed_data_parallel_only(tmp_path):
    """A dense layer of one neuron cannot give each of 2 ranks a neuron: model parallelism is
    skipped with a note, the gradient allreduce still measured."""
    doc = json.loads(json.dumps(PRESETS["mlp"]))
    doc["name"] = "narrow"
    dense = [layer for layer in doc["layers"] if layer["kind"] == "dense"]
    dense[1]["units"] = 1
    path = tmp_path / "narrow.json"
    path.write_text(json.dumps(doc))
    assert not splittable(load_workload(path), 2) and splittable(load_workload("mlp"), 2)
    args = ["--model", str(path), "--samples", "3", "--warmup", "1", "--out", str(tmp_path / "r")]
    result = run_microbench("insitu", *args, ranks=2, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "model parallelism skipped" in result.stdout
    frame = load_dataframe(tmp_path / "r" / "insitu.jsonl", type="measurement")
    assert set(frame["params.parallel"]) == {"data"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch"),
        (["--model", "nosuch"], "nosuch"),
        (["--samples", "0"], "--samples"),
        (["--rounds", "0"], "--rounds"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, args, message):
    result = run_microbench("insitu", *args, "--out", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_one_rank_is_refused_with_how_to_run_it(tmp_path):
    result = run_microbench("insitu", "--quick", "--out", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{PROG}: error: insitu times collectives between ranks: run it under mpiexec -n N "
        "with N >= 2"
    )
    assert not (tmp_path / "insitu.jsonl").exists()


# ---------------------------------------------------------------------------- the fit


def synthetic_frame(
    seconds: dict[tuple[str, str, int], float],
    ranks: int = 2,
    noise: float = 0.01,
    moments: tuple[float, ...] = (1.0,),
    parallel: str | None = None,
) -> pd.DataFrame:
    """Records of :func:`insitu_records` for calls keyed (op, layer, batch) -> seconds (each
    sample off by ``noise``, relative), 50 samples in one round per entry of ``moments``, the
    round's samples at that multiple of the seconds; rank r waits r * 1 us more than the
    minimum. The parallelism is ``data`` for the gradients, else ``model``, unless given."""
    records = []
    rng = np.random.default_rng(0)
    shares = split_rounds(50, len(moments))
    level = np.repeat(np.asarray(moments, dtype=float), shares)
    for (op, layer, batch), s in seconds.items():
        kind = parallel or ("data" if layer == "gradients" else "model")
        own = s * level * (1 + noise * rng.standard_normal(50))
        table = np.stack([own + r * 1e-6 for r in range(ranks)])[:, :, None]
        params = {"model": "mlp", "batch": batch, "threads": 1, "ranks": ranks,
                  "ranks_per_node": ranks, "rounds": len(moments)}  # fmt: skip
        call = Call(op, layer, 0 if op == "barrier" else batch * 1024, kind)
        records += insitu_records([call], table, params, warmup=5)
    return pd.json_normalize(records)


def test_points_are_the_median_of_the_per_step_minimum_with_the_mean_wait():
    frame = synthetic_frame({("allgather", "dense0", 16): 2e-5, ("allgather", "dense0", 64): 6e-5})
    model = InSituModel().fit(frame)
    assert [(p.op, p.layer, p.batch) for p in model.points_] == [
        ("allgather", "dense0", 16), ("allgather", "dense0", 64)
    ]  # fmt: skip
    p = model.points_[0]
    assert p.median_s == pytest.approx(20e-6, rel=0.01) and p.ci_low_s <= p.median_s <= p.ci_high_s
    assert p.wait_s == pytest.approx(0.5e-6, rel=1e-6)  # ranks wait 0 and 1 us beyond it
    assert (p.bytes, p.ranks, p.n_samples) == (16 * 1024, 2, 50)
    assert InSituModel.from_dict(json.loads(json.dumps(model.to_dict()))).points_ == model.points_


def test_rounds_give_the_typical_median_and_the_moments_deviations():
    """Three rounds at 0.8, 1.0 and 1.5x: the point is the pooled median (the middle moment)
    and each round's median over it is one log-deviation, pooled over the points."""
    calls = {("allgather", "dense0", 16): 2e-5, ("allreduce", "dense2", 16): 4e-5}
    model = InSituModel().fit(synthetic_frame(calls, noise=0.001, moments=(0.8, 1.0, 1.5)))
    assert [p.rounds for p in model.points_] == [3, 3]
    assert model.points_[0].median_s == pytest.approx(2e-5, rel=0.01)
    expected = np.log([0.8, 0.8, 1.0, 1.0, 1.5, 1.5])
    assert np.allclose(model.log_deviations_, expected, atol=0.01)
    assert model.quality_dict()["moments"]["n"] == 6
    again = InSituModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.points_ == model.points_
    assert np.array_equal(again.log_deviations_, model.log_deviations_)
    # one round: no moments to draw; a profile written before rounds loads as one round
    single = InSituModel().fit(synthetic_frame(calls))
    assert single.log_deviations_.size == 0 and single.moment_sigma() == 0.0
    old = single.to_dict()
    old.pop("log_deviations")
    for point in old["points"]:
        point.pop("rounds")
    assert InSituModel.from_dict(old).points_ == single.points_


def test_seconds_interpolate_in_the_batch_and_hold_outside():
    frame = synthetic_frame({("allgather", "dense0", 16): 2e-5, ("allgather", "dense0", 64): 6e-5})
    model = InSituModel().fit(frame)
    at = {b: model.seconds("mlp", "model", "allgather", "dense0", b)[0] for b in (8, 32, 128)}
    assert at[32] == pytest.approx(20e-6 + 40e-6 * (32 - 16) / 48, rel=0.02)
    assert at[8] == pytest.approx(model.points_[0].median_s)  # held at the nearest batch
    assert at[128] == pytest.approx(model.points_[1].median_s)
    assert model.seconds("mlp", "model", "allreduce", "dense0", 32) is None
    assert model.seconds("cnn", "model", "allgather", "dense0", 32) is None


def test_the_barrier_wait_over_the_compute_before_it_is_the_steps_skew():
    """Ranks wait 0 and 1 us beyond the barrier's own cost (mean wait 0.5 us) after 100 us of
    compute at batch 16 and 250 us at 64: a skew of 0.5% and 0.2%, pooled over the batches
    (1 us of 350: 0.29%) at any batch, with the nearest point; the compute is no collective, so
    no point of its own."""
    frame = pd.concat([
        synthetic_frame({("barrier", "step", 16): 1e-5, ("barrier", "step", 64): 1e-5,
                         ("compute", "step", 16): 1e-4 - 0.5e-6,
                         ("compute", "step", 64): 2.5e-4 - 0.5e-6}, noise=0.0, parallel="data"),
        synthetic_frame({("barrier", "step", 16): 1e-5}, noise=0.0, parallel="model"),
    ])  # fmt: skip
    model = InSituModel().fit(frame)
    assert {p.op for p in model.points_} == {"barrier"}
    fraction, point = model.wait_fraction("mlp", "data", 16)
    assert fraction == pytest.approx(1 / 350, rel=1e-6) and point.batch == 16
    fraction, point = model.wait_fraction("mlp", "data", 48)
    assert fraction == pytest.approx(1 / 350, rel=1e-6) and point.batch == 64
    assert model.wait_fraction("mlp", "model", 16) is None  # its compute was not timed
    again = InSituModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.points_ == model.points_
    assert "compute_s" not in again.to_dict()["points"][-1]  # the model point: none


def test_the_update_in_place_is_a_share_of_the_compute_before_the_barrier():
    """After 100 us of compute the update takes 30 us at batch 16, after 250 us 25 us at 64:
    shares of 0.3 and 0.1, interpolated in the batch; kept on the barrier's point, through the
    profile's JSON; none where the update was not timed (model parallel, older profiles)."""
    frame = pd.concat([
        synthetic_frame({("barrier", "step", 16): 1e-5, ("barrier", "step", 64): 1e-5,
                         ("compute", "step", 16): 1e-4 - 0.5e-6,
                         ("compute", "step", 64): 2.5e-4 - 0.5e-6,
                         ("update", "step", 16): 3e-5 - 0.5e-6,
                         ("update", "step", 64): 2.5e-5 - 0.5e-6}, noise=0.0, parallel="data"),
        synthetic_frame({("barrier", "step", 16): 1e-5, ("compute", "step", 16): 1e-4},
                        noise=0.0, parallel="model"),
    ])  # fmt: skip
    model = InSituModel().fit(frame)
    assert {p.op for p in model.points_} == {"barrier"}  # the update is no collective
    fraction, point = model.update_fraction("mlp", "data", 16)
    assert fraction == pytest.approx(0.3, rel=1e-6) and point.update_s == pytest.approx(3e-5)
    assert model.update_fraction("mlp", "data", 40)[0] == pytest.approx(0.2, rel=1e-6)
    assert model.update_fraction("mlp", "data", 128)[0] == pytest.approx(0.1, rel=1e-6)
    assert model.update_fraction("mlp", "model", 16) is None
    again = InSituModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.points_ == model.points_
    doc = model.to_dict()
    assert "update_s" not in doc["points"][-1]  # the model point: none
    for p in doc["points"]:
        p.pop("update_s", None)
    assert InSituModel.from_dict(doc).update_fraction("mlp", "data", 16) is None


def test_records_without_insitu_measurements_are_a_clear_error():
    frame = pd.DataFrame({"type": ["measurement"], "benchmark": ["collectives"]})
    with pytest.raises(Exception, match="no 'insitu' measurements"):
        InSituModel().fit(frame)


# ------------------------------------------------------------------ the cost model's excess


@pytest.fixture(scope="module")
def insitu_profile(tmp_path_factory):
    """The synthetic test profile plus MLP calls measured in place at 2 ranks on one node:
    the gradient allreduce at batch 16 and 64, dense0's allgather and dense2's input-gradient
    allreduce at batch 16, at 1 ms each (far above any back-to-back time), and dense4's
    allgather at 1 ns (below it)."""
    from calibration.profile import Profile
    from tests.costmodel.test_model import write_synthetic_profile

    profile = write_synthetic_profile(tmp_path_factory.mktemp("insitu") / "profile.json")
    frame = synthetic_frame({
        ("allreduce", "gradients", 16): 1e-3, ("allreduce", "gradients", 64): 2e-3,
        ("allgather", "dense0", 16): 1e-3, ("allreduce", "dense2", 16): 1e-3,
        ("allgather", "dense4", 16): 1e-9,
    }, noise=0.0)  # fmt: skip
    doc = profile.to_dict()
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    return Profile.from_dict(doc)


def _mlp_cost(profile, workload="mlp", device="cpu"):
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.costmodel.presets import GPU_PRESETS, network_preset

    gpu = GPU_PRESETS["h100-sxm"] if device == "gpu" else None
    return ProfileCostModel.from_profile(
        profile, network_preset("ib-hdr"), gpu, device, workload=workload, ranks_per_node=2
    )


def test_at_the_measured_placement_a_call_costs_what_was_measured(insitu_profile):
    from pdlsim.sim import Placement
    from pdlsim.sim.messages import allgather_time

    cost, at = _mlp_cost(insitu_profile), Placement(1, 2)
    nbytes = load_workload("mlp").gradient_bytes
    for batch, measured in ((16, 1e-3), (64, 2e-3), (40, 1.5e-3)):  # 40: interpolated
        extra = cost.in_situ_s("data", "allreduce", "gradients", batch, nbytes)
        assert cost.collective_time("allreduce", nbytes, 2, at) + extra == pytest.approx(measured)
    extra = cost.in_situ_s("model", "allgather", "dense0", 16, 16 * 256 * 4)
    assert allgather_time(cost, 16 * 256 * 4, at) + extra == pytest.approx(1e-3)
    # dense4's allgather ran faster in place: at the placement measured, the measured time;
    # elsewhere a fixed saving, but never a larger share of the call than where measured.
    back_to_back = allgather_time(cost, 640, at)
    saving = cost.in_situ_s("model", "allgather", "dense4", 16, 640)
    assert back_to_back + saving == pytest.approx(1e-9) and saving < 0
    for scale in (2.0, 0.5):
        priced = scale * back_to_back
        extra = cost.in_situ_s("model", "allgather", "dense4", 16, 640, priced)
        share_kept = priced * 1e-9 / back_to_back
        assert priced + extra == pytest.approx(max(priced + saving, share_kept))
    assert cost.in_situ_s("model", "allgather", "dense2", 16, 8192) == 0.0  # not measured
    assert "measured in place at 2 ranks" in cost.provenance["in-place collectives"]


@pytest.mark.parametrize(
    ("workload", "device", "why"),
    [("cnn", "cpu", "not measured for cnn (only mlp)"), ("mlp", "gpu", "CPU ranks only")],
)
def test_unmeasured_workloads_and_gpu_ranks_keep_back_to_back_times(
    insitu_profile, workload, device, why
):
    cost = _mlp_cost(insitu_profile, workload, device)
    assert cost.in_situ_s("data", "allreduce", "gradients", 16, 10**6) == 0.0
    assert why in cost.provenance["in-place collectives"]


def test_the_data_parallel_buckets_share_the_excess_and_the_engines_agree(insitu_profile):
    from pdlsim.sim import Cluster, Scenario, build_plan, predict, simulate

    cost = _mlp_cost(insitu_profile)
    workload = load_workload("mlp")
    cluster = Cluster.cpus(1, 2)
    scenario = Scenario(workload, 16, bucket_bytes=2**16, overlap=False, iterations=4,
                        jitter=False)  # fmt: skip
    plan = build_plan(cluster, scenario, cost)
    assert len(plan.buckets) > 1
    extras = [b.schedule[-1].time_s for b in plan.buckets]
    assert all(b.schedule[-1].step.phase == "in place" for b in plan.buckets)
    total = cost.in_situ_s("data", "allreduce", "gradients", 16, workload.gradient_bytes)
    assert sum(extras) == pytest.approx(total) and total > 0
    for bucket, extra in zip(plan.buckets, extras, strict=True):
        assert extra == pytest.approx(total * bucket.nbytes / workload.gradient_bytes)
        assert sum(t.duration_s for t in bucket.schedule) == pytest.approx(bucket.collective_s)
    sim, ana = simulate(cluster, scenario, cost), predict(cluster, scenario, cost)
    assert sim.breakdown.comm_s == pytest.approx(ana.breakdown.comm_s, rel=1e-9)
    assert sim.step_time_s == pytest.approx(ana.step_time_s, rel=1e-9)


def test_a_gradient_allreduce_faster_in_place_takes_the_same_share_off_every_bucket(
    insitu_profile,
):
    """Measured in place at half its back-to-back time: every bucket's schedule keeps half of
    each step, the schedules still sum to the buckets' times, and the engines agree."""
    from calibration.profile import Profile
    from pdlsim.sim import Cluster, Placement, Scenario, build_plan, predict, simulate

    workload = load_workload("mlp")
    whole = _mlp_cost(insitu_profile).collective_time(
        "allreduce", workload.gradient_bytes, 2, Placement(1, 2)
    )
    doc = copy.deepcopy(insitu_profile.to_dict())  # the fixture is shared
    frame = synthetic_frame({("allreduce", "gradients", 16): 0.5 * whole}, noise=0.0)
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    cost = _mlp_cost(Profile.from_dict(doc))
    plain = _mlp_cost(Profile.from_dict(doc | {"models": {**doc["models"], "insitu": None}}))
    cluster = Cluster.cpus(1, 2)
    scenario = Scenario(workload, 16, bucket_bytes=2**16, overlap=False, iterations=4,
                        jitter=False)  # fmt: skip
    kept = 0.5  # the measured time over the back-to-back one
    ours, theirs = build_plan(cluster, scenario, cost), build_plan(cluster, scenario, plain)
    assert len(ours.buckets) == len(theirs.buckets) > 1
    for bucket, back_to_back in zip(ours.buckets, theirs.buckets, strict=True):
        assert bucket.collective_s == pytest.approx(kept * back_to_back.collective_s, rel=0.01)
        assert sum(t.duration_s for t in bucket.schedule) == pytest.approx(bucket.collective_s)
        assert all(t.step.phase != "in place" for t in bucket.schedule)  # no excess step
    sim, ana = simulate(cluster, scenario, cost), predict(cluster, scenario, cost)
    assert sim.breakdown.comm_s == pytest.approx(ana.breakdown.comm_s, rel=1e-9)


def test_a_data_parallel_plan_of_two_ranks_updates_as_measured_in_place(insitu_profile):
    """The update measured in place at 0.3 of the compute before the barrier: a 2-rank plan's
    update is 0.3 x its forward and backward less the gather, a 1-rank plan keeps the layers'
    update times, and so does a profile that did not time it; the engines agree."""
    from calibration.profile import Profile
    from pdlsim.sim import Cluster, Scenario, build_plan, predict, simulate

    doc = copy.deepcopy(insitu_profile.to_dict())  # the fixture is shared
    frame = synthetic_frame(
        {("barrier", "step", 16): 1e-5, ("compute", "step", 16): 1e-4 - 0.5e-6,
         ("update", "step", 16): 3e-5 - 0.5e-6}, noise=0.0, parallel="data",
    )  # fmt: skip
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    cost = _mlp_cost(Profile.from_dict(doc))
    workload = load_workload("mlp")
    scenario = Scenario(workload, 16, overlap=False, iterations=4, jitter=False)
    two = build_plan(Cluster.cpus(1, 2), scenario, cost)
    gather = cost.gather_s(workload.layers[0], 16, 1)  # 0: the synthetic profile has no rows
    assert two.update_s == pytest.approx(0.3 * (two.forward_s + two.backward_s - gather))
    layers = sum(
        cost.compute_time(info, "update", 16, 1, "cpu")
        for info in workload.layers
        if info.param_count > 0
    )
    assert two.update_s != pytest.approx(layers)
    assert build_plan(Cluster.cpus(1, 1), scenario, cost).update_s == pytest.approx(layers)
    doc["models"]["insitu"]["points"][0].pop("update_s")
    older = _mlp_cost(Profile.from_dict(doc))
    assert build_plan(Cluster.cpus(1, 2), scenario, older).update_s == pytest.approx(layers)
    sim = simulate(Cluster.cpus(1, 2), scenario, cost)
    ana = predict(Cluster.cpus(1, 2), scenario, cost)
    assert sim.step_time_s == pytest.approx(ana.step_time_s, rel=1e-9)


def test_the_gather_apart_is_what_the_first_layers_forward_adds_for_it():
    """The in-place update's basis leaves the gather out: ``gather_s`` is exactly what
    ``compute_time`` adds to the first layer's forward for it (packaged profile, co-located)."""
    import dataclasses

    from calibration.profile import load_profile
    from pdlsim.costmodel.model import ProfileCostModel

    cost = ProfileCostModel.from_profile(load_profile(STEP_TABLES), workload="mlp",
                                         ranks_per_node=2)  # fmt: skip
    first = load_workload("mlp").layers[0]
    without = dataclasses.replace(cost, scale=dataclasses.replace(cost.scale, data=()))
    for batch in (16, 48):
        gather = cost.gather_s(first, batch, 1)
        added = cost.compute_time(first, "forward", batch, 1, "cpu") - without.compute_time(
            first, "forward", batch, 1, "cpu"
        )
        assert gather > 0 and gather == pytest.approx(added, rel=1e-9)


def test_the_layerwise_plan_adds_each_calls_excess(insitu_profile):
    from pdlsim.sim import Cluster, Scenario
    from pdlsim.sim.tensor import build_tensor_plan, predict_tensor, simulate_tensor

    cost = _mlp_cost(insitu_profile)
    scenario = Scenario(load_workload("mlp"), 16, iterations=3, jitter=False)
    plan = build_tensor_plan(Cluster.cpus(1, 2), scenario, cost)
    got = {(o.kind, o.layer): o for o in plan.collectives}
    assert got[("allgather", "dense0")].time_s == pytest.approx(1e-3)
    assert got[("allgather", "dense0")].in_situ_s > 0
    assert got[("allreduce", "dense2")].time_s == pytest.approx(1e-3)
    assert got[("allgather", "dense2")].in_situ_s == 0.0  # not measured
    assert got[("allgather", "dense4")].time_s == pytest.approx(1e-9)  # faster in place
    assert got[("allgather", "dense4")].in_situ_s < 0
    sim = simulate_tensor(Cluster.cpus(1, 2), scenario, cost)
    ana = predict_tensor(Cluster.cpus(1, 2), scenario, cost)
    assert sim.step_time_s == pytest.approx(ana.step_time_s, rel=1e-9)
    assert ana.to_dict()["collectives"][0]["in_situ_s"] == pytest.approx(
        got[("allgather", "dense0")].in_situ_s
    )


def test_a_band_sample_takes_the_in_place_time_of_one_measured_moment(insitu_profile):
    """With rounds at 0.5x and 2x, each perturbed cost prices the call at one of them (the
    excess over back to back follows); without rounds the band leaves it alone."""
    from calibration.profile import Profile

    doc = copy.deepcopy(insitu_profile.to_dict())  # the fixture is shared
    frame = synthetic_frame({("allgather", "dense0", 16): 1e-3}, noise=0.0, moments=(0.5, 2.0))
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    cost = _mlp_cost(Profile.from_dict(doc))
    typical = cost.in_situ_s("model", "allgather", "dense0", 16, 16 * 256 * 4)
    rng = np.random.default_rng(1)
    factors = set()
    for _ in range(40):
        drawn = cost.perturbed(rng)
        factors.add(round(drawn.insitu.factor, 6))
        extra = drawn.in_situ_s("model", "allgather", "dense0", 16, 16 * 256 * 4)
        moved = drawn.insitu.factor * cost.insitu.model.points_[0].median_s - (
            cost.insitu.model.points_[0].median_s - typical
        )
        assert extra == pytest.approx(moved, rel=0.05)  # back to back drawn too: within 5%
    median = cost.insitu.model.points_[0].median_s
    assert factors == {round(0.5e-3 / median, 6), round(2e-3 / median, 6)}
    plain = _mlp_cost(insitu_profile)
    assert {plain.perturbed(rng).insitu.factor for _ in range(5)} == {1.0}


def _with_barriers(profile, seconds: dict[str, float]):
    """``profile`` (the fixture's) plus the step's barrier timed in place at batch 16 for each
    parallelism in ``seconds``."""
    from calibration.profile import Profile

    doc = copy.deepcopy(profile.to_dict())
    frames = [synthetic_frame({("allreduce", "gradients", 16): 1e-3}, noise=0.0)]
    frames += [
        synthetic_frame({("barrier", "step", 16): s}, noise=0.0, parallel=parallel)
        for parallel, s in seconds.items()
    ]
    doc["models"]["insitu"] = InSituModel().fit(pd.concat(frames, ignore_index=True)).to_dict()
    return Profile.from_dict(doc)


def test_the_step_barrier_costs_what_was_measured_and_grows_as_a_tiny_allreduce(insitu_profile):
    from pdlsim.costmodel.insitu import BARRIER_PROXY_BYTES
    from pdlsim.sim import Placement

    cost = _mlp_cost(_with_barriers(insitu_profile, {"data": 2e-5}))
    at, wide = Placement(1, 2), Placement(8, 2)
    assert cost.step_barrier_s("data", 16, 2, at) == pytest.approx(2e-5)
    proxy = [cost.collective_time("allreduce", BARRIER_PROXY_BYTES, r, p) for r, p in
             ((2, at), (16, wide))]  # fmt: skip
    assert proxy[1] > proxy[0]  # more rounds, and across nodes
    assert cost.step_barrier_s("data", 16, 16, wide) == pytest.approx(2e-5 - proxy[0] + proxy[1])
    assert cost.step_barrier_s("data", 16, 1, Placement(1, 1)) == 0.0
    assert cost.step_barrier_s("model", 16, 2, at) == 0.0  # not timed for model parallelism
    assert _mlp_cost(insitu_profile).step_barrier_s("data", 16, 2, at) == 0.0  # nor at all


def test_both_plans_put_the_step_barrier_on_the_critical_path(insitu_profile):
    """Data parallel: in the buckets' in-place share, beside the allreduce's excess; layer-wise:
    the op that ends the step. Either engine, the step is longer by the barrier."""
    from pdlsim.sim import Cluster, Scenario, build_plan, predict
    from pdlsim.sim.tensor import build_tensor_plan, predict_tensor, simulate_tensor

    barrier_s = 2e-5
    cluster, workload = Cluster.cpus(1, 2), load_workload("mlp")
    timed = _mlp_cost(_with_barriers(insitu_profile, {"data": barrier_s, "model": barrier_s}))
    untimed = _mlp_cost(_with_barriers(insitu_profile, {}))
    data = Scenario(workload, 16, overlap=False, iterations=3, jitter=False)
    shares = [
        sum(b.schedule[-1].time_s for b in build_plan(cluster, data, c).buckets)
        for c in (timed, untimed)
    ]
    assert shares[0] - shares[1] == pytest.approx(barrier_s)
    steps = [predict(cluster, data, c).step_time_s for c in (timed, untimed)]
    assert steps[0] - steps[1] == pytest.approx(barrier_s)
    model = Scenario(workload, 16, iterations=3, jitter=False)
    plan = build_tensor_plan(cluster, model, timed)
    assert plan.ops[-1].kind == "barrier" and plan.ops[-1].time_s == pytest.approx(barrier_s)
    assert "barrier" not in {o.kind for o in build_tensor_plan(cluster, model, untimed).ops}
    sim, ana = simulate_tensor(cluster, model, timed), predict_tensor(cluster, model, timed)
    assert sim.step_time_s == pytest.approx(ana.step_time_s, rel=1e-9)
    without = predict_tensor(cluster, model, untimed).step_time_s
    assert ana.step_time_s - without == pytest.approx(barrier_s)


def test_a_forward_only_plan_takes_the_forward_only_steps_calls_else_the_training_steps(
    insitu_profile,
):
    """dense0's allgather timed at 1 ms in the training step and 0.3 ms in the forward-only
    step: an inference plan prices it at 0.3 ms, a training plan at 1 ms; dense2's, timed in
    the training step only, costs the same in both."""
    from calibration.profile import Profile
    from pdlsim.sim import Cluster, Scenario
    from pdlsim.sim.tensor import build_tensor_plan

    doc = copy.deepcopy(insitu_profile.to_dict())
    frames = [
        synthetic_frame({("allgather", "dense0", 16): 1e-3, ("allgather", "dense2", 16): 1e-3},
                        noise=0.0),
        synthetic_frame({("allgather", "dense0", 16): 3e-4}, noise=0.0,
                        parallel="model-inference"),
    ]  # fmt: skip
    doc["models"]["insitu"] = InSituModel().fit(pd.concat(frames, ignore_index=True)).to_dict()
    cost = _mlp_cost(Profile.from_dict(doc))
    scenario = Scenario(load_workload("mlp"), 16, iterations=3, jitter=False)
    cluster = Cluster.cpus(1, 2)

    def allgathers(inference):
        plan = build_tensor_plan(cluster, scenario, cost, inference=inference)
        return {o.layer: o.time_s for o in plan.collectives if o.kind == "allgather"}

    training, forward_only = allgathers(False), allgathers(True)
    assert training["dense0"] == pytest.approx(1e-3)
    assert forward_only["dense0"] == pytest.approx(3e-4)
    assert forward_only["dense2"] == pytest.approx(training["dense2"]) == pytest.approx(1e-3)


def test_the_sync_at_the_measured_ranks_is_the_in_place_barriers_share_of_the_compute(
    insitu_profile,
):
    """The barrier's ranks wait 0.5 us on average after 250 us of compute (0.2%): a data-parallel
    prediction at that batch takes 0.2% as its 2-rank sync, and keeps the jitter model's shape
    beyond 2 ranks; model parallelism (its compute untimed here) or a cost model built without
    the step keep the jitter benchmark's sync, and so does a profile without the compute."""
    from calibration.profile import Profile
    from pdlsim.costmodel.model import ProfileCostModel
    from pdlsim.costmodel.presets import network_preset

    doc = copy.deepcopy(insitu_profile.to_dict())
    frame = synthetic_frame(
        {("barrier", "step", 16): 1e-5, ("compute", "step", 16): 2.5e-4 - 0.5e-6},
        noise=0.0, parallel="data",
    )  # fmt: skip
    doc["models"]["insitu"] = InSituModel().fit(frame).to_dict()
    profile = Profile.from_dict(doc)

    def cost(**step):
        return ProfileCostModel.from_profile(
            profile, network_preset("ib-hdr"), None, "cpu", workload="mlp", ranks_per_node=2,
            **step,
        )  # fmt: skip

    benchmark = cost().jitter
    sized = cost(batch=16, parallel="data")
    sync = sized.jitter.expected_max_factor(2) - sized.jitter.expected_max_factor(1)
    assert sync == pytest.approx(0.002, rel=1e-6)
    assert "barrier wait in place, 0.20% of its compute pooled" in sized.provenance["jitter"]
    shape = [
        j.expected_max_factor(64) - j.expected_max_factor(1) for j in (sized.jitter, benchmark)
    ]
    raw_2 = benchmark.expected_max_factor(2) - benchmark.expected_max_factor(1)
    assert shape[0] / shape[1] == pytest.approx(sync / raw_2, rel=1e-6)  # the same tail
    for other in (cost(batch=16, parallel="model"), cost(batch=16)):
        assert other.jitter.expected_max_factor(2) == benchmark.expected_max_factor(2)
    doc["models"]["insitu"]["points"][0].pop("compute_s")
    old = ProfileCostModel.from_profile(Profile.from_dict(doc), workload="mlp", batch=16,
                                        parallel="data")  # fmt: skip
    assert old.jitter.expected_max_factor(2) == benchmark.expected_max_factor(2)
