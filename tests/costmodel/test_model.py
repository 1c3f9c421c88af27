"""ProfileCostModel: a profile fitted from synthetic records (no measuring) behind the sim's
cost interface; schedules sum to the closed form; the two engines agree on it."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.communication import CollectiveModels
from calibration.compute import ComputeModel
from calibration.jitter import JitterModel
from calibration.overlap import OverlapModel, OverlapPoint
from calibration.profile import Profile
from calibration.stats import Interval
from microbench.records import RecordWriter, load_dataframe
from microbench.workload import load_workload
from pdlsim.costmodel.model import ProfileCostModel
from pdlsim.costmodel.presets import GPU_PRESETS, network_preset
from pdlsim.sim import Cluster, CostModel, Placement, Scenario, predict, simulate
from tests.plots.test_plots import _collectives, _compute, _jitter


def _overlap() -> OverlapModel:
    """Two made-up interference points (test data, not measurements)."""
    model = OverlapModel()
    model.ranks_ = 2
    ci = {"overlap_fraction": Interval(0.4, 0.8)}
    model.points_ = [
        OverlapPoint("thread", n, 2, 1, 0.01, 1e-3, 0.01, 0.0105, 0.6, 1.1, 1.2, ci)
        for n in (2**20, 2**24)
    ]
    return model


def write_synthetic_profile(path) -> Profile:
    """A profile fitted by the real modelers from synthetic records, saved to ``path``."""
    run = path.parent / f"{path.stem}-records"
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with RecordWriter(run / "records.jsonl", {"hostname": "synthetic"}) as writer:
        for write in (_collectives, _compute, _jitter):
            write(writer, rng)
    frame = load_dataframe(run, type="measurement")
    models = {
        "collectives": CollectiveModels(n_boot=20).fit(frame),
        "compute": ComputeModel(n_boot=20).fit(frame),
        "transfer": None,
        "jitter": JitterModel(n_boot=20).fit(frame),
        "overlap": _overlap(),
    }
    machine = {"hostname": "synthetic", "cores_available": 2, "physical_cores": 2}
    profile = Profile.from_models(models, machine)
    profile.save(path)
    return profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Profile:
    return write_synthetic_profile(tmp_path_factory.mktemp("profile") / "profile.json")


def _cost(profile, device="cpu", **kw) -> ProfileCostModel:
    gpu = GPU_PRESETS["h100-sxm"] if device == "gpu" else None
    return ProfileCostModel.from_profile(profile, network_preset("ib-hdr"), gpu, device, **kw)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_satisfies_the_protocol_and_schedules_sum(profile, device):
    cost = _cost(profile, device)
    assert isinstance(cost, CostModel)
    for nodes, q in ((1, 4), (4, 1), (16, 4), (3, 5)):
        for algorithm in (None, "ring", "rabenseifner", "recursive_doubling", "binomial"):
            placement = Placement(nodes, q, algorithm)
            for n in (8, 4096, 4_283_176):
                steps = cost.collective_schedule("allreduce", n, nodes * q, placement)
                total = sum(s.duration_s for s in steps)
                assert total == pytest.approx(
                    cost.collective_time("allreduce", n, nodes * q, placement), rel=1e-12
                )
                assert total > 0
    layer = load_workload("cnn").layers[0]
    assert cost.compute_time(layer, "forward", 32, 1, device) > 0


def test_intra_link_is_the_fitted_allreduce_regime(profile):
    cost = _cost(profile)
    regime = cost.intra_regimes[0]
    link = cost.links(1024)["intra"]
    assert link.latency_s == pytest.approx(regime.a_s)
    assert 1 / link.bandwidth_bytes_per_s == pytest.approx(regime.b_s_per_byte)


def test_gpu_without_model_or_preset_is_a_config_error(profile):
    from pdlsim.sim import ConfigError

    with pytest.raises(ConfigError):
        ProfileCostModel.from_profile(profile, network_preset("ib-hdr"), None, "gpu")


@pytest.mark.parametrize(
    "cluster",
    [Cluster.cpus(1, 1, 1), Cluster.cpus(4, 2, 2), Cluster.cpus(3, 1, 1), Cluster.gpus(8, 4)],
)
@pytest.mark.parametrize("overlap", [False, True])
def test_simulator_and_closed_form_agree_without_jitter(profile, cluster, overlap):
    cost = _cost(profile, cluster.device, bucket_bytes=2**18)
    scenario = Scenario(
        load_workload("cnn"), 16, bucket_bytes=2**18, overlap=overlap, iterations=5, jitter=False
    )
    sim, ana = simulate(cluster, scenario, cost), predict(cluster, scenario, cost)
    for field in ("step_s", "compute_s", "comm_s", "sync_s", "overlap_s"):
        assert getattr(sim.breakdown, field) == pytest.approx(
            getattr(ana.breakdown, field), rel=1e-9, abs=1e-15
        )


def test_perturbed_models_spread_around_the_fit(profile):
    cost = _cost(profile)
    cluster = Cluster.cpus(4, 2, 1)
    scenario = Scenario(load_workload("mlp"), 32, iterations=3, jitter=False)
    base = predict(cluster, scenario, cost).step_time_s
    rng = np.random.default_rng(0)
    draws = [predict(cluster, scenario, cost.perturbed(rng)).step_time_s for _ in range(30)]
    assert np.std(draws) > 0
    assert min(draws) < base * 1.5 and max(draws) > base / 1.5
    assert np.median(draws) == pytest.approx(base, rel=0.3)
    assert cost.perturbed(np.random.default_rng(1)).jitter.expected_max_factor(64) >= 1.0 - 0.5


AG_ALPHA, AG_BETA = 9e-6, 1e-9  # a gather's own link figures, far from the allreduce's


def _with_allgather(tmp_path, profile: Profile) -> Profile:
    """``profile`` plus an allgather fitted from synthetic ring timings at 2 and 4 ranks."""
    from calibration.formulas import cost as formula_cost
    from microbench.measurement import Measurement

    rng = np.random.default_rng(1)
    with RecordWriter(tmp_path / "records.jsonl", {"hostname": "synthetic"}) as writer:
        for ranks in (2, 4):
            for block in (64, 1024, 16384, 262144):
                t = float(formula_cost("allgather", "ring", ranks, block, AG_ALPHA, AG_BETA))
                params = {"ranks": ranks, "ranks_per_node": ranks, "algorithm": None}
                params.update(op="allgather", bytes=block, total_bytes=block * ranks)
                samples = t * rng.lognormal(0.0, 0.01, 12)
                writer.write(Measurement(samples, "collectives", "allgather", params).to_record())
    frame = load_dataframe(tmp_path, type="measurement")
    gathers = CollectiveModels(n_boot=20).fit(frame)
    models = {name: profile.model(name) for name in profile.models}
    models["collectives"].models_["allgather"] = gathers.models_["allgather"]
    return Profile.from_models(models, {"hostname": "synthetic", "cores_available": 2})


def test_cpu_allgather_is_priced_by_its_own_fit(profile, tmp_path):
    """The gather of a layer-wise step costs what the allgather's benchmark fitted, at a rank
    count it never ran; without one (or across nodes with no fitted inter-node figures) it is
    built from two-rank messages on the allreduce's links."""
    from calibration.formulas import cost as formula_cost
    from pdlsim.sim.messages import allgather_schedule, allgather_time

    assert _cost(profile).native_allgather(1 << 16, Placement(1, 4)) is None
    cost = _cost(_with_allgather(tmp_path, profile))
    for ranks, total in ((2, 4096), (8, 1 << 20)):
        expected = float(formula_cost("allgather", "ring", ranks, total / ranks, AG_ALPHA, AG_BETA))
        assert allgather_time(cost, total, Placement(1, ranks)) == pytest.approx(expected, rel=0.05)
        name, _ = allgather_schedule(cost, total, Placement(1, ranks))
        assert name == "allgather (measured: ring)"
    across = allgather_schedule(cost, 4096, Placement(2, 2))[0]
    assert across == "recursive_doubling"  # messages: one node's fit says nothing of a network
    forced = allgather_schedule(cost, 4096, Placement(1, 2, "ring"))[0]  # the allreduce's
    assert forced == "allgather (measured: ring)"
    rng = np.random.default_rng(2)
    drawn = [allgather_time(cost.perturbed(rng), 1 << 20, Placement(1, 8)) for _ in range(40)]
    fitted = allgather_time(cost, 1 << 20, Placement(1, 8))
    assert len(set(drawn)) > 1 and np.median(drawn) == pytest.approx(fitted, rel=0.05)


def test_slice_copies_are_priced_by_the_copy_table_on_cpu_ranks_only():
    from calibration.profile import load_profile
    from microbench.kernels.calls import KernelCall

    profile = load_profile("epyc-2core")
    tables = profile.model("kernels")
    cost = ProfileCostModel.from_profile(profile)
    call = KernelCall("copy_runs", (64, 128), 0, "forward")
    assert cost.slice_copy_time(64, 128, 1, "cpu") == pytest.approx(tables.call_s(call, 1))
    assert cost.slice_copy_time(64, 128, 1, "gpu") == 0.0
    assert cost.slice_copy_time(64, 4096, 1, "cpu") > cost.slice_copy_time(64, 128, 1, "cpu")
