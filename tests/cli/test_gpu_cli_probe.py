"""Bad input found by a fault probe of the GPU-cluster side of the command line (``predict
--gpus``, ``collective``, ``hardware``, ``validate --published``) and of the Python API that
takes the same values: each is one line on stderr starting ``pdlsim: error:`` that names the
culprit, exit status 2, no traceback; and a preset's name means the preset whatever the
working directory holds."""

from __future__ import annotations

import json

import pytest

from microbench.errors import UserError
from pdlsim import api
from pdlsim.costmodel.presets import HARDWARE
from pdlsim.validate import published
from tests.conftest import pdlsim_here, refused_here

FAST = ["--iterations", "2", "--samples", "2"]
GPU = ["predict", "--nodes", "2", "--gpus", "8", *FAST]


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def _fields(name: str) -> dict:
    """A packaged preset's fields as a ``--hardware`` section holds them (keyed, no name)."""
    _, fields = HARDWARE.entry(name)
    fields.pop("name")
    return fields


# ------------------------------------------------------------ names against the working folder
@pytest.mark.parametrize(
    "args",
    [GPU, ["collective", "allreduce", "--nodes", "2", "--size", "1G"],
     ["predict", "--nodes", "2", *FAST]],
)  # fmt: skip
def test_folders_named_like_the_default_presets_do_not_stand_in_for_them(
    tmp_path, monkeypatch, args
):
    """A folder called dgx-h100 (or ib-ndr, h100-sxm, xeon-2core) in the working folder was
    read as --node dgx-h100 and refused every GPU prediction and collective given no --node;
    a file called ib-ndr was read as the node's network."""
    for name in ("dgx-h100", "h100-sxm", "xeon-2core"):
        (tmp_path / name).mkdir()
    (tmp_path / "ib-ndr").write_text("notes of my ib-ndr runs\n")
    monkeypatch.chdir(tmp_path)
    result = pdlsim_here(*args)
    assert result.returncode == 0, result.stderr


def test_a_preset_named_on_its_flag_is_the_preset_beside_a_file_of_that_name(tmp_path, monkeypatch):
    """A file h100-sxm holding another GPU's figures was priced as --gpu-preset h100-sxm."""
    _write(tmp_path / "h100-sxm", {**_fields("h200"), "memory_bytes": 2**20})
    monkeypatch.chdir(tmp_path)
    result = pdlsim_here(*GPU, "--gpu-preset", "h100-sxm", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["provenance"]["gpu_preset"].startswith("h100-sxm (data")
    (tmp_path / "notjson").write_text("x")  # a path is still read as the file it names
    assert "--gpu-preset ./notjson: not valid JSON" in refused_here(
        *GPU, "--gpu-preset", "./notjson"
    )


# ------------------------------------------------------------ hardware files
def test_a_hardware_file_giving_one_name_to_two_kinds_is_refused(tmp_path):
    """A GPU called dgx-h100 was taken, and `hardware show dgx-h100` then showed the GPU and
    never the node."""
    path = _write(tmp_path / "hw.json", {"gpus": {"dgx-h100": _fields("h100-sxm")}})
    for args in (["hardware", "show", "dgx-h100"], ["hardware", "list"], GPU):
        line = refused_here(*args, "--hardware", path)
        assert f"{path}: 'dgx-h100' names one of the gpus and one of the nodes" in line


def test_a_hardware_entry_whose_name_is_not_its_key_is_refused(tmp_path):
    """gpus.h100-sxm with "name": "other" was filed as h100-sxm and reported as other."""
    doc = {"gpus": {"h100-sxm": {**_fields("h100-sxm"), "name": "other"}}}
    path = _write(tmp_path / "hw.json", doc)
    line = refused_here(*GPU, "--hardware", path)
    assert f"{path}: gpus.h100-sxm.name is 'other': an entry is named by its key" in line
    doc["gpus"]["h100-sxm"]["name"] = "h100-sxm"  # `hardware show`'s output pasted: taken
    assert pdlsim_here("hardware", "list", "--hardware", _write(tmp_path / "ok.json", doc)) \
        .returncode == 0  # fmt: skip


# ------------------------------------------------------------ collective algorithms
@pytest.mark.parametrize("algorithm", ["RING", "bogus", "nvls-tree"])
def test_a_collective_algorithm_nccl_lacks_is_called_unknown(algorithm):
    """A typo was "cannot run allreduce on 1 node(s) of 8 GPU(s) of this fabric; it allows
    ring, nvls", as if the fabric lacked it."""
    line = refused_here("collective", "allreduce", "--algorithm", algorithm)
    assert f"unknown algorithm '{algorithm}'; NCCL's: ring, tree, nvls, nvls_tree" in line
    with pytest.raises(UserError, match=f"unknown algorithm '{algorithm}'"):
        api.collective("allreduce", algorithm=algorithm)


def test_an_algorithm_the_fabric_cannot_run_still_names_what_it_allows():
    line = refused_here("collective", "allgather", "--algorithm", "tree")
    assert "algorithm 'tree' cannot run allgather" in line and "it allows ring" in line


# ------------------------------------------------------------ the API's messages: one line
@pytest.mark.parametrize(
    "call",
    [lambda: api.predict("cnn", api.Cluster.gpus(2, 8), network="ib\nhdr", samples=2),
     lambda: api.predict("cnn", api.Cluster.gpus(2, 8), algorithm="ri\nng", samples=2),
     lambda: api.collective("allreduce", node="dgx\x1b[31m")],
)  # fmt: skip
def test_a_name_with_a_newline_is_one_line_through_the_api(call):
    """The command line escaped it; the API's message held the newline itself."""
    with pytest.raises(UserError) as info:
        call()
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
    assert "\\n" in str(info.value) or "\\x1b" in str(info.value)


# ------------------------------------------------------------ a published table
def _row(**change) -> dict:
    row = {"id": "r1", "kind": "allreduce_busbw", "node": "dgx-h100", "nodes": 1,
           "gpus_per_node": 8, "size_bytes": 2**30, "published": 400.0,
           "source": {"cite": "a test"}}  # fmt: skip
    return {**row, **change}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"rows": [_row(published=1e308)]}, "'published': it must be 0.001 to 1e+09, got 1e+308"),
        ({"rows": [_row(published=1e-308)]}, "'published': it must be 0.001 to 1e+09"),
        ({"rows": [_row(id="a\nb")]}, "'id': it must be printable text"),
        ({"rows": [_row(algorithm="RING")]}, "row r1: algorithm: unknown algorithm 'RING'"),
        ({"rows": [_row()], "node": {}}, "unknown key(s) node; allowed: about, nodes, rows"),
        ({"rows": [_row()], "nodes": {"dgx-h100": _fields("dgx-h100")}},
         "nodes.dgx-h100 is a packaged node preset; give the table's node another name"),
    ],
)  # fmt: skip
def test_a_damaged_published_table_is_one_line(tmp_path, monkeypatch, doc, message):
    """A figure of 1e308 scored an error of -inf% (and --json printed -Infinity); an id with
    a newline broke the table; a typo of an algorithm was "malformed field"; a misspelt key
    was ignored; a table node named like a preset priced its allreduce rows while its
    training rows took the preset."""
    path = tmp_path / "published.json"
    _write(path, doc)
    with pytest.raises(UserError, match="^" + str(path)) as info:
        published.score_published(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setattr(published, "PUBLISHED", path)  # as `validate --published` reads it
    assert message in refused_here("validate", "--published")
