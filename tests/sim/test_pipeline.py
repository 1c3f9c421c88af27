"""Pipeline parallelism: the split, the schedules, the textbook bubble, both engines, the CLI."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace

import numpy as np
import pytest

from microbench.workload import Workload, load_workload
from pdlsim.cli.main import main
from pdlsim.cli.sweep import sweep
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
from pdlsim.sim.pipeline import (
    build_pipeline_plan,
    micro_batch_sizes,
    partition,
    peak_in_flight,
    pipeline_layout,
    pipeline_times,
    stage_order,
)
from pdlsim.sim.pipeline_engine import predict_pipeline, simulate_pipeline
from tests.costmodel.test_model import write_synthetic_profile
from tests.sim.costs import example_cost

MLP, CNN = load_workload("mlp"), load_workload("cnn")
REL = 1e-9


@dataclass(frozen=True)
class PhaseCost(CostHooks):
    """Dense layers cost ``forward_s`` / ``backward_s`` per sample, everything else nothing;
    messages, collectives, copies and updates are free."""

    forward_s: float
    backward_s: float
    jitter: object = None
    overlap_efficiency: float = 1.0

    def compute_time(self, layer, phase, batch, threads, device):
        if layer.kind != "dense" or phase == "update":
            return 0.0
        return (self.forward_s if phase == "forward" else self.backward_s) * batch

    def collective_time(self, op, nbytes, ranks, placement):
        return 0.0

    def collective_schedule(self, op, nbytes, ranks, placement):
        return ()

    def transfer_time(self, direction, nbytes, pinned):
        return 0.0


def _dense_stack(layers: int) -> Workload:
    dense = [{"kind": "dense", "units": 16}] * layers
    doc = {"input_shape": [16], "layers": [*dense, {"kind": "softmax_cross_entropy"}]}
    return Workload.from_dict(doc)


def test_partition_is_the_optimal_contiguous_split():
    assert partition([1, 2, 3, 4, 5], 2) == (0, 3)  # 1+2+3 | 4+5: max 9
    assert partition([5, 1, 1, 1, 1, 1, 1], 3) == (0, 1, 4)  # max 5 in many ways: the most even
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 9))
        costs = rng.exponential(1.0, n)
        for stages in range(1, n + 1):
            starts = partition(costs, stages)
            assert starts[0] == 0 and list(starts) == sorted(set(starts))
            bounds = [*starts, n]
            got = max(costs[a:b].sum() for a, b in itertools.pairwise(bounds))
            best = min(
                max(costs[a:b].sum() for a, b in itertools.pairwise([0, *cuts, n]))
                for cuts in itertools.combinations(range(1, n), stages - 1)
            )
            assert got == pytest.approx(best, rel=1e-12)
            squares = sum(costs[a:b].sum() ** 2 for a, b in itertools.pairwise(bounds))
            assert squares == pytest.approx(
                min(
                    sum(costs[a:b].sum() ** 2 for a, b in itertools.pairwise([0, *cuts, n]))
                    for cuts in itertools.combinations(range(1, n), stages - 1)
                    if max(costs[a:b].sum() for a, b in itertools.pairwise([0, *cuts, n]))
                    <= best * (1 + 1e-12)
                ),
                rel=1e-12,
            )
    with pytest.raises(ConfigError, match="4 layers into 5 stages"):
        partition([1, 1, 1, 1], 5)


@pytest.mark.parametrize(("stages", "micro"), [(1, 1), (2, 5), (4, 2), (4, 8), (5, 3)])
def test_schedules_run_every_micro_batch_once_and_keep_the_textbook_activations(stages, micro):
    for s in range(stages):
        gpipe = stage_order("gpipe", s, stages, micro)
        one = stage_order("1f1b", s, stages, micro)
        for order in (gpipe, one):
            assert sorted(order) == sorted([("F", m) for m in range(micro)] + [
                ("B", m) for m in range(micro)
            ])  # fmt: skip
            assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(micro))
        assert peak_in_flight(gpipe) == micro
        assert peak_in_flight(one) == min(stages - s, micro)
        warm = min(stages - 1 - s, micro)
        assert all(kind == "F" for kind, _ in one[:warm])
        assert peak_in_flight(stage_order("1f1b", s, stages, micro, backward=False)) == 1


def test_micro_batches_split_the_batch_evenly():
    assert micro_batch_sizes(10, 4) == (3, 3, 2, 2)
    assert micro_batch_sizes(8, 8) == (1,) * 8
    with pytest.raises(ConfigError, match="between 1 and the batch 4"):
        micro_batch_sizes(4, 5)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("micro", [1, 2, 3, 4, 8])
def test_equal_stages_free_links_give_the_textbook_bubble_and_makespan(schedule, stages, micro):
    per_stage = 2  # dense layers per stage
    cost = PhaseCost(forward_s=1e-4, backward_s=2.5e-4)
    scenario = Scenario(_dense_stack(stages * per_stage), 4 * micro, iterations=2, jitter=False)
    t_f, t_b = per_stage * 4 * cost.forward_s, per_stage * 4 * cost.backward_s  # micro-batch 4
    cluster = Cluster.cpus(1, stages)
    for engine in (simulate_pipeline, predict_pipeline):
        result = engine(cluster, scenario, cost, stages, micro, schedule)
        assert result.makespan_s == pytest.approx((micro + stages - 1) * (t_f + t_b), rel=1e-12)
        ideal = (stages - 1) / (micro + stages - 1)
        assert result.bubble_fraction == pytest.approx(ideal, rel=1e-12, abs=1e-15)
        assert result.plan.ideal_bubble_fraction == ideal
        assert result.step_time_s == pytest.approx(result.makespan_s, rel=1e-12)
        dense_per_stage = [
            sum(n.startswith("dense") for n in st.layers) for st in result.plan.stages
        ]
        assert dense_per_stage == [per_stage] * stages
    forward = simulate_pipeline(cluster, scenario, cost, stages, micro, schedule, inference=True)
    assert forward.makespan_s == pytest.approx((micro + stages - 1) * t_f, rel=1e-12)
    assert forward.bubble_fraction == pytest.approx(
        (stages - 1) / (micro + stages - 1), rel=1e-12, abs=1e-15
    )


def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    stages = int(rng.integers(1, 5))
    per_node = stages * int(rng.integers(1, 3)) if rng.random() < 0.5 else max(1, stages // 2)
    if stages % per_node and per_node % stages:
        per_node = stages
    nodes = int(rng.integers(1, 4)) * max(1, stages // per_node)
    cluster = (Cluster.gpus if seed % 3 == 0 else Cluster.cpus)(nodes, per_node)
    workload = (MLP, CNN)[seed % 2]
    micro = int(rng.integers(1, 9))
    scenario = Scenario(
        workload,
        micro * int(rng.integers(1, 5)) + int(rng.integers(0, micro)),
        iterations=int(rng.integers(1, 4)),
        warmup_iterations=int(rng.integers(0, 2)),
        prefetch=bool(rng.random() < 0.5),
        jitter=False,
        seed=seed,
    )
    cost = example_cost(
        intra=LinkCost(float(rng.uniform(1e-7, 5e-6)), float(rng.uniform(1e9, 5e11))),
        inter=LinkCost(float(rng.uniform(1e-6, 5e-5)), float(rng.uniform(1e8, 5e10))),
        gpu_flops_per_s=float(rng.uniform(1e12, 1e14)),
    )
    return cluster, scenario, cost, stages, micro, ("gpipe", "1f1b")[seed % 2 == 0]


def test_simulator_and_recurrence_agree_without_jitter():
    replicated = 0
    for seed in range(30):
        cluster, scenario, cost, stages, micro, schedule = _random_case(seed)
        for inference in (False, True):
            args = (cluster, scenario, cost, stages, micro, schedule, inference)
            sim, closed = simulate_pipeline(*args), predict_pipeline(*args)
            terms = [
                (s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s, s.h2d_exposed_s)
                for s in (*sim.steps, *sim.stages)
            ]
            want = [
                (s.step_s, s.compute_s, s.comm_s, s.sync_s, s.overlap_s, s.h2d_exposed_s)
                for s in (*closed.steps, *closed.stages)
            ]
            assert np.allclose(terms, want, rtol=REL, atol=1e-15), (seed, inference)
            assert sim.bubble_fraction == pytest.approx(closed.bubble_fraction, rel=REL, abs=1e-12)
            assert abs(sim.breakdown.residual_s) < 1e-12
            replicated += sim.plan.replicas > 1 and not inference
    assert replicated >= 5


def test_one_stage_one_micro_batch_is_the_data_parallel_single_rank():
    for cluster in (Cluster.cpus(1, 1, 4), Cluster.gpus(1, 1)):
        scenario = Scenario(CNN, 32, iterations=3, jitter=False, prefetch=True)
        pipe = simulate_pipeline(cluster, scenario, example_cost(), 1, 1)
        data = simulate(cluster, scenario, example_cost())
        assert pipe.step_time_s == pytest.approx(data.step_time_s, rel=REL)
        assert pipe.breakdown.compute_s == pytest.approx(data.breakdown.compute_s, rel=REL)


def test_messages_and_replica_allreduces_use_the_right_links():
    intra, inter = LinkCost(1e-6, 1e11), LinkCost(5e-6, 1e9)
    cost = example_cost(intra=intra, inter=inter)
    scenario = Scenario(MLP, 32, iterations=1, jitter=False)
    # 4 nodes x 2 ranks, 4 stages: a pipeline spans two nodes (boundary 1 -> 2 crosses), and
    # a stage's two replicas sit on two different nodes
    cluster = Cluster.cpus(4, 2)
    assert pipeline_layout(cluster, 4) == (2, (False, True, False), Placement(2, 1))
    plan = build_pipeline_plan(cluster, scenario, cost, 4, 2)
    for st in plan.stages[:-1]:
        link = inter if plan.crosses_nodes[st.index] else intra
        for nbytes, seconds in zip(st.send_bytes, st.send_s, strict=True):
            assert seconds == pytest.approx(link.latency_s + nbytes / link.bandwidth_bytes_per_s)
    for st in plan.stages:
        group = Placement(2, 1)
        expect = cost.collective_time("allreduce", 4 * st.param_count, 2, group)
        assert st.allreduce_s == (expect if st.param_count else 0.0)
    times = pipeline_times(plan, [1.0] * 4, [0.0] * 4)
    for st, t in zip(plan.stages, times, strict=True):
        assert t.end_s - t.flush_s == pytest.approx(st.allreduce_s + st.update_s)
    # whole pipelines inside a node: no boundary crosses; a stage's replicas on every node
    assert pipeline_layout(Cluster.cpus(2, 4), 2) == (4, (False,), Placement(2, 2))
    single = build_pipeline_plan(Cluster.cpus(1, 4), scenario, cost, 4, 2)
    assert single.replicas == 1 and all(st.allreduce_s == 0 for st in single.stages)


def test_bad_layouts_are_one_line_errors():
    scenario = Scenario(MLP, 8, iterations=1)
    with pytest.raises(ConfigError, match=r"stages \(4\) must divide the ranks \(6\)"):
        pipeline_layout(Cluster.cpus(2, 3), 4)
    with pytest.raises(ConfigError, match=r"ranks per node \(6\)"):
        pipeline_layout(Cluster.cpus(2, 6), 4)
    with pytest.raises(ConfigError, match="7 pipeline stages but workload 'mlp' has only 6"):
        build_pipeline_plan(Cluster.cpus(1, 7), scenario, example_cost(), 7, 2)


def test_jitter_slows_the_pipeline_and_the_engines_stay_close():
    cost = example_cost(jitter=LognormalJitter(0.1))
    scenario = Scenario(MLP, 64, iterations=200, seed=2)
    cluster = Cluster.cpus(2, 4)  # two replicas of a 4-stage pipeline
    calm = simulate_pipeline(cluster, replace(scenario, jitter=False), cost, 4, 8)
    sim = simulate_pipeline(cluster, scenario, cost, 4, 8)
    closed = predict_pipeline(cluster, scenario, cost, 4, 8)
    assert sim.step_time_s > calm.step_time_s
    assert sim.step_time_s == pytest.approx(closed.step_time_s, rel=0.05)
    assert all(abs(s.residual_s) < 1e-12 for s in sim.steps)
    assert 1.0 < sim.breakdown.pace_factor


# ------------------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pipeline") / "profile.json"
    write_synthetic_profile(path)
    return str(path)


def _predict(profile: str, *args: str, capsys) -> tuple[int, str, str]:
    try:
        code = main(["predict", "--profile", profile, "--iterations", "3", "--samples", "2", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_pipeline_json_reports_the_split_and_the_bubble(profile_path, capsys):
    args = ["--nodes", "2", "--procs-per-node", "2", "--model", "cnn", "--parallel", "pipeline"]
    args += ["--stages", "2", "--microbatches", "4", "--schedule", "gpipe", "--json"]
    code, stdout, err = _predict(profile_path, *args, capsys=capsys)
    assert code == 0, err
    out = json.loads(stdout)
    par = out["parallel"]
    assert par["mode"] == "pipeline" and par["replicas"] == 2 and par["schedule"] == "gpipe"
    assert [x for st in par["stages"] for x in st["layers"]] == [i.name for i in CNN.layers]
    assert [st["peak_in_flight"] for st in par["stages"]] == [4, 4]
    assert 0 <= par["ideal_bubble_fraction"] <= par["bubble_fraction"] < 1
    assert par["ideal_bubble_fraction"] == pytest.approx(1 / 5)
    assert par["stages"][0]["allreduce_s"] > 0  # two replicas allreduce each stage
    assert out["samples_per_step"] == 2 * 32
    b = out["breakdown"]
    total = b["compute_s"] + b["comm_s"] + b["sync_s"] - b["overlap_s"]
    assert total == pytest.approx(out["step_time_s"], rel=1e-9)
    code, text, _ = _predict(profile_path, *args[:-1], capsys=capsys)
    assert code == 0 and "bubble" in text and "stage split" in text and "idle (bubble)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "2"], "--microbatches M"),
        (["--stages", "2", "--microbatches", "64"], "--microbatches 64 is more than --batch 32"),
        (["--stages", "7", "--microbatches", "2", "--procs-per-node", "7"],
         "--stages 7 is more than the 6 layers"),
        (["--stages", "4", "--microbatches", "2", "--procs-per-node", "6"],
         "--stages 4 must divide the 6 ranks"),
        (["--stages", "2", "--microbatches", "2", "--schedule", "zigzag"], "invalid choice"),
    ],
)  # fmt: skip
def test_bad_pipeline_flags_are_one_line_errors(profile_path, args, message, capsys):
    base = ["--nodes", "1", "--model", "mlp", "--parallel", "pipeline"]
    code, _, err = _predict(profile_path, *base, *args, capsys=capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sweep_passes_the_pipeline_flags_through(profile_path):
    base = PredictConfig(model="mlp", profile=profile_path, iterations=2, samples=2,
                         parallel="pipeline", stages=2, microbatches=4)  # fmt: skip
    frame = sweep(base, (1, 2), (2,), (32,))
    assert list(frame["parallel"]) == ["pipeline"] * 2
    assert (frame["bubble_fraction"] > 0).all()
    one = run_prediction(replace(base, nodes=2, procs_per_node=2))
    assert frame["step_time_s"].iloc[1] == pytest.approx(one["step_time_s"], rel=REL)
