"""calibration.extrap: the Extra-P JSON Lines export, checked against the documented format.

Extra-P's docs/file-formats.md ("JSON Lines format") documents one object per line with a
required ``params`` object and ``value``, optional ``callpath`` and ``metric``, as in its test
data (tests/data/jsonlines/extended1.jsonl)::

    {"params":{"x":1,"y":1},"metric":"metr","callpath":"test","value":2}

Its reader takes the parameter names and order from the first line and its validation wants
every callpath at every coordinate; :func:`read_like_extrap` does the same.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from calibration.extrap import export_extrap
from calibration.formulas import DEFAULT_ALGORITHM, cost
from calibration.stats import FitError
from tests.train.synthetic_comm import collective_params, points_frame, write_records

DOCUMENTED = '{"params":{"x":1,"y":1},"metric":"metr","callpath":"test","value":2}'


def truth(op):
    return lambda p, q, n: cost(op, DEFAULT_ALGORITHM[op], p, n, 5e-6, 1e-10)


def read_like_extrap(path):
    """Parse as Extra-P's jsonlines reader does: {(callpath, metric): {coordinate: values}}."""
    data: dict = defaultdict(lambda: defaultdict(list))
    parameters = None
    for line in open(path, encoding="utf-8"):
        if line.isspace():
            continue
        record = json.loads(line)
        if parameters is None:
            parameters = list(record["params"])
        coordinate = tuple(record["params"][p] for p in parameters)
        data[(record.get("callpath"), record.get("metric"))][coordinate].append(record["value"])
    coordinates = {c for by_coordinate in data.values() for c in by_coordinate}
    for key, by_coordinate in data.items():  # Extra-P's validate_experiment
        assert set(by_coordinate) == coordinates, key
    return parameters, data


@pytest.fixture
def frame():
    sizes = [8, 1024, 65536]
    return pd.concat(
        [
            points_frame("allreduce", [(2, 2), (4, 4)], truth("allreduce"), sizes, count=5),
            points_frame("bcast", [(2, 2), (4, 4)], truth("bcast"), sizes, seed=1, count=7),
            points_frame("barrier", [(2, 2), (4, 4)], truth("barrier"), [0], count=3),
        ],
        ignore_index=True,
    )


def test_lines_have_the_documented_keys(tmp_path, frame):
    path = tmp_path / "comm.jsonl"
    lines_written = export_extrap(frame, path)
    lines = path.read_text().splitlines()
    assert lines_written == len(lines) == 2 * 3 * 5 + 2 * 3 * 7  # one line per raw sample
    documented = json.loads(DOCUMENTED)
    for line in lines:
        record = json.loads(line)
        assert set(record) == set(documented)
        assert list(record["params"]) == ["p", "n"]
        assert all(type(v) is int for v in record["params"].values())
        assert isinstance(record["value"], float) and record["metric"] == "time"


def test_extrap_reads_back_every_sample(tmp_path, frame):
    path = tmp_path / "comm.jsonl"
    export_extrap(frame, path)
    parameters, data = read_like_extrap(path)
    assert parameters == ["p", "n"]
    assert set(data) == {("allreduce", "time"), ("bcast", "time")}  # no barrier by default
    row = frame[(frame.op == "bcast") & (frame.ranks == 4) & (frame.bytes == 1024)].iloc[0]
    assert np.array_equal(data[("bcast", "time")][(4, 1024)], row.samples)


def test_only_shared_points_are_written(tmp_path, frame):
    extra = points_frame("allreduce", [(8, 8)], truth("allreduce"), [8, 1024, 65536], count=5)
    path = tmp_path / "comm.jsonl"
    with pytest.warns(UserWarning, match="left out 3 points"):
        export_extrap(pd.concat([frame, extra], ignore_index=True), path)
    _, data = read_like_extrap(path)
    assert (8, 8) not in data[("allreduce", "time")]


def test_chosen_ops_and_errors(tmp_path, frame):
    path = tmp_path / "barrier.jsonl"
    assert export_extrap(frame, path, ops=["barrier"]) == 2 * 3
    assert {json.loads(x)["params"]["n"] for x in path.read_text().splitlines()} == {0}
    with pytest.raises(FitError, match="allgather"):
        export_extrap(frame, tmp_path / "x.jsonl", ops=["allgather"])


def test_export_from_records(tmp_path, frame):
    records = write_records(tmp_path / "c.jsonl", "collectives", frame, collective_params)
    path = tmp_path / "comm.jsonl"
    assert export_extrap(records, path) == export_extrap(frame, tmp_path / "direct.jsonl")
    assert path.read_text() == (tmp_path / "direct.jsonl").read_text()
