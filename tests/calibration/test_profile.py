"""The profile: round trip, loading by name, and one clear line for every kind of corruption."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from pathlib import Path

import pytest

import calibration.profile as profile_module
from calibration import profile_schema
from calibration.compute import ComputeModel
from calibration.jitter import JitterModel
from calibration.overlap import OverlapModel
from calibration.profile import (
    SCHEMA_VERSION,
    Profile,
    ProfileError,
    load_profile,
    read_sources,
)
from calibration.profile_checks import ITEM, OTHER, check_tree
from calibration.profile_schema import reference_fields
from microbench.errors import UserError
from microbench.records import load_dataframe, read_records
from pdlsim.cli.main import main
from tests.calibration.test_compute_model import write_records
from tests.calibration.test_jitter_model import lognormal_table, write_jitter
from tests.calibration.test_overlap_model import write_interference

COLLECTIVES = {  # the shape calibration.communication.CollectiveModels writes
    "model": "collectives",
    "collectives": {
        "allreduce": {
            "model": "collective_algorithms",
            "op": "allreduce",
            "regimes": [
                {
                    "min_bytes": 8,
                    "max_bytes": 1 << 20,
                    "algorithm": "ring",
                    "a_s": 2e-6,
                    "b_s_per_byte": 1e-10,
                    "g_s_per_byte": 0.0,
                    "intervals": {
                        "a_s": {"low": 1.5e-6, "high": 2.5e-6, "confidence": 0.95},
                        "b_s_per_byte": {"low": 0.9e-10, "high": 1.1e-10, "confidence": 0.95},
                    },
                }
            ],
            "hockney": [
                {
                    "ranks": 2,
                    "fit": {
                        "regimes": [
                            {
                                "alpha_s": 2e-6,
                                "beta_s_per_byte": 1e-10,
                                "alpha_ci": {"low": 1e-6, "high": 3e-6, "confidence": 0.95},
                                "beta_ci": None,
                            }
                        ]
                    },
                }
            ],
        }
    },
    "skipped": {},
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("records")
    write_records(path, seed=0, threads=(1, 2), speedup=lambda n: n**0.9)
    write_jitter(path, lognormal_table(0, ranks=2, n=200))
    write_interference(path, seed=0)
    return path


@pytest.fixture(scope="module")
def profile(records):
    df = load_dataframe(records)
    models = {
        "collectives": COLLECTIVES,
        "compute": ComputeModel(n_boot=10).fit(df),
        "transfer": None,
        "jitter": JitterModel(n_boot=20).fit(df),
        "overlap": OverlapModel(n_boot=20).fit(df),
    }
    machine, sources = read_sources([records])
    return Profile.from_models(models, machine, sources, fit_quality={"collectives": {}})


def test_round_trip_save_load_equal(profile, tmp_path):
    path = profile.save(tmp_path / "profile.json")
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.schema_version == SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left
    assert loaded.model("transfer") is None
    assert loaded.model("jitter").expected_max_factor(64) == pytest.approx(
        JitterModel.from_dict(profile.models["jitter"]).expected_max_factor(64)
    )
    compute = loaded.model("compute")
    assert compute.op_time("dense0", "forward", 32, threads=2) > 0
    assert set(loaded.fit_quality) == {"collectives", "compute", "jitter", "overlap"}


def test_a_profile_file_is_parsed_and_built_once_per_version(profile, tmp_path):
    path = profile.save(tmp_path / "profile.json")
    loaded = load_profile(path)
    compute = loaded.model("compute")
    assert loaded.model("compute") is compute  # shared by every caller of this profile
    assert load_profile(path) is loaded  # the file unchanged: not read again
    path.write_text(path.read_text() + "\n")  # a new version of the file
    again = load_profile(path)
    assert again == loaded and again is not loaded and again.model("compute") is not compute


def test_sources_pin_the_records(profile, records):
    by_name = {Path(s.path).name: s for s in profile.sources}
    assert sorted(by_name) == ["compute.jsonl", "interference.jsonl", "jitter.jsonl"]
    assert by_name["jitter.jsonl"].benchmark == "jitter,timer"
    assert by_name["compute.jsonl"].records == len(read_records(records / "compute.jsonl")[1])
    digest = hashlib.sha256((records / "interference.jsonl").read_bytes()).hexdigest()
    assert by_name["interference.jsonl"].sha256 == digest
    assert profile.machine["hostname"] == "test"


def test_load_by_name_from_packaged_profiles(profile, tmp_path, monkeypatch):
    profile.save(tmp_path / "reference-cpu.json")
    monkeypatch.setattr(profile_module, "_profiles_dir", lambda: tmp_path)
    assert profile_module.packaged_profile_names() == ["reference-cpu"]
    assert load_profile("reference-cpu") == profile
    with pytest.raises(UserError, match="packaged: reference-cpu"):
        load_profile("nonesuch")


def test_missing_file_and_directory_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_profile(tmp_path / "absent.json")
    with pytest.raises(UserError, match="is a directory"):
        load_profile(tmp_path)


def _set(doc, path, value):
    *head, last = path
    for key in head:
        doc = doc[key]
    if value is _DELETE:
        del doc[last]
    else:
        doc[last] = value


_DELETE = object()
_CPU1 = ("models", "compute", "devices", "cpu", "threads", "1")
_REGIME = ("models", "collectives", "collectives", "allreduce", "regimes", 0)
_HOCKNEY = (*_REGIME[:4], "hockney", 0, "fit", "regimes", 0)

_SOURCE = {"path": "r.jsonl", "benchmark": "compute", "records": 3, "sha256": "0" * 64}
CORRUPTIONS = {
    "wrong schema": (("schema",), "pdlsim.other", "schema", "not a profile; give one pdlsim"),
    "unknown version": (("schema_version",), 2, "schema_version", "reads 1); calibrate again"),
    "missing model": (("models", "jitter"), _DELETE, "models.jitter", "missing model"),
    "missing field": (("models", "compute", "devices"), _DELETE, "models.compute.devices", ""),
    "model not an object": (("models", "transfer"), 5, "models.transfer", "object or null"),
    "negative bandwidth": (
        (*_CPU1, "bandwidth_bytes_per_s"),
        -2e10,
        "models.compute.devices.cpu.threads.1.bandwidth_bytes_per_s",
        "must be > 0",
    ),
    "zero peak": (
        (*_CPU1, "peak_flops_per_s"),
        0.0,
        "models.compute.devices.cpu.threads.1.peak_flops_per_s",
        "must be > 0",
    ),
    "negative latency": (
        (*_REGIME, "a_s"),
        -1e-6,
        "models.collectives.collectives.allreduce.regimes[0].a_s",
        "must be >= 0",
    ),
    "nan": (("models", "jitter", "median_s"), math.nan, "models.jitter.median_s", "finite"),
    "infinity": (
        ("fit_quality", "jitter", "r2"),
        math.inf,
        "fit_quality.jitter.r2",
        "finite",
    ),
    "interval misses value": (
        ("models", "jitter", "params", "intervals", "sigma"),
        {"low": 10.0, "high": 20.0},
        "models.jitter.params.intervals.sigma",
        "does not contain",
    ),
    "ci misses value": (
        (*_HOCKNEY, "alpha_ci"),
        {"low": 1.0, "high": 2.0},
        "regimes[0].alpha_ci",
        "does not contain",
    ),
    # a source's count of records was read with int(): tracebacks for these
    "source records null": (("sources",), [_SOURCE | {"records": None}], "sources[0].records", ""),
    "source records text": (("sources",), [_SOURCE | {"records": "7"}], "sources[0].records", ""),
    "source records inf": (
        ("sources",),
        [_SOURCE | {"records": math.inf}],
        "sources[0].records",
        "whole number",
    ),  # fmt: skip
    "source path number": (("sources",), [_SOURCE | {"path": 5}], "sources[0].path", "string"),
    "table interval reversed": (
        ("models", "compute", "table", 0, "time_s_interval"),
        {"low": 2.0, "high": 1.0},
        "models.compute.table[0].time_s_interval",
        "above high",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_profiles_fail_with_one_line_naming_the_field(profile, tmp_path, case):
    path, value, field, problem = CORRUPTIONS[case]
    doc = copy.deepcopy(profile.to_dict())
    _set(doc, path, value)
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(doc))  # NaN and Infinity as Python's writer spells them
    with pytest.raises(UserError) as info:
        load_profile(file)
    message = str(info.value)
    assert isinstance(info.value, ProfileError)
    assert "\n" not in message
    assert message.startswith(str(file))
    assert field in message and problem in message


def test_not_json_is_one_line(tmp_path):
    file = tmp_path / "bad.json"
    file.write_text('{"schema": "pdlsim.profile",\n "models": ')
    with pytest.raises(UserError, match=r"bad\.json: not JSON \(line 2") as info:
        load_profile(file)
    assert "\n" not in str(info.value)


def test_nonsense_cannot_be_saved(profile, tmp_path):
    doc = copy.deepcopy(profile.to_dict())
    doc["models"]["jitter"]["median_s"] = -1.0
    with pytest.raises(ProfileError, match="models.jitter.median_s"):
        Profile.from_models(doc["models"], profile.machine)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("tree", "field", "problem"),
    [
        ({"wait_s": [0.1, -0.2, 0.3]}, "m.wait_s[1]", "a time must be >= 0"),
        ({"link_bytes_per_s": [2e9, 0.0]}, "m.link_bytes_per_s[1]", "a throughput must be > 0"),
        ({"speedup": [1.0, float("nan")]}, "m.speedup[1]", "nan is not a finite number"),
        ({"speedup": [1.0, True]}, "m.speedup[1]", "unexpected value of type bool"),
        # a table of rows, which passes as one check where nothing in it can fail
        ({"points_s": [[1, 2.0]] * 3 + [[1, -2.0]]}, "m.points_s[3][1]", "a time must be >= 0"),
        ({"points_s": [[1, 2.0], [1, 1e19]]}, "m.points_s[1][1]", "1e+19 is past any"),
        ({"points_s": [[1, 2.0], [1, True]]}, "m.points_s[1][1]", "unexpected value of type"),
        ({"points_s": [[1, 2.0], [1, math.inf]]}, "m.points_s[1][1]", "inf is not a finite"),
    ],
)
def test_a_bad_value_in_a_list_of_numbers_is_named_by_its_index(tree, field, problem):
    with pytest.raises(ProfileError, match=re.escape(f"{field}: {problem}")):
        check_tree("p.json", tree, "m")
    check_tree("p.json", {key: [1.0, 2.0] for key in tree}, "m")


def test_a_table_of_rows_marks_the_example_trie_as_its_rows_one_by_one_would():
    rows = [[1, 2.5, 3], [4, 5.0, 6]]
    fast: dict = {}
    profile_schema._grow(fast, {"t": rows})
    slow: dict = {}
    for row in rows:  # each row grown alone: a list of numbers
        profile_schema._grow(slow.setdefault("t", {OTHER: True}).setdefault(ITEM, {}), row)
    assert fast == {OTHER: True, **slow}
    with pytest.raises(ProfileError, match=re.escape("m.t[1][0]: expected a number")):
        check_tree("p.json", {"t": [[1.0], ["x"]]}, "m", example=fast)


def test_packaged_profiles_pass_the_check_by_example_so_loading_them_by_name_skips_it():
    reference_fields.cache_clear()
    for name in profile_module.packaged_profile_names():
        profile_module._parsed.cache_clear()
        load_profile(name)
        assert reference_fields.cache_info().currsize == 0  # the packaged profiles not read
    for name in profile_module.packaged_profile_names():  # each passes the check it skips
        path = Path(profile_module.__file__).parent / "profiles" / f"{name}.json"
        Profile.from_dict(json.loads(path.read_text()), name, by_example=True)


def test_an_unknown_model_section_is_named_and_a_retired_one_is_read_past(profile, tmp_path):
    """A misspelt section ("colocaton") would leave its model out of every prediction, so it
    is refused in one line; sections earlier versions wrote ("insitu") still load."""
    doc = copy.deepcopy(profile.to_dict())
    doc["models"]["colocaton"] = {"points": {}}
    file = tmp_path / "typo.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=re.escape("models.colocaton: unknown model section")):
        load_profile(file)
    del doc["models"]["colocaton"]
    doc["models"]["insitu"] = {"points": []}
    file.write_text(json.dumps(doc))
    assert "insitu" in load_profile(file).models


_LOOP = ("models", "kernels", "loops", "adam", "2", "curves", 0)
_PACKAGED_DAMAGE = {  # each passed loading and failed deep inside a prediction
    "a list for a method's name": (
        ("models", "overlap", "points", 0, "method"),
        [],
        "models.overlap.points[0].method: expected a string, got list",
    ),
    "a number for a method's name": (
        ("models", "overlap", "points", 0, "method"),
        -1e-9,
        "models.overlap.points[0].method: expected a string, got float",
    ),
    "a run of 1e300": ((*_LOOP, "run"), 1e300, "curves[0].run: 1e+300 is past any measured"),
    "a size of 1e300": ((*_LOOP, "elements", 0), 1e300, "elements[0]: 1e+300 is past any"),
    "half a run": ((*_LOOP, "run"), 0.5, "loops.adam.2.curves[0].run: a run is a whole number"),
    "a median of 0": (
        ("models", "drift", "medians_s", "mlp-b16-t1", "check 2 of 4"),
        0,
        "models.drift.medians_s.mlp-b16-t1.check 2 of 4: a median time must be > 0, got 0",
    ),
    "a median of text": (  # the packaged profiles only hold numbers there
        ("models", "drift", "medians_s", "mlp-b16-t1", "compute step"),
        "fast",
        'medians_s.mlp-b16-t1.compute step: expected a number, got "fast"',
    ),
}


@pytest.mark.parametrize("case", sorted(_PACKAGED_DAMAGE))
def test_a_damaged_packaged_profile_is_one_line_before_any_simulation(tmp_path, capsys, case):
    """A hand-edited copy of a packaged profile: a value of the wrong kind where the packaged
    profiles only hold strings, a number past any measurement, or a median of zero (divided
    by) is refused in one line naming the field, exit status 2, not a TypeError or a
    ZeroDivisionError from the model that reads it."""
    path, value, message = _PACKAGED_DAMAGE[case]
    packaged = Path(profile_module.__file__).parent / "profiles" / "xeon-2core.json"
    doc = json.loads(packaged.read_text())
    _set(doc, path, value)
    file = tmp_path / "edited.json"
    file.write_text(json.dumps(doc))
    argv = ["predict", "--nodes", "2", "--profile", str(file), "--iterations", "3"]
    assert main([*argv, "--samples", "2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("pdlsim: error: ") and f"{file}: models." in err, err
    assert message in err, err


def test_an_unknown_top_level_field_is_named(profile, tmp_path):
    """A misspelt top-level field ("fit_qualty") was read past, and dropped at the next save."""
    doc = copy.deepcopy(profile.to_dict())
    doc["fit_qualty"] = {}
    file = tmp_path / "typo.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=re.escape("fit_qualty: unknown field; a profile holds")):
        load_profile(file)
