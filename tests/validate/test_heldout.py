"""Held-out sets: random workloads from a seed, batches the calibration never ran, and a
validation whose profile cannot have seen them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from microbench import randomnets
from microbench.errors import UserError
from microbench.randomnets import MAX_FORWARD_FLOPS_PER_SAMPLE, random_workloads
from microbench.workload import WorkloadError, load_workload
from pdlsim.costmodel.corrections import CORRECTIONS, parse_corrections
from pdlsim.validate.report import HELDOUT, IN_SAMPLE, ablation, summarize
from pdlsim.validate.run import (
    RunSpec,
    ValidateConfig,
    ablation_sets,
    check_unseen,
    heldout_matrix,
    mark_unseen,
)
from tests.conftest import run_pdlsim
from tests.profiles import STEP_TABLES

PROFILE = str(STEP_TABLES)


def test_random_workloads_are_valid_bounded_and_drawn_from_the_seed():
    first = random_workloads(11, 12)
    assert [w.to_dict() for w in first] == [w.to_dict() for w in random_workloads(11, 12)]
    assert [w.to_dict() for w in first] != [w.to_dict() for w in random_workloads(12, 12)]
    kinds = [w.name.split("-")[0] for w in first]
    assert kinds == ["mlp", "cnn"] * 6
    for w in first:
        assert w.forward_flops_per_sample <= MAX_FORWARD_FLOPS_PER_SAMPLE[w.name[:3]]
        assert w.layers[-1].kind == "softmax_cross_entropy" and w.param_count > 0
    cnn_kernels = {i.layer.get("kernel") for w in random_workloads(1, 40) for i in w.layers
                   if i.kind == "conv2d"}  # fmt: skip
    assert len(cnn_kernels) >= 3  # the layer kinds' settings vary, not just the widths


def test_random_residual_cnns_are_graphs_with_skips_bounded_and_drawn_from_the_seed():
    drawn = random_workloads(7, 12, kinds=("res",))
    assert [w.to_dict() for w in drawn] == [w.to_dict() for w in random_workloads(7, 12, ("res",))]
    for w in drawn:
        assert not w.is_chain and any(i.kind == "add" for i in w.layers)
        assert w.forward_flops_per_sample <= MAX_FORWARD_FLOPS_PER_SAMPLE["res"]
    kinds = {i.kind for w in drawn for i in w.layers}
    assert {"maxpool2d", "avgpool2d", "global_avgpool", "flatten"} <= kinds


def test_random_transformers_are_attention_graphs_bounded_and_drawn_from_the_seed():
    """Random transformers vary what the step model prices: heads, causal masks, pre- and
    post-layernorm, MLP width, pooled and language-model heads, tied embeddings."""
    drawn = random_workloads(5, 24, kinds=("tfm",))
    assert [w.to_dict() for w in drawn] == [w.to_dict() for w in random_workloads(5, 24, ("tfm",))]
    for w in drawn:
        assert not w.is_chain and w.layers[0].kind == "embedding"
        assert any(i.kind == "attention" for i in w.layers)
        assert w.forward_flops_per_sample <= MAX_FORWARD_FLOPS_PER_SAMPLE["tfm"]
    layers = [x for w in drawn for x in w.to_dict()["layers"]]
    assert {x["kind"] for x in layers} >= {
        "layernorm", "gelu", "add", "token_pool", "softmax_cross_entropy", "token_cross_entropy"
    }  # fmt: skip
    assert {bool(x.get("causal")) for x in layers if x["kind"] == "attention"} == {True, False}
    assert {x.get("heads") for x in layers if x["kind"] == "attention"} >= {1, 2, 4, 8}
    assert any("tied_to" in x for x in layers) and any(
        x["kind"] == "dense" and x["name"] == "lm_head" and "tied_to" not in x for x in layers
    )


def test_a_draw_that_can_never_pass_ends_in_one_line(monkeypatch):
    """Every draw refused (here a name no workload may have): a WorkloadError naming why after
    MAX_DRAWS tries, not a loop that never ends."""
    monkeypatch.setattr(randomnets, "MAX_DRAWS", 20)
    with pytest.raises(WorkloadError, match=r"no mlp network drawn in 20 tries; the last: .*/"):
        random_workloads(np.random.default_rng(0), 1, prefix="bad/name")


def test_the_heldout_matrix_never_uses_a_calibrated_batch(tmp_path: Path):
    cfg = ValidateConfig(out=tmp_path, heldout_workloads=4, heldout_batches=2, seed=3)
    specs, refused = heldout_matrix(cfg, cores=2)
    assert specs and all(s.heldout for s in specs)
    stems = {Path(s.model).stem.split("-")[0] for s in specs}
    assert stems == {"mlp", "cnn", "res", "tfm"}  # chains, residual graphs and attention
    assert not {s.batch for s in specs} & set(cfg.batches)
    assert max(s.batch for s in specs) <= 4 * max(cfg.batches)
    assert all(s.procs * s.threads <= 2 for s in specs)
    assert len(refused) == 2 and all("cores" in line for line in refused)  # 2x2, 4x1
    assert any(s.parallel == "model" for s in specs)
    for path in {s.model for s in specs}:
        assert load_workload(path).name == Path(path).stem


def test_a_profile_that_measured_a_heldout_batch_or_workload_is_refused(tmp_path: Path):
    doc = json.loads(Path(PROFILE).read_text())
    measured = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "batch":
                    measured.add(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc["models"])
    assert measured  # the packaged profile's op and jitter tables are keyed by batch
    unseen = next(b for b in (24, 48, 96) if b not in measured)
    check_unseen(PROFILE, [RunSpec(str(tmp_path / "mlp-s0-0.json"), 1, 1, unseen, heldout=True)])
    with pytest.raises(UserError, match="not held out"):
        check_unseen(PROFILE, [RunSpec("x.json", 1, 1, sorted(measured)[0], heldout=True)])
    with pytest.raises(UserError, match="not held out"):
        check_unseen(PROFILE, [RunSpec("mlp", 1, 1, unseen, heldout=True)])  # its name


def test_a_named_workload_the_calibration_never_ran_is_held_out_at_an_unseen_batch():
    """--models rescnn: held out at a batch the profile never measured, in-sample at one it
    did; a calibrated workload is in-sample at any batch."""
    specs = [RunSpec("rescnn", 1, 1, 24), RunSpec("rescnn", 1, 1, 16), RunSpec("mlp", 1, 1, 24)]
    assert [s.heldout for s in mark_unseen(PROFILE, specs)] == [True, False, False]
    check_unseen(PROFILE, [s for s in mark_unseen(PROFILE, specs) if s.heldout])


def test_validate_refuses_to_split_a_graph_layer_wise(tmp_path):
    done = run_pdlsim("validate", "--models", "rescnn", "--out", str(tmp_path / "v"))
    assert done.returncode == 2 and "a graph is not split layer-wise" in done.stderr
    assert "--parallel data" in done.stderr and not (tmp_path / "v").exists()


def test_corrections_parse_and_ablations_take_each_out():
    assert parse_corrections("all") == frozenset(CORRECTIONS)
    assert parse_corrections("none") == frozenset()
    assert parse_corrections("glue, colocation") == {"glue", "colocation"}
    with pytest.raises(UserError, match="unknown correction"):
        parse_corrections("glue,magic")
    for text in ("glue,,interplay", "glue,", ","):  # a typo, not a shorter list
        with pytest.raises(UserError, match="has an empty name"):
            parse_corrections(text)
    with pytest.raises(UserError, match="names pace more than once"):
        parse_corrections("pace,glue,pace")
    sets = ablation_sets("all")
    assert {"all", "none"} <= set(sets) and len(sets) == 2 + len(CORRECTIONS)
    assert parse_corrections(sets["all - glue"]) == frozenset(CORRECTIONS) - {"glue"}
    assert set(ablation_sets("glue")) == {"glue", "none", "all"}


def _row(kind: str, measured: float, p50: float, over: bool = False) -> dict:
    return {"set": kind, "model": "m", "procs": 1, "threads": 1, "batch": 8, "parallel": "data",
            "inference": False, "oversubscribed": over, "measured_s": measured,
            "predicted_p50_s": p50, "predicted_p10_s": 0.9 * p50, "predicted_p90_s": 1.1 * p50,
            "rel_error": abs(p50 - measured) / measured,
            "in_band": 0.9 * p50 <= measured <= 1.1 * p50}  # fmt: skip


def test_summaries_keep_heldout_and_in_sample_apart_and_rescore_each_correction_set():
    rows = [_row(HELDOUT, 1.0, 1.05), _row(HELDOUT, 1.0, 1.5), _row(IN_SAMPLE, 2.0, 2.0),
            _row(HELDOUT, 1.0, 9.0, over=True)]  # fmt: skip
    summary = summarize(rows)
    assert summary[HELDOUT]["configurations"] == 2  # the oversubscribed row is not scored
    assert summary[HELDOUT]["worst_rel_error"] == pytest.approx(0.5)
    assert summary[IN_SAMPLE]["median_rel_error"] == 0.0
    assert summary[HELDOUT]["median_band_width"] == pytest.approx(0.2)
    other = [{"band": {"p50_s": 1.0, "p10_s": 0.5, "p90_s": 2.0}} for _ in rows]
    table = ablation(rows, {"none": other}, "all")
    assert [t["corrections"] for t in table] == ["all", "none"]
    assert table[1][HELDOUT]["median_rel_error"] == 0.0
    assert table[1][IN_SAMPLE]["median_rel_error"] == pytest.approx(0.5)
    again = ablation(rows, {"all": other, "none": other}, "all")  # the chosen set redrawn too
    assert [t["corrections"] for t in again] == ["all", "none"]
    assert again[0] == {**table[1], "corrections": "all"}
