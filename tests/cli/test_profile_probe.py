"""Profiles and records a careless or hostile user hands pdlsim, found by a fault probe of
``--profile`` (predict, sweep, validate, the Python API) and of ``calibrate --from``: each is
one line on stderr starting ``pdlsim: error:`` that names the culprit, exit status 2, no
traceback, and a file that was there before (a trace, a sweep's table, a profile) left as it
was."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pdlsim
from calibration.jitter import JitterModel
from calibration.profile import Profile, load_profile
from microbench.errors import UserError
from microbench.records import RecordWriter
from tests.calibration.test_overlap_model import write_interference
from tests.conftest import refused_here
from tests.plots.test_plots import _collectives, _compute, _jitter, _write

FAST = ["--iterations", "2", "--samples", "2"]
BEFORE = "a file written before this run\n"


# ------------------------------------------------------------ damaged profiles
def _profile() -> dict[str, Any]:
    """The packaged h100-16core profile (CPU and GPU compute, small), a copy to damage."""
    return load_profile("h100-16core").to_dict()


def _cpu(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["models"]["compute"]["devices"]["cpu"]


def _jitter_params(doc: dict[str, Any], **params: float) -> None:
    doc["models"]["jitter"]["params"] = params  # without intervals, which would name it first


def _jitter_scale(doc: dict[str, Any], scale: float) -> None:
    doc["models"]["jitter"].update(scale=scale, moments=[])  # no moments: the scale is used


def _reversed(doc: dict[str, Any]) -> None:
    doc["models"]["jitter"]["quantiles"].reverse()


def _thread_zero(doc: dict[str, Any]) -> None:
    _cpu(doc)["threads"]["0"] = _cpu(doc)["threads"]["1"]


DAMAGES: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (lambda d: d["models"].update(colocation={}), "models.colocation: is an empty object"),
    (lambda d: d["models"].update(drift={}), "models.drift: is an empty object"),
    (lambda d: d["models"].update(storage={}), "models.storage: is an empty object"),
    (lambda d: d.update(fit_quality=[]), "fit_quality: must be an object, got list"),
    (lambda d: d.update(sources={}), "sources: must be a list, got dict"),
    (
        lambda d: _cpu(d)["threads"]["1"]["intervals"]["peak_flops_per_s"].update(confidence=5),
        "threads.1.intervals.peak_flops_per_s.confidence: a confidence level is a fraction",
    ),
    (_thread_zero, "models.compute.devices.cpu.threads.0: a thread count must be a whole"),
    (
        lambda d: _cpu(d)["scaling"]["all"].update(chosen="bogus"),
        "models.compute.devices.cpu.scaling.all.chosen: names no fitted law",
    ),
    (
        lambda d: d["models"]["jitter"].update(family="cauchy"),
        "models.jitter.family: unknown family 'cauchy'",
    ),
    (lambda d: _jitter_params(d, sigma=-1.0, scale=1.0), "models.jitter.params.sigma: must be"),
    (_reversed, "models.jitter.quantiles: must be step times over the median"),
    (lambda d: _jitter_scale(d, 3.0), "models.jitter.scale: must be from 0 to 2, got 3.0"),
]


@pytest.mark.parametrize(("damage", "culprit"), DAMAGES)
def test_a_damaged_profile_is_one_line_and_the_old_trace_survives(tmp_path, damage, culprit):
    """Each was taken: an empty section read as a model not measured (a step 16% slower for an
    empty drift), a thread count of 0 as a measured one, a jitter sigma of -1 as NaN draws
    (a ValueError traceback at 64 ranks), a confidence of 5 as a level, an unknown law or
    family named in a traceback's KeyError after the field last read."""
    doc = _profile()
    damage(doc)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    trace = tmp_path / "trace.json"
    trace.write_text(BEFORE)
    line = refused_here(
        "predict", "--nodes", "64", *FAST, "--profile", str(path), "--trace", str(trace)
    )
    assert culprit in line and str(path) in line, line
    assert trace.read_text() == BEFORE


def test_a_damaged_profile_leaves_a_sweeps_table_as_it_was(tmp_path):
    doc = _profile()
    _jitter_params(doc, sigma=-1.0, scale=1.0)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.csv").write_text(BEFORE)
    line = refused_here("sweep", "--nodes", "1,64", *FAST, "--profile", str(path), "--out",
                        str(out))  # fmt: skip
    assert "models.jitter.params.sigma: must be a number > 0, got -1.0" in line
    assert sorted(p.name for p in out.iterdir()) == ["sweep.csv"]
    assert (out / "sweep.csv").read_text() == BEFORE


def test_a_profile_built_in_a_script_is_checked_as_a_loaded_one():
    """A Profile made from its sections skipped every check: an empty one was an
    AttributeError traceback inside the cost model, a negative peak a prediction."""
    with pytest.raises(UserError, match=r"models\.collectives: missing model") as empty:
        pdlsim.predict("mlp", profile=Profile({}, {}), iterations=2, samples=2)
    doc = _profile()
    _cpu(doc)["threads"]["1"]["peak_flops_per_s"] = -1.0
    damaged = Profile(doc["machine"], doc["models"])
    with pytest.raises(UserError, match=r"threads\.1\.peak_flops_per_s: a throughput") as peak:
        pdlsim.predict("mlp", profile=damaged, iterations=2, samples=2)
    with pytest.raises(UserError, match=r"threads\.1\.peak_flops_per_s: a throughput"):
        pdlsim.sweep("mlp", nodes=[1, 2], profile=damaged, iterations=2, samples=2)
    for raised in (empty, peak):
        assert "\n" not in str(raised.value)
    good = load_profile("h100-16core")
    assert Profile(good.machine, good.models).checked().models is good.models


def test_validate_refuses_a_profile_of_gpus_alone_before_writing_anything(tmp_path):
    """It wrote the held-out workloads, printed warnings and notes, and then failed pricing
    the first CPU run, leaving a folder that the next try refused as a validation's."""
    doc = _profile()
    del doc["models"]["compute"]["devices"]["cpu"]
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "validation"
    line = refused_here("validate", "--quick", "--gpu", "off", "--profile", str(path), "--out",
                        str(out))  # fmt: skip
    assert f"--profile {path}: the profile measured compute on gpu, not on CPU ranks" in line
    assert not out.exists()


# ------------------------------------------------------------ damaged records
def _run(tmp_path: Path, jitter: bool = True, interference: bool = True) -> Path:
    """A run directory of synthetic records (made-up figures, not measurements) that the real
    modelers fit in a second: collectives, compute, jitter and interference."""
    run = tmp_path / "run"
    run.mkdir()
    rng = np.random.default_rng(0)
    with RecordWriter(run / "records.jsonl", {"hostname": "synthetic"}) as writer:
        _collectives(writer, rng)
        _compute(writer, rng)
        if jitter:
            _jitter(writer, rng)
    if interference:
        write_interference(run, seed=0, n=10)
    return run


def _edit(path: Path, record: Callable[[dict], dict] = lambda r: r,
          header: Callable[[dict], object] = lambda h: None) -> None:  # fmt: skip
    """Rewrite the records file ``path`` with ``header`` applied to its header and each
    measurement record replaced by ``record(it)``."""
    first, *rest = path.read_text().splitlines()
    doc = json.loads(first)
    header(doc)
    records = [json.loads(line) for line in rest]
    records = [record(r) if r["type"] == "measurement" else r for r in records]
    path.write_text("\n".join(json.dumps(r) for r in [doc, *records]) + "\n")


def _without(key: str, benchmark: str) -> Callable[[dict], dict]:
    def drop(record: dict) -> dict:
        if record["benchmark"] != benchmark:
            return record
        return {**record, "params": {k: v for k, v in record["params"].items() if k != key}}

    return drop


def _refused_calibration(run: Path, *flags: str) -> str:
    """The one line of ``calibrate --from run`` refused, its --out profile (there before)
    asserted to be as it was."""
    profile = run.parent / "profile.json"
    profile.write_text(BEFORE)
    line = refused_here("calibrate", "--from", str(run), "--out", str(profile), "--bootstrap",
                        "1", *flags)  # fmt: skip
    assert profile.read_text() == BEFORE
    return line


def test_jitter_samples_all_of_one_value_are_one_line_not_a_scipy_traceback(tmp_path):
    """scipy's gamma fit failed in its root finder ("The function value at x=inf is NaN")."""
    run = _run(tmp_path, jitter=False)
    with RecordWriter(run / "jitter.jsonl", {"hostname": "synthetic"}) as writer:
        base = {"model": "toy", "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
        for rank in range(2):
            params = {**base, "rank": rank, "statistic": "per_rank"}
            _write(writer, [0.01] * 50, "jitter", "step_compute", params)
    line = _refused_calibration(run)
    assert "fitting the jitter model: the 100 jitter samples are all exactly" in line


def test_a_bootstrap_resample_of_one_value_keeps_the_fit():
    """Samples nearly all one value: a resample that draws only it has no gamma fit, which
    failed the whole calibration with scipy's ValueError."""
    samples = np.array([1.0] * 49 + [1.001])
    model = JitterModel(families=("gamma",), n_boot=50).fit_samples([samples])
    assert model.family_ == "gamma"
    shape = model.intervals_["shape"]
    assert shape.low <= model.params_["shape"] <= shape.high


def test_a_run_without_interference_records_names_them(tmp_path):
    """The line was "new profile: models.overlap: must be an object, got NoneType"."""
    line = _refused_calibration(_run(tmp_path, interference=False))
    assert "has no interference records, which the overlap model needs" in line
    assert "python -m microbench interference" in line


@pytest.mark.parametrize(
    ("flag", "value"), [("--procs", "1,2"), ("--threads", "1"), ("--model", "mlp"),
                        ("--batch", "16")],
)  # fmt: skip
def test_a_benchmark_setting_with_from_is_refused_not_ignored(tmp_path, flag, value):
    line = _refused_calibration(_run(tmp_path), flag, value)
    assert f"{flag} sets the benchmarks calibrate runs" in line and f"drop {flag}" in line


def test_the_from_run_given_again_as_kernels_from_is_refused(tmp_path):
    run = _run(tmp_path)
    line = _refused_calibration(run, "--kernels-from", f"{run}/../run")
    assert f"--kernels-from {run}/../run is the run --from names already ({run})" in line


def test_samples_in_milliseconds_are_refused_naming_the_record(tmp_path):
    """Every fitter reads samples as seconds; a unit of "ms" was fitted a thousandfold off."""
    run = _run(tmp_path)
    _edit(run / "records.jsonl", lambda r: {**r, "unit": "ms"} if r["name"] == "gemm" else r)
    line = _refused_calibration(run)
    assert "records.jsonl:" in line and "(compute gemm): 'unit' must be 's'" in line


def test_a_copy_of_a_records_file_beside_it_is_refused(tmp_path):
    """Its samples were pooled twice, the fits' intervals narrower than measured."""
    run = _run(tmp_path)
    shutil.copy(run / "interference.jsonl", run / "interference (copy).jsonl")
    line = _refused_calibration(run)
    assert "interference.jsonl holds the same records as interference (copy).jsonl" in line


def test_records_without_a_field_their_fitter_reads_are_one_line(tmp_path):
    """A KeyError traceback from pandas ('params.flops')."""
    run = _run(tmp_path)
    _edit(run / "records.jsonl", _without("flops", "compute"))
    line = _refused_calibration(run)
    assert "fitting the compute model: no compute record holds 'params.flops'" in line


def test_a_step_record_without_its_batch_is_named_by_file_and_line(tmp_path):
    """The drift model keys steps by model, batch and threads: a cannot-convert-NaN traceback."""
    run = _run(tmp_path)
    with RecordWriter(run / "alone.jsonl", {"hostname": "synthetic"}) as writer:
        params = {"model": "toy", "threads": 1, "ranks": 1, "ranks_per_node": 1, "rank": 0,
                  "statistic": "per_rank"}  # fmt: skip
        steps = 0.01 * np.random.default_rng(1).lognormal(0.0, 0.05, 50)
        _write(writer, steps, "jitter", "step_compute", params)
    line = _refused_calibration(run)
    assert "fitting the drift model: alone.jsonl:2: " in line and "lacks params.batch" in line


def test_a_records_header_with_no_cores_is_named_before_the_fits(tmp_path):
    """It was named as "new profile: machine.logical_cores", after every fit."""
    run = _run(tmp_path)
    for name in ("interference.jsonl", "records.jsonl"):  # one machine still: all of them
        _edit(run / name, header=lambda h: h["machine"].update(logical_cores=0))
    line = _refused_calibration(run)
    assert f"{run}/interference.jsonl: machine.logical_cores: must be a whole number" in line
