"""``pdlsim validate --published``: every shipped row cited and predicted from the hardware
descriptions alone; rows that set an assumption or were seen while building kept out of the
held-out figures; bad tables and flag mixes refused in one line."""

from __future__ import annotations

import json

import pytest

from microbench.errors import UserError
from pdlsim.cli.main import main
from pdlsim.validate.published import PUBLISHED, score_published


@pytest.fixture(scope="module")
def scored() -> dict:
    return score_published()


def test_every_row_cites_where_its_figure_is():
    rows = json.loads(PUBLISHED.read_text())["rows"]
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["source"]["url"].startswith("https://")
        assert row["source"]["cite"] and row["source"]["figure"]
        assert row["published"] > 0


def test_rows_are_scored_by_group_and_predicted_as_pdlsim_collective_answers(scored, capsys):
    doc = scored
    groups = {r["id"]: r["group"] for r in doc["rows"]}
    assert groups["h100x8-nvls"] == "set an assumption" and groups["h200x8"] == "held-out"
    held = [r for r in doc["rows"] if r["group"] == "held-out"]
    assert doc["summary"]["held-out"]["rows"] == len(held)
    worst = max(abs(r["error_pct"]) for r in held)
    assert doc["summary"]["held-out"]["worst_abs_error_pct"] == pytest.approx(worst)
    row = next(r for r in doc["rows"] if r["id"] == "h200x8")
    assert row["what"] == "allreduce 4294967296 B" and row["unit"] == "GB/s"
    main(["collective", "allreduce", "--node", "hgx-h200", "--size", "4294967296", "--json"])
    answer = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["predicted"] == pytest.approx(answer["busbw_GBps"])


def test_the_command_prints_the_table_and_the_verdict(scored, capsys, monkeypatch):
    """The command prints the scored table (the module's scoring, once for all its tests)."""
    import pdlsim.validate.published as published

    monkeypatch.setattr(published, "score_published", lambda path=None: scored)
    assert main(["validate", "--published"]) == 0
    out = capsys.readouterr().out
    assert "held-out:" in out and "target (held-out)" in out and "h200x8" in out
    assert main(["validate", "--published", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--published", "--quick"], "--quick is for training runs"),
        (["--published", "--models", "mlp"], "--models is for training runs"),
        (["--json"], "--json is for --published"),
    ],
)
def test_flags_that_do_not_mix_are_refused(capsys, argv, message):
    assert main(["validate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_users_own_table_is_scored_and_a_missing_one_is_one_line(tmp_path, capsys):
    """--published FILE scores a table of one's own measurements as the shipped one is."""
    row = next(r for r in json.loads(PUBLISHED.read_text())["rows"] if r["id"] == "h200x8")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"rows": [{**row, "id": "ours", "published": 400.0}]}))
    assert main(["validate", "--published", str(path), "--json"]) == 0
    (ours,) = json.loads(capsys.readouterr().out)["rows"]
    shipped = next(r for r in score_published()["rows"] if r["id"] == "h200x8")
    assert ours["id"] == "ours" and ours["predicted"] == pytest.approx(shipped["predicted"])
    assert ours["error_pct"] == pytest.approx(100 * (ours["predicted"] - 400) / 400)
    assert main(["validate", "--published", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "none.json" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_table_is_one_line(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"rows": [{"id": "x", "kind": "alltoall"}]}))
    with pytest.raises(UserError, match="unknown kind 'alltoall'"):
        score_published(path)
    row = next(r for r in json.loads(PUBLISHED.read_text())["rows"] if "grad_accum" in r)
    path.write_text(json.dumps({"rows": [{**row, "grad_accum": "many"}]}))
    with pytest.raises(UserError, match=f"row {row['id']}: missing or malformed field"):
        score_published(path)
    path.write_text("[]")
    with pytest.raises(UserError, match="expected an object with a 'rows' list"):
        score_published(path)


def test_a_training_row_is_the_prediction_from_its_single_gpu_figure(scored):
    from pdlsim import api

    doc = scored
    rows = json.loads(PUBLISHED.read_text())["rows"]
    spec = next(r for r in rows if r["kind"] == "training_throughput")
    row = next(r for r in doc["rows"] if r["id"] == spec["id"])
    step_ms = 1e3 * spec["batch"] / spec["single_gpu_samples_per_s"]
    out = api.predict(spec["model"], api.Cluster.gpus(spec["nodes"], spec["gpus_per_node"]),
                      batch=spec["batch"], node=spec["node"], precision=spec["precision"],
                      optimizer=spec["optimizer"], step_time=f"{step_ms!r}ms",
                      samples=20)  # fmt: skip
    assert row["predicted"] == pytest.approx(out["throughput_samples_per_s"])
    assert row["unit"] == "samples/s" and row["group"] == "held-out"


def test_an_accumulating_row_is_predicted_at_its_tokens_with_one_allreduce_per_update(scored):
    """A BERT row: the network at the row's sequence length, its single-GPU figure the time per
    micro-batch, an optimizer step of ``grad_accum`` micro-batches per GPU."""
    from microbench.workload import Workload
    from pdlsim import api

    rows = json.loads(PUBLISHED.read_text())["rows"]
    spec = next(r for r in rows if r.get("grad_accum", 1) > 1 and "tokens" in r)
    row = next(r for r in scored["rows"] if r["id"] == spec["id"])
    step_ms = 1e3 * spec["batch"] / spec["single_gpu_samples_per_s"]
    workload = Workload.load(spec["model"]).with_tokens(spec["tokens"])
    out = api.predict(workload, api.Cluster.gpus(spec["nodes"], spec["gpus_per_node"]),
                      batch=spec["batch"], node=spec["node"], gpu_preset=spec["gpu"],
                      precision=spec["precision"], optimizer=spec["optimizer"],
                      grad_accum=spec["grad_accum"], step_time=f"{step_ms!r}ms", samples=4,
                      step_time_accum=spec.get("single_gpu_grad_accum", spec["grad_accum"]),
                      dataset_samples=10**7)  # fmt: skip
    assert row["predicted"] == pytest.approx(out["throughput_samples_per_s"], rel=1e-9)
    assert out["samples_per_step"] == spec["batch"] * row["gpus"] * spec["grad_accum"]
    assert f"s{spec['tokens']}" in row["what"]
