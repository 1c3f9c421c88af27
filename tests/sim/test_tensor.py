"""Tensor (model) parallelism, forward-only runs, and the allgather and message costs they use."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

from microbench.workload import Workload, load_workload, split_columns
from pdlsim.cli.main import main
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.core import run_prediction
from pdlsim.sim import (
    Cluster,
    ConfigError,
    LinkCost,
    LognormalJitter,
    Placement,
    Scenario,
    simulate,
)
from pdlsim.sim.cost import CostHooks
from pdlsim.sim.messages import allgather_schedule, allgather_time, message_time
from pdlsim.sim.tensor import (
    build_tensor_plan,
    predict_tensor,
    simulate_tensor,
    sliced_dense,
    tensor_factors,
)
from tests.costmodel.test_model import write_synthetic_profile
from tests.sim.costs import example_cost

MLP, CNN = load_workload("mlp"), load_workload("cnn")
REL = 1e-9


@dataclass(frozen=True)
class FreeComm(CostHooks):
    """The example machine's compute with every message and collective free."""

    base: object
    jitter: object = None
    overlap_efficiency: float = 1.0

    def compute_time(self, layer, phase, batch, threads, device):
        return self.base.compute_time(layer, phase, batch, threads, device)

    def collective_time(self, op, nbytes, ranks, placement):
        return 0.0

    def collective_schedule(self, op, nbytes, ranks, placement):
        return ()

    def transfer_time(self, direction, nbytes, pinned):
        return 0.0


def _terms(prediction) -> np.ndarray:
    return np.array(
        [(s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s) for s in prediction.steps]
    )


@pytest.mark.parametrize(
    ("workload", "cluster", "jitter"),
    [
        (MLP, Cluster.cpus(1), False),
        (CNN, Cluster.cpus(1, 1, 4), False),
        (MLP, Cluster.gpus(1, 1), False),
        (CNN, Cluster.gpus(1, 1), False),
        (MLP, Cluster.cpus(1), True),
    ],
)
def test_one_rank_tensor_parallel_is_the_data_parallel_single_rank(workload, cluster, jitter):
    cost = example_cost(jitter=LognormalJitter(0.1))
    scenario = Scenario(workload, 48, iterations=6, jitter=jitter, prefetch=True, seed=3)
    tensor = simulate_tensor(cluster, scenario, cost)
    data = simulate(cluster, scenario, cost)
    assert np.allclose(_terms(tensor), _terms(data), rtol=REL, atol=0)
    assert not build_tensor_plan(cluster, scenario, cost).collectives


def test_dense_compute_per_rank_scales_as_one_over_p_with_free_communication():
    cost = FreeComm(example_cost(cpu_layer_overhead_s=0.0, cpu_serial_fraction=0.0))
    scenario = Scenario(MLP, 64, iterations=2, jitter=False)
    one = build_tensor_plan(Cluster.cpus(1), scenario, cost)
    dense = sum(o.time_s for o in one.ops if o.layer.startswith("dense"))
    other = sum(o.time_s for o in one.ops if not o.layer.startswith("dense"))
    assert dense > 10 * other > 0
    for p in (2, 4, 8):  # 256, 128 and... 10 units: only p = 2 divides all three
        plan = build_tensor_plan(Cluster.cpus(1, p), scenario, cost)
        for a, b in zip(one.ops, (o for o in plan.ops if not o.collective), strict=True):
            units = {name: u for name, u, _ in plan.slices}.get(a.layer)
            if units is None:
                assert b.time_s == a.time_s, a.layer  # replicated: relu, softmax
            else:
                share = math.ceil(units / p)
                assert b.time_s == pytest.approx(a.time_s * share / units, rel=1e-12), a.layer
        step = simulate_tensor(Cluster.cpus(1, p), scenario, cost).step_time_s
        assert step == pytest.approx(plan.jittered_s + plan.update_s, rel=REL)
    exact = build_tensor_plan(Cluster.cpus(1, 2), scenario, cost)
    assert exact.jittered_s + exact.update_s == pytest.approx(dense / 2 + other, rel=1e-12)


def test_sliced_layer_is_the_workload_description_with_fewer_units():
    dense = CNN.layers[7]  # 4096 -> 256
    half = sliced_dense(dense, 128)
    assert half.output_shape == (128,) and half.input_shape == dense.input_shape
    assert half.param_count * 2 == dense.param_count
    assert half.forward_flops_per_sample * 2 == dense.forward_flops_per_sample
    assert half.backward_flops_per_sample * 2 == dense.backward_flops_per_sample
    with pytest.raises(ValueError, match="only dense"):
        sliced_dense(CNN.layers[0], 2)


@pytest.mark.parametrize("inference", [False, True])
def test_comm_volume_is_the_sum_of_allgather_and_input_gradient_sizes(inference):
    batch = 32
    scenario = Scenario(CNN, batch, iterations=1, jitter=False)
    plan = build_tensor_plan(Cluster.cpus(2, 4), scenario, example_cost(), inference)
    dense = [i for i in CNN.layers if i.kind == "dense"]
    assert plan.comm_bytes("allgather") == batch * 4 * sum(i.output_shape[0] for i in dense)
    gathers = [o.layer for o in plan.collectives if o.kind == "allgather"]
    assert gathers == [i.name for i in dense]
    # backward: the input gradient of every dense layer but the first with parameters (a conv
    # here, so both dense layers), summed over the ranks
    reduced = 0 if inference else batch * 4 * (4096 + 256)
    assert plan.comm_bytes("allreduce") == reduced
    assert all(o.phase == "forward" for o in plan.ops) == inference
    mlp = build_tensor_plan(Cluster.cpus(1, 2), Scenario(MLP, batch, iterations=1), example_cost())
    assert mlp.comm_bytes("allreduce") == batch * 4 * (256 + 128)  # not the first layer's 784


def test_allgather_and_message_times_are_the_alpha_beta_of_their_steps():
    intra, inter = LinkCost(2e-6, 1e10), LinkCost(5e-6, 1e9)
    cost = example_cost(intra=intra, inter=inter)
    a, b = intra.latency_s, 1 / intra.bandwidth_bytes_per_s
    a2, b2 = inter.latency_s, 1 / inter.bandwidth_bytes_per_s
    n = 40_000.0  # small: recursive doubling (power of two) or Bruck
    assert allgather_schedule(cost, n, Placement(1, 4))[0] == "recursive_doubling"
    assert allgather_time(cost, n, Placement(1, 4)) == pytest.approx(2 * a + 3 / 4 * n * b)
    assert allgather_schedule(cost, n, Placement(1, 3))[0] == "bruck"
    assert allgather_time(cost, n, Placement(1, 3)) == pytest.approx(2 * (a + n / 3 * b))
    big = 4e6  # ring: P - 1 steps of n / P
    assert allgather_schedule(cost, big, Placement(1, 4))[0] == "ring"
    assert allgather_time(cost, big, Placement(1, 4)) == pytest.approx(3 * (a + big / 4 * b))
    # 2 nodes x 4 ranks, recursive doubling: distances 1 and 2 inside a node, then all four
    # ranks of a node send n / 2 through its NIC at once
    expect = (a + n / 8 * b) + (a + n / 4 * b) + (a2 + 4 * n / 2 * b2)
    assert allgather_time(cost, n, Placement(2, 4)) == pytest.approx(expect)
    # a ring across nodes: one flow per NIC, every step timed on the NIC
    assert allgather_time(cost, big, Placement(3, 1)) == pytest.approx(2 * (a2 + big / 3 * b2))
    assert message_time(cost, 1e6, False) == pytest.approx(a + 1e6 * b)
    assert message_time(cost, 1e6, True) == pytest.approx(a2 + 1e6 * b2)
    assert message_time(cost, 0, True) == 0.0 == allgather_time(cost, n, Placement(1, 1))


@dataclass(frozen=True)
class TimedCopies(CostHooks):
    """The example machine, with a slice copy of ``rows x run`` costing ``rows * run`` ns."""

    base: object
    jitter: object = None
    overlap_efficiency: float = 1.0

    def __getattr__(self, name):
        return getattr(self.base, name)

    def compute_time(self, layer, phase, batch, threads, device):
        return self.base.compute_time(layer, phase, batch, threads, device)

    def collective_time(self, op, nbytes, ranks, placement):
        return self.base.collective_time(op, nbytes, ranks, placement)

    def collective_schedule(self, op, nbytes, ranks, placement):
        return self.base.collective_schedule(op, nbytes, ranks, placement)

    def transfer_time(self, direction, nbytes, pinned):
        return 0.0

    def slice_copy_time(self, rows, run, threads, device):
        return rows * run * 1e-9


def test_a_gather_is_the_allgather_then_one_copy_per_ranks_slice():
    """Each split layer's gather costs the allgather plus copying every rank's columns into
    the activation (uneven splits: 3 ranks over 10 units copy 4, 3 and 3 columns)."""
    workload = Workload.from_dict(
        {"name": "odd", "input_shape": [6], "layers": [
            {"kind": "dense", "units": 10}, {"kind": "softmax_cross_entropy"}]}
    )  # fmt: skip
    cluster, batch = Cluster.cpus(1, 3), 8
    base = example_cost()
    plan = build_tensor_plan(cluster, Scenario(workload, batch), TimedCopies(base))
    (gather,) = [op for op in plan.ops if op.kind == "allgather"]
    copies = sum(batch * run * 1e-9 for run in (4, 3, 3))
    assert gather.time_s == pytest.approx(
        allgather_time(base, gather.nbytes, Placement(1, 3)) + copies
    )
    without = build_tensor_plan(cluster, Scenario(workload, batch), base)
    assert gather.time_s - without.comm_s("allgather") == pytest.approx(copies)


def test_a_million_ranks_are_planned_in_seconds_with_every_slice_and_ring_step_counted():
    """The ring allgather's P - 1 steps and each gather's P slice copies were looked at one by
    one, each over all P ranks: P^2 operations, hours for --nodes 1000 --procs-per-node 1024."""
    workload = Workload.from_dict(
        {"name": "odd", "input_shape": [6], "layers": [
            {"kind": "dense", "units": 10}, {"kind": "softmax_cross_entropy"}]}
    )  # fmt: skip
    base, batch = example_cost(), 8
    for ranks in (3, 16):  # 4, 3, 3 columns; ten ranks of one column and six of none
        plan = build_tensor_plan(
            Cluster.cpus(1, ranks), Scenario(workload, batch), TimedCopies(base)
        )
        (gather,) = [op for op in plan.ops if op.kind == "allgather"]
        copies = sum(batch * (hi - lo) * 1e-9 for lo, hi in split_columns(10, ranks))
        expect = allgather_time(base, gather.nbytes, Placement(1, ranks)) + copies
        assert gather.time_s == pytest.approx(expect, rel=1e-12)
    name, timed = allgather_schedule(base, 4e6, Placement(1000, 1024))
    assert name == "ring" and sum(t.step.repeat for t in timed) == 1000 * 1024 - 1
    assert len(timed) <= 2  # the ring's steps as one run, not a million looked at one by one
    plan = build_tensor_plan(Cluster.cpus(64, 64), Scenario(MLP, 8), base)
    assert plan.comm_s("allgather") > 0


def test_simulator_and_closed_form_agree_without_jitter():
    rng = np.random.default_rng(7)
    for seed in range(24):
        nodes, per_node = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        cluster = (Cluster.gpus if seed % 2 else Cluster.cpus)(nodes, per_node)
        scenario = Scenario(
            (MLP, CNN)[seed % 3 == 0],
            int(rng.choice([1, 8, 64])),
            iterations=int(rng.integers(1, 4)),
            warmup_iterations=int(rng.integers(0, 2)),
            prefetch=bool(rng.random() < 0.5),
            pinned=bool(rng.random() < 0.5),
            jitter=False,
        )
        cost = example_cost(
            intra=LinkCost(float(rng.uniform(1e-7, 5e-6)), float(rng.uniform(5e9, 5e11))),
            inter=LinkCost(float(rng.uniform(1e-6, 5e-5)), float(rng.uniform(1e9, 5e10))),
        )
        for inference in (False, True):
            sim = simulate_tensor(cluster, scenario, cost, inference)
            closed = predict_tensor(cluster, scenario, cost, inference)
            assert np.allclose(_terms(sim), _terms(closed), rtol=REL, atol=1e-15), (seed, inference)
            b = sim.breakdown
            assert b.residual_s == pytest.approx(0.0, abs=1e-15)
            assert b.comm_s == pytest.approx(sim.plan.comm_s(), rel=REL)


def test_jitter_makes_every_rank_wait_for_the_slowest_at_each_collective():
    jitter = LognormalJitter(0.1)
    cost = example_cost(jitter=jitter)
    scenario = Scenario(MLP, 64, iterations=400, seed=1)
    cluster = Cluster.cpus(2, 4)
    sim = simulate_tensor(cluster, scenario, cost)
    closed = predict_tensor(cluster, scenario, cost)
    work = sim.plan.jittered_s
    factors, _ = tensor_factors(scenario, cost, 8)  # the draws: typical, slowest of the other 7
    waited = (factors.max(axis=0) - factors[0])[scenario.warmup_iterations :]
    assert sim.breakdown.sync_s == pytest.approx(waited.mean() * work, rel=REL)
    gap = jitter.expected_max_factor(8) - jitter.expected_max_factor(1)
    assert closed.breakdown.sync_s == pytest.approx(gap * work, rel=REL)
    assert sim.breakdown.sync_s == pytest.approx(gap * work, rel=0.15)  # 400 draws
    assert sim.step_time_s == pytest.approx(closed.step_time_s, rel=0.01)
    assert all(abs(s.residual_s) < 1e-15 for s in sim.steps)
    # data-parallel inference: replicas never wait for each other, even with jitter
    alone = simulate_tensor(cluster, scenario, cost, inference=True, tensor_ranks=1)
    assert alone.breakdown.sync_s == 0.0 and alone.breakdown.comm_s == 0.0
    one = simulate_tensor(Cluster.cpus(1), scenario, cost, inference=True)
    assert alone.step_time_s == pytest.approx(one.step_time_s, rel=REL)


def test_more_ranks_than_units_leave_some_ranks_one_unit_and_trace_has_collectives():
    scenario = Scenario(CNN, 8, iterations=2, jitter=False)
    sim = simulate_tensor(Cluster.cpus(4, 4), scenario, example_cost(), trace=True)
    assert dict((n, s) for n, _, s in sim.plan.slices) == {"dense7": 16, "dense9": 1}
    tracks = set(sim.timeline.tracks())
    assert "collectives (all ranks)" in tracks
    names = {e.name for e in sim.timeline.events}
    assert "forward dense7 (slice)" in names and any(
        n.startswith("allgather dense9") for n in names
    )


def test_layerwise_models_refuse_the_data_parallel_what_ifs():
    cost = example_cost()
    with pytest.raises(ConfigError, match="compression"):
        build_tensor_plan(Cluster.cpus(1, 2), Scenario(MLP, 8, compression="fp16"), cost)
    with pytest.raises(ConfigError, match="local SGD"):
        build_tensor_plan(Cluster.cpus(1, 2), Scenario(MLP, 8, sync_every=2), cost)
    uneven = Cluster(1, 2, speeds=(1.0, 0.5))
    with pytest.raises(ConfigError, match="identical ranks"):
        build_tensor_plan(uneven, Scenario(MLP, 8), cost)


# ------------------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tensor") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _predict(profile: str, *args: str, capsys) -> tuple[int, str, str]:
    try:
        code = main(["predict", "--profile", profile, "--iterations", "4", "--samples", "2", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_model_parallel_json_and_text(profile_path, capsys):
    args = ("--nodes", "1", "--procs-per-node", "4", "--model", "mlp", "--parallel", "model")
    code, stdout, err = _predict(profile_path, *args, "--json", capsys=capsys)
    assert code == 0, err
    out = json.loads(stdout)
    b = out["breakdown"]
    total = b["compute_s"] + b["comm_s"] + b["sync_s"] - b["overlap_s"]
    assert total == pytest.approx(out["step_time_s"], rel=1e-9)
    par = out["parallel"]
    assert par["mode"] == "model" and par["tensor_ranks"] == 4 and not par["inference"]
    assert par["allgather_bytes"] == 32 * 4 * (256 + 128 + 10)
    assert par["allreduce_bytes"] == 32 * 4 * (256 + 128)
    assert out["samples_per_step"] == 32  # strong scaling: one batch for all ranks
    assert out["speedup"] == pytest.approx(out["single_device_step_time_s"] / out["step_time_s"])
    code, text, _ = _predict(profile_path, *args, capsys=capsys)
    assert code == 0 and "strong scaling" in text and "dense0 256 -> 64/rank" in text


def test_predict_model_parallel_on_one_rank_matches_data_parallel(profile_path):
    base = PredictConfig(nodes=1, model="mlp", profile=profile_path, iterations=4, samples=2)
    data = run_prediction(base)
    model = run_prediction(replace(base, parallel="model"))
    assert model["step_time_s"] == pytest.approx(data["step_time_s"], rel=REL)
    assert model["speedup"] == pytest.approx(1.0, rel=REL)


def test_predict_inference_is_faster_and_communicates_nothing_in_data_mode(profile_path):
    base = PredictConfig(nodes=2, procs_per_node=2, model="mlp", profile=profile_path,
                         iterations=4, samples=2)  # fmt: skip
    train = run_prediction(base)
    infer = run_prediction(replace(base, inference=True))
    assert infer["step_time_s"] < train["step_time_s"]
    assert infer["breakdown"]["comm_s"] == 0.0 and infer["parallel"]["replicas"] == 4
    assert infer["samples_per_step"] == 4 * 32
    assert infer["memory_breakdown_bytes"]["gradients"] == 0
    tensor = run_prediction(replace(base, parallel="model", inference=True))
    assert tensor["parallel"]["allreduce_bytes"] == 0 and tensor["parallel"]["allgather_s"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "2"], "--stages is for pipelines"),
        (["--parallel", "model", "--microbatches", "2"], "--microbatches is for pipelines"),
        (["--schedule", "gpipe"], "--schedule is for pipelines"),
        (["--parallel", "tensor"], "invalid choice"),
        (["--parallel", "model", "--stages", "0"], "positive integer"),
        (["--inference", "--mtbf", "1h"], "--mtbf is modelled for data-parallel training only"),
        (["--parallel", "model", "--compression", "fp16"], "compression is for data parallelism"),
    ],
)
def test_parallel_flags_in_the_wrong_mode_are_one_line_errors(profile_path, args, message, capsys):
    code, _, err = _predict(profile_path, "--nodes", "1", "--model", "mlp", *args, capsys=capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1, err
