"""The kernel model: fitted from a (tiny) real sweep, it prices any workload's calls; its step
terms (interplay factor, glue) are recovered from synthetic steps and scored with each network
left out; it travels through a profile to predict."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.kernels import KernelModel
from calibration.loop_table import LoopTable
from calibration.profile_checks import FieldError
from calibration.step_terms import StepTerms, fit_step_terms
from microbench.kernelbench import run_kernels
from microbench.kernels.calls import KernelCall, call_features, op_calls, step_calls
from microbench.kernels.steps import glue_workloads, paired_rounds
from microbench.loopcalls import FRESH_DATA, fresh_views, loop_dims
from microbench.machine import machine_metadata
from microbench.randomnets import random_workloads
from microbench.records import RecordWriter, load_dataframe
from microbench.workload import load_workload
from pdlsim.costmodel.kernels import KernelCompute
from tests.conftest import pdlsim_here
from tests.kernel_plans import TINY, TWO_COUNTS
from tests.profiles import STEP_TABLES

PACKAGED = Path(__file__).resolve().parents[2] / "calibration" / "profiles"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KernelModel]:
    out = tmp_path_factory.mktemp("kernels")
    with RecordWriter(out / "kernels.jsonl", machine_metadata(), {"command": "test"}) as writer:
        run_kernels(TINY, writer)
    return out, KernelModel().fit(load_dataframe(out, type="measurement"))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_any_workloads_calls_are_priced(sweep, name):
    _, model = sweep
    workloads = [load_workload(name), *random_workloads(5, 2)]
    for workload in workloads:
        for call in step_calls(workload, 7, 1):
            seconds = model.call_s(call, 1)
            assert np.isfinite(seconds) and seconds > 0, call


def test_thread_counts_take_turns_so_a_slow_spell_lands_on_each(monkeypatch):
    """Each count runs blocks of about TURN_POINTS points in turn, sized so that the counts end
    together, and every point of each is measured once, at its own count."""
    import microbench.kernelbench as kernelbench

    monkeypatch.setattr(kernelbench, "TURN_POINTS", 7)
    monkeypatch.setattr(kernelbench, "STALL_FACTOR", math.inf)  # no point timed again
    set_to: list[int] = []
    monkeypatch.setattr(kernelbench, "set_threads", set_to.append)
    done = [m.params["threads"] for m in run_kernels(TWO_COUNTS, None)]
    runs = [len(list(g)) for _, g in itertools.groupby(done)]
    assert set_to[:4] == [1, 2, 1, 2] and len(set_to) == len(runs)
    assert max(runs) <= 7 + 2 and len(runs) >= 4  # a stride triple is not split
    assert done.count(1) > 7 and done.count(2) > 7
    halves = done[: len(done) // 2], done[len(done) // 2 :]
    for t in (1, 2):  # spread over the whole sweep, not one count after the other
        assert abs(halves[0].count(t) - halves[1].count(t)) <= 7


@pytest.mark.parametrize(
    ("name", "stalled", "call"),
    [
        ("gemm", ("nn", 16, 256, 16), KernelCall("gemm_nn", (16, 256, 16), 0, "forward")),
        ("loop", ("relu", (64,)), KernelCall("relu", (64,), 0, "forward", parallel=True)),
    ],
    ids=["gemm", "loop"],
)
def test_a_two_thread_point_that_stalled_is_timed_again_and_the_retiming_stands(
    monkeypatch, tmp_path, name, stalled, call
):
    """A GEMM or a parallel loop at two threads 50x its one-thread time (it waited for a
    descheduled core) is timed again after the sweep; the kernel model prices the call from
    the re-timing."""
    import microbench.kernelbench as kernelbench

    def key(p):
        if name == "loop":
            return p["kernel"], tuple(p["dims"])
        return p["layout"], p["m"], p["n"], p["k"]

    real = kernelbench.measure

    def measure(repetition, policy, **labels):
        m = real(repetition, policy, **labels)
        p = labels["params"]
        if labels["name"] == name and p["threads"] == 2 and not p.get("retimed"):
            if key(p) == stalled:
                return dataclasses.replace(m, samples=m.samples * 50 + 1e-3)
        return m

    monkeypatch.setattr(kernelbench, "measure", measure)
    out = tmp_path / "run"
    with RecordWriter(out / "kernels.jsonl", machine_metadata(), {"command": "test"}) as writer:
        done = run_kernels(TWO_COUNTS, writer)
    again = [m for m in done if m.params.get("retimed")]
    assert stalled in [key(m.params) for m in again if m.name == name]
    assert all(m.params["threads"] == 2 and m.name in ("gemm", "loop") for m in again)
    model = KernelModel().fit(load_dataframe(out, type="measurement"))
    serial = dataclasses.replace(call, parallel=False)
    assert model.call_s(call, 2) < 2 * model.call_s(serial, 1) + 1e-4


def test_data_dependent_loops_read_fresh_data_each_call():
    """A max-pool's branches follow its data: each call reads another sequence of values, so
    the branch predictor cannot learn them; a call too large for shifts reads one."""
    views = fresh_views(np.arange(100.0), (4, 5))
    assert len(views) == FRESH_DATA and all(v.shape == (4, 5) for v in views)
    assert len({v[0, 0] for v in views}) == FRESH_DATA
    assert len({id(v) for v in fresh_views(np.arange(20.0), (4, 5))}) == 1


def test_a_thread_count_not_swept_takes_the_nearest_below(sweep):
    _, model = sweep
    call = KernelCall("gemm_nn", (16, 16, 16), 0, "forward")
    assert model.call_s(call, 8) == model.call_s(call, 1)
    with pytest.raises(KeyError, match="not measured"):
        model._table(model.loops_, "no_such_loop", 1)


def _step_rows(
    factor: float,
    per_op: float,
    per_step: float,
    noise: float,
    glue_noise: float | None = None,
    networks: int = 14,
) -> pd.DataFrame:
    """ "step" and "step_alone" records of random networks at random batches, their steps
    ``factor * alone + per_op * ops + per_step`` times a log-normal error of sigma ``noise``;
    with ``glue_noise``, the kernels' part and the glue's part each times its own."""
    rng = np.random.default_rng(1)
    rows = []
    for i, workload in enumerate([*glue_workloads(), *random_workloads(4, networks)]):
        alone = float(np.exp(rng.uniform(np.log(2e-6), np.log(3e-2))))
        ops = len(op_calls(workload))
        glue = per_op * ops + per_step
        if glue_noise is None:
            step = (factor * alone + glue) * float(np.exp(rng.normal(0, noise)))
        else:
            kernels_error, glue_error = np.exp(rng.normal(0, [noise, glue_noise]))
            step = factor * alone * kernels_error + glue * glue_error
        key = {"params.threads": 1, "params.workload_json": json.dumps(workload.to_dict()),
               "params.batch": 1 + i, "params.op_calls": ops}  # fmt: skip
        rows.append({**key, "name": "step", "samples": [step * 0.99, step, step * 1.01]})
        rows.append({**key, "name": "step_alone", "samples": [alone, alone * 1.02]})
    return pd.DataFrame(rows)


def test_the_step_benchmark_times_a_step_that_follows_a_step_as_training_does():
    """A step right after another finds its own data in the caches; one right after the calls
    alone finds theirs. Only the first kind is timed, every round."""
    now, last = [0.0], ["alone"]

    def step() -> None:
        now[0] += 1.0 if last[0] == "step" else 3.0  # a cold step costs three ticks
        last[0] = "step"

    def alone() -> float:
        last[0] = "alone"
        return 0.5

    steps, alones = paired_rounds(step, alone, rounds=4, clock=lambda: now[0])
    assert steps == [1.0] * 4 and alones == [0.5] * 4


def test_step_terms_are_recovered_from_synthetic_steps():
    factor, per_op, per_step = 1.25, 3e-6, 10e-6
    terms, quality = fit_step_terms(_step_rows(factor, per_op, per_step, 0.02))
    fitted = terms[1]
    assert fitted.factor == pytest.approx(factor, rel=0.03)
    assert fitted.per_op_s == pytest.approx(per_op, rel=0.1)
    assert fitted.per_step_s == pytest.approx(per_step, rel=0.5)
    for name, truth in (("factor", factor), ("per_op_s", per_op), ("per_step_s", per_step)):
        interval = fitted.intervals[name]
        assert interval["low"] <= truth <= interval["high"], name
    # the leave-one-out residuals' spread, of either part: the noise put in on both
    assert 0.01 < fitted.sigma_kernels < 0.04 and 0.01 < fitted.sigma_glue < 0.04
    assert quality["1"]["n_points"] == len(glue_workloads()) + 14
    assert quality["1"]["leave_out_rel_error"] >= quality["1"]["median_rel_error"] * 0.8
    assert StepTerms.from_dict(fitted.to_dict()) == fitted


def test_the_step_terms_sigma_is_the_error_on_networks_priced_from_the_tables():
    """Left out and priced from tables 10% off at random, the networks' steps spread by up to
    that 10% (less where the glue is most of a step): the band's sigma is the model's error on a
    network it never saw, tables included."""
    rows = _step_rows(1.25, 3e-6, 10e-6, 0.0)
    noise = np.exp(np.random.default_rng(2).normal(0.0, 0.1, len(rows) // 2))
    exact, _ = fit_step_terms(rows)
    priced, quality = fit_step_terms(rows, _prices(rows, noise))
    assert exact[1].sigma_kernels < 0.001 and exact[1].sigma_glue < 0.001
    assert 0.02 < priced[1].sigma_kernels < 0.15  # the tables err on the kernels
    assert quality["1"]["leave_out_rel_error"] > 0.02


def test_the_band_spreads_the_kernels_and_the_glue_each_by_its_own_error():
    """Kernels 3% off and glue 30% off at random: the two spreads come back, and a step's
    sigma follows its glue share from the one to the other."""
    fitted, _ = fit_step_terms(_step_rows(1.25, 3e-6, 10e-6, 0.03, 0.3, networks=60))
    terms = fitted[1]
    assert 0.015 < terms.sigma_kernels < 0.06 and 0.15 < terms.sigma_glue < 0.6
    for name, truth in (("sigma_kernels", 0.03), ("sigma_glue", 0.3)):
        interval = terms.intervals[name]  # profile likelihood: holds the value and the truth
        assert interval["low"] < getattr(terms, name) < interval["high"], name
        assert interval["low"] < truth < interval["high"], (name, interval)
    big, tiny = terms.sigma(1.0, 10), terms.sigma(1e-7, 10)  # glue shares ~0 and ~1
    assert big == pytest.approx(terms.sigma_kernels, rel=1e-3)
    assert tiny == pytest.approx(terms.sigma_glue, rel=0.01)
    half = terms.glue_s(10) / terms.factor  # kernels as costly as the glue
    assert terms.sigma(half, 10) == pytest.approx(math.hypot(*np.array(
        [terms.sigma_kernels, terms.sigma_glue]) / 2))  # fmt: skip


def test_a_profile_with_one_spread_has_both_fitted_again_from_its_points():
    fitted, _ = fit_step_terms(_step_rows(1.25, 3e-6, 10e-6, 0.03, 0.3, networks=30))
    doc = fitted[1].to_dict()
    del doc["sigma_kernels"], doc["sigma_glue"]
    older = StepTerms.from_dict({**doc, "sigma": 0.2})
    assert older == fitted[1]
    without_points = StepTerms.from_dict({**doc, "sigma": 0.2, "points": []})
    assert (without_points.sigma_kernels, without_points.sigma_glue) == (0.2, 0.2)


def test_tables_that_price_every_network_low_raise_the_factor_not_the_error():
    """The factor multiplies what the tables price, so it is fitted on that: tables 8% below
    the calls timed alone give a factor 1/0.92 higher and left-out networks as close as exact
    tables do."""
    rows = _step_rows(1.25, 3e-6, 10e-6, 0.01)
    exact, exact_quality = fit_step_terms(rows)
    low, low_quality = fit_step_terms(rows, _prices(rows, np.full(len(rows) // 2, 0.92)))
    assert low[1].factor == pytest.approx(exact[1].factor / 0.92, rel=0.01)
    assert low_quality["1"]["leave_out_rel_error"] == pytest.approx(
        exact_quality["1"]["leave_out_rel_error"], rel=0.2, abs=0.002
    )


def _prices(rows: pd.DataFrame, scale: np.ndarray) -> Callable[[str, int, int], float]:
    """A pricing function that gives each network its calls' seconds alone times ``scale``."""
    alone = rows[rows["name"] == "step_alone"]
    prices = {
        (w, b): float(np.median(s)) * e
        for w, b, s, e in zip(alone["params.workload_json"], alone["params.batch"],
                              alone["samples"], scale, strict=True)
    }  # fmt: skip
    return lambda w, b, t: prices[(w, b)]


def test_without_networks_of_two_sizes_the_step_terms_stay_neutral():
    """Glue and factor cannot be told apart from one op count: kernels as alone, no glue."""
    rows = _step_rows(1.2, 3e-6, 0.0, 0.0)
    rows["params.op_calls"] = 7
    terms, quality = fit_step_terms(rows)
    assert (terms[1].factor, terms[1].per_op_s, terms[1].per_step_s) == (1.0, 0.0, 0.0)
    assert quality == {}


def test_step_terms_are_scored_with_each_network_left_out(sweep):
    _, model = sweep
    quality = model.quality_dict()["step_terms"]["1"]
    assert quality["n_points"] == len(glue_workloads()) + TINY.step_networks
    assert quality["leave_out_rel_error"] is not None
    terms = model.step_terms(4)  # a thread count not measured: the nearest below
    assert terms == model.steps_[1] and terms.factor > 0


def test_every_thread_count_takes_the_interplay_factor_of_the_fewest_threads(sweep):
    """The interplay factor is the caches' effect, fitted where the tables hold no thread
    costs; each count keeps its own glue and spreads (docs/compute-model.md)."""
    _, model = sweep
    one = model.steps_[1]
    two = dataclasses.replace(
        one,
        factor=one.factor * 1.3,
        per_op_s=one.per_op_s + 5e-6,
        intervals={**one.intervals, "factor": {"low": 9.0, "high": 9.9}},
    )
    saved = dict(model.steps_)
    try:
        model.steps_ = {1: one, 2: two}
        taken = model.step_terms(2)
        assert taken.factor == one.factor and taken.intervals["factor"] == one.intervals["factor"]
        assert (taken.per_op_s, taken.sigma_kernels) == (two.per_op_s, two.sigma_kernels)
        assert model.step_terms(1) is one
        unfitted = StepTerms(points=one.points)  # one thread could not separate the factor
        model.steps_ = {1: unfitted, 2: two}
        assert model.step_terms(2) is two
    finally:
        model.steps_ = saved


def test_a_profile_from_before_the_step_terms_reads_its_glue(sweep):
    _, model = sweep
    doc = model.to_dict()
    del doc["step_terms"], doc["beyond_sigma_per_log"]  # both came later
    doc["glue"] = {"per_op_s": 2e-6, "per_step_s": 1e-6, "intervals": {}, "points": []}
    doc["spread"] = {"gemm": 0.05, "loops": 0.25}
    old = KernelModel.from_dict(doc)
    assert old.step_terms(2) == StepTerms(per_op_s=2e-6, per_step_s=1e-6)
    # its band: one draw of the tables' spreads weighted by the step's GEMM and loop shares
    mlp = load_workload("mlp")
    calls = step_calls(mlp, 8, 1)
    alone = [old.call_s(c, 1) for c in calls]
    share = sum(t for c, t in zip(calls, alone, strict=True) if c.kernel.startswith("gemm_"))
    share /= sum(alone)
    sigma = float(np.hypot(0.05 * share, 0.25 * (1 - share)))
    plain = KernelCompute(old, frozenset())
    one_sigma = KernelCompute(old, frozenset(), 1.0).step_s(mlp, 8, 1)
    assert one_sigma == pytest.approx(plain.step_s(mlp, 8, 1) * np.exp(sigma))


def _block_law(dims) -> float:
    """A synthetic attention core: 5 us per (sample, head) block beside 0.4 ns per element."""
    n, heads = dims[0], dims[3]
    return n * heads * 5e-6 + call_features("attention", dims)[0] * 0.4e-9


def test_attention_tables_recover_a_per_block_cost_on_shapes_never_swept():
    """Laid out over (elements, block), a table of the sweep's calls (2 heads of 16, square
    blocks) prices calls of other heads, head widths, sequences and masks by the synthetic
    law to within 10% (log-linear between the swept blocks); over the head width, as a
    profile without ``attention_run`` lays it out, the same calls would be several times
    off."""
    sweep_dims = [loop_dims("attention", e, r) for e in (2**12, 2**15, 2**18, 2**21, 2**24)
                  for r in (64, 256, 1024, 4096, 16384, 65536, 262144) if r <= e]  # fmt: skip
    model = KernelModel()  # a fit's: tables over the block
    model.loops_ = {("attention_serial", 1): LoopTable.from_points(
        (*call_features("attention", d), _block_law(d)) for d in sweep_dims)}  # fmt: skip
    for dims in [(96, 24, 48, 4, 1), (384, 12, 48, 4, 0), (8, 100, 64, 1, 1), (40, 6, 24, 8, 0)]:
        call = KernelCall("attention", dims, 0, "forward")
        assert model.call_s(call, 1) == pytest.approx(_block_law(dims), rel=0.1), dims
    # the same law laid out by head width: each head width's curve holds the sweep's blocks
    by_width = LoopTable.from_points(
        (*call_features("attention", d), _block_law(d))
        for d in [
            (max(1, e // (128 * 128 * 2 * w)), 128, 2 * w, 2, 0)
            for e in (2**18, 2**21, 2**24)
            for w in (8, 16, 32, 64)
        ]  # fmt: skip
    )
    small = (384, 12, 48, 4, 0)
    legacy = by_width.time_s(call_features("attention", small)[0], 12)
    assert _block_law(small) > 3 * legacy


def test_a_profile_without_attention_run_prices_attention_by_head_width(sweep):
    _, model = sweep
    doc = model.to_dict()
    assert doc["attention_run"] == "block"
    del doc["attention_run"]
    old = KernelModel.from_dict(doc)
    call = KernelCall("attention", (4, 24, 48, 4, 1), 0, "forward")
    table = old.loops_[(call.variant, 1)]
    assert old.call_s(call, 1) == table.time_s(4 * 300 * 48, 12)
    assert model.call_s(call, 1) == pytest.approx(table.time_s(4 * 576 * 48, 576 * 12), 1e-4)
    doc["attention_run"] = "heads"
    with pytest.raises(FieldError, match="attention_run"):
        KernelModel.from_dict(doc)


def _with_steps(sweep, slower: float, batches) -> tuple[KernelModel, pd.DataFrame]:
    """The sweep's model alone, and its records with the mlp and cnn presets' whole steps at
    ``batches`` and one thread measured ``slower`` x what that model prices them."""
    out, _ = sweep
    kernels = load_dataframe(out, type="measurement")
    alone = KernelModel().fit(kernels)
    speed = [
        {"type": "measurement", "benchmark": "speed", "name": "step_compute",
         "params.model": name, "params.batch": batch, "params.threads": 1,
         "params.device": "cpu",
         "samples": [slower * alone.step_s(load_workload(name), batch, 1)]}
        for name in ("mlp", "cnn") for batch in batches
    ]  # fmt: skip
    return alone, pd.concat([kernels, pd.DataFrame(speed)], ignore_index=True)


def test_calibration_steps_score_the_model_by_workload_batch_and_threads(sweep):
    """Whole steps measured 10% slower than the model prices them: every workload, batch and
    thread count reports that error, and, the model having fitted none of them, a leave-out
    error equal to it; the steps move no fitted number."""
    alone, with_steps = _with_steps(sweep, 1.1, (5, 9))
    checked = KernelModel().fit(with_steps)
    steps = checked.quality_dict()["steps"]
    assert set(steps["workload"]) == {"mlp", "cnn"} and set(steps["batch"]) == {"b5", "b9"}
    for group in steps.values():
        for q in group.values():
            assert q["median_rel_error"] == pytest.approx(0.1 / 1.1, rel=1e-6)
            assert q["leave_out_rel_error"] == q["median_rel_error"]
    assert checked.to_dict()["gemm"] == alone.to_dict()["gemm"]
    assert checked.steps_ == alone.steps_


@pytest.mark.parametrize(("slower", "said"), [(1.1, False), (3.0, True)])
def test_tables_far_off_the_calibrations_own_steps_are_said(sweep, slower, said):
    """Steps measured 3x what the tables price (a sweep cut short prices them low): a warning
    that says to time the sweep again; 10% off, none."""
    _, with_steps = _with_steps(sweep, slower, (5,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        KernelModel().fit(with_steps)
    notes = [str(w.message) for w in caught if "own training steps" in str(w.message)]
    assert bool(notes) == said
    if said:
        assert "67% off (median of 2)" in notes[0] and "time the kernel sweep again" in notes[0]


def test_compute_table_charges_every_call_once(sweep):
    _, model = sweep
    cnn = load_workload("cnn")
    plain = KernelCompute(model, frozenset())
    table = plain.step_table(cnn, cnn.layers, 9, 1)
    calls = step_calls(cnn, 9, 1)
    assert sum(table.values()) == pytest.approx(sum(model.call_s(c, 1) for c in calls))
    update = {k: v for k, v in table.items() if k[1] == "update"}
    params = {info.index: info.param_count for info in cnn.layers if info.param_count}
    shares = {k[0]: v / sum(update.values()) for k, v in update.items()}
    assert shares == pytest.approx({i: n / cnn.param_count for i, n in params.items()})
    gather = model.call_s(calls[0], 1)
    assert table[(0, "forward")] > gather  # the gather is charged to the first layer
    full = KernelCompute(model)
    glue = KernelCompute(model, frozenset({"glue"})).step_s(cnn, 9, 1)
    terms = model.step_terms(1)
    ops = len(op_calls(cnn))
    assert glue == pytest.approx(plain.step_s(cnn, 9, 1) + terms.per_op_s * ops + terms.per_step_s)
    assert glue > plain.step_s(cnn, 9, 1)  # the glue adds
    inside = KernelCompute(model, frozenset({"interplay"})).step_s(cnn, 9, 1)
    factor = model.step_terms(1).factor
    assert inside == pytest.approx(factor * plain.step_s(cnn, 9, 1))
    rng = np.random.default_rng(0)
    draws = [full.drawn(rng).step_s(cnn, 9, 1) for _ in range(40)]
    assert min(draws) < full.step_s(cnn, 9, 1) < max(draws)  # the band moves the step
    with pytest.raises(ValueError, match="unknown kernel-model terms"):
        KernelCompute(model, frozenset({"magic"}))


def test_the_band_widens_with_the_distance_beyond_the_tables(sweep):
    """The tiny sweep's GEMM grid ends at 256: the MLP's 784-wide layers lie beyond it at any
    batch, and further beyond at a large one. The step's log sigma is the step terms' and the
    law's error times each call's distance, weighted by its share of the step's table time."""
    _, model = sweep
    mlp = load_workload("mlp")
    assert model.beyond_sigma_["gemm"] > 0

    def log_sigma(m: KernelModel, batch: int) -> float:
        return math.log(KernelCompute(m, frozenset(), 1.0).step_s(mlp, batch, 1)
                        / KernelCompute(m, frozenset(), 0.0).step_s(mlp, batch, 1))  # fmt: skip

    def own(batch: int) -> float:  # the step terms' sigma at the step's glue share
        calls = step_calls(mlp, batch, 1)
        kernels = sum(model.call_s(c, 1) for c in calls)
        return model.step_terms(1).sigma(kernels, len(op_calls(mlp)))

    calls = step_calls(mlp, 4096, 1)
    seconds = np.array([model.call_s(c, 1) for c in calls])
    beyond = np.array([model.beyond_sigma(c, 1) for c in calls])
    widened = math.hypot(own(4096), seconds @ beyond / seconds.sum())
    assert log_sigma(model, 4096) == pytest.approx(widened)

    def beyond_part(batch: int) -> float:
        return math.sqrt(log_sigma(model, batch) ** 2 - own(batch) ** 2)

    assert beyond_part(4096) > beyond_part(2) > 0
    older = KernelModel.from_dict({**model.to_dict(), "beyond_sigma_per_log": {}})
    assert log_sigma(older, 4096) == pytest.approx(own(4096))  # a profile without the figure


def test_a_bands_draws_cover_the_models_error_evenly(sweep):
    """K band samples put one draw of the model's error in each of K equal-probability strata
    (a Latin hypercube), independently of the drift's stratum i."""
    from scipy import stats

    _, model = sweep
    compute, k = KernelCompute(model), 40
    rng = np.random.default_rng(3)
    z = np.array([compute.drawn(rng, (i, k)).z for i in range(k)])
    assert sorted((stats.norm.cdf(z) * k).astype(int)) == list(range(k))
    assert abs(stats.spearmanr(np.arange(k), z).statistic) < 0.5


def test_the_model_predicts_through_a_profile(sweep, tmp_path):
    _, model = sweep
    doc = json.loads(STEP_TABLES.read_text())
    doc["models"]["kernels"] = model.to_dict()
    # terms of known size, not the tiny sweep's, whose factor and glue may nearly cancel
    terms = doc["models"]["kernels"]["step_terms"]["1"]
    known = {"factor": 1.5, "per_op_s": 0.0, "per_step_s": 0.0}
    terms.update(known, intervals={k: {"low": v, "high": v} for k, v in known.items()})
    profile = tmp_path / "kernels-profile.json"
    profile.write_text(json.dumps(doc))
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(random_workloads(9, 2)[1].to_dict()))
    steps = {}
    for corrections in ("all", "none"):
        done = pdlsim_here(
            "predict", "--nodes", "1", "--batch", "24", "--model", str(workload), "--profile",
            str(profile), "--corrections", corrections, "--samples", "3", "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["provenance"]["compute"].startswith("profile kernel tables")
        steps[corrections] = out["step_time_s"]
    assert steps["none"] > 0 and steps["all"] > 1.3 * steps["none"]  # the kernels x 1.5
    bad = pdlsim_here("predict", "--nodes", "1", "--corrections", "magic")
    assert bad.returncode == 2 and "unknown correction" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("architecture, split", [("SkylakeX", True), ("Haswell", False)])
def test_gemm_tables_split_where_the_recorded_blas_has_a_small_kernel(sweep, architecture, split):
    """The small-kernel rule comes from the BLAS the sweep recorded, and stays in the profile."""
    out, _ = sweep
    blas = {"machine.blas.name": "openblas", "machine.blas.architecture": architecture}
    model = KernelModel().fit(load_dataframe(out, type="measurement").assign(**blas))
    again = KernelModel.from_dict(json.loads(json.dumps(model.to_dict())))
    for key, table in model.gemm_.items():
        assert (table.small is not None) == split
        assert again.gemm_[key].small == table.small


def test_every_gemm_table_carries_the_stride_law_of_its_layout_and_threads(sweep):
    _, model = sweep
    for table in model.gemm_.values():
        assert table.alias is not None and 256 in table.alias.per_element_s
    again = KernelModel.from_dict(model.to_dict())
    for key, table in model.gemm_.items():  # four significant digits kept
        assert again.gemm_[key].alias.c_s(64, 2048) == pytest.approx(
            table.alias.c_s(64, 2048), 1e-3
        )


def test_every_update_the_trainer_runs_is_swept_and_priced(sweep):
    """SGD, momentum and Adam each have a loop table of their own; Adam, reading and writing
    two moments besides the weights, costs more than plain SGD over the same parameters."""
    _, model = sweep
    assert {"sgd_serial", "sgd_momentum_serial", "adam_serial"} <= {v for v, _ in model.loops_}
    mlp = load_workload("mlp")
    steps = {name: KernelCompute(model, frozenset(), optimizer=name).step_s(mlp, 8, 1)
             for name in ("sgd", "momentum", "adam", "adamw")}  # fmt: skip
    assert steps["adam"] == steps["adamw"] > steps["sgd"]
    update = [c for c in step_calls(mlp, 8, 1, optimizer="adam") if c.phase == "update"]
    assert [c.kernel for c in update] == ["adam"] and update[0].dims == (mlp.param_count,)


def test_the_step_benchmark_times_the_same_networks_small_to_large_at_every_thread_count():
    """The interplay is measured on residual networks as well as chains, on one draw for every
    thread count, its batches one per stratum of the log range: each thread count's terms are
    fitted over the same steps, the largest batch among them."""
    import math

    from microbench.kernels.steps import STEP_BATCHES, STEP_KINDS, step_workloads

    nets = step_workloads(6)
    assert nets == step_workloads(6)  # one stream, whatever the thread count
    drawn = [(w, b) for w, b in nets if w.name.startswith("step-")]
    assert [w.name.split("-")[1] for w, _ in drawn] == list(STEP_KINDS) * 2
    assert any(info.kind == "add" for w, _ in drawn for info in w.layers)
    low, high = (math.log(b) for b in STEP_BATCHES)
    strata = sorted(int(6 * (math.log(b) - low) / (high - low) - 1e-9) for _, b in drawn)
    assert strata == list(range(6))


def test_a_quick_step_benchmark_keeps_the_full_draw_less_its_longest_steps():
    """The full draw's networks up to the FLOPs cap, every kind, small to large: a short sweep
    fits its terms on small to large steps too, not on a few alike."""
    from microbench.commands.kernels import plan_from_args
    from microbench.kernelbench import QUICK_STEP_MAX_FLOPS, STEP_NETWORKS
    from microbench.kernels.steps import step_flops, step_workloads

    full = step_workloads(STEP_NETWORKS)
    quick = step_workloads(STEP_NETWORKS, QUICK_STEP_MAX_FLOPS)
    kept = [net for net in full if net[0].name.startswith("glue") or
            step_flops(*net) <= QUICK_STEP_MAX_FLOPS]  # fmt: skip
    assert quick == kept and len(kept) < len(full)
    drawn = [(w, b) for w, b in quick if w.name.startswith("step-")]
    assert {w.name.split("-")[1] for w, _ in drawn} == {"mlp", "cnn", "res"}
    sizes = sorted(step_flops(w, b) for w, b in drawn)
    assert sizes[-1] / sizes[0] > 100
    args = argparse.Namespace(threads=None, seed=0, quick=True, target=None, time_cap=None)
    plan = plan_from_args(args)
    assert (plan.step_networks, plan.step_max_flops) == (STEP_NETWORKS, QUICK_STEP_MAX_FLOPS)


def test_a_shape_timed_in_two_pooled_sweeps_takes_the_median_of_both(sweep):
    """Sweeps pooled from two moments time every GEMM twice: the table holds the median of
    the two, whichever sweep came first."""
    out, model = sweep
    frame = load_dataframe(out, type="measurement")
    gemm = frame[frame["name"] == "gemm"]
    slower = gemm.assign(samples=[[3 * s for s in samples] for samples in gemm["samples"]])
    for pooled in (pd.concat([frame, slower]), pd.concat([slower, frame])):
        again = KernelModel().fit(pooled.reset_index(drop=True))
        for key, table in model.gemm_.items():
            for shape, t in table.points.items():
                assert again.gemm_[key].points[shape] == pytest.approx(2 * t, rel=1e-9)
