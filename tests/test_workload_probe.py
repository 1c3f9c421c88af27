"""Bad workload files found by a fault probe of the workload language and of ``pdlsim workload
show``, ``predict --model``, ``sweep --model`` and ``train --model``: each is one line on stderr
starting ``pdlsim: error:`` that names the problem and its fix, exit status 2, no traceback,
nothing written; and a file without a ``name`` is named after the file itself."""

from __future__ import annotations

import json

import pytest

from microbench.workload import Workload, WorkloadError
from tests.conftest import pdlsim_here, refused_here

LOSS = {"kind": "softmax_cross_entropy"}
MLP = {"input_shape": [8], "layers": [{"kind": "dense", "units": 10}, LOSS]}
FAST = ["--iterations", "2", "--samples", "2"]

# A dense layer tied to an embedding of width 8 that reads 4 features: the table cannot be
# shared (training stopped with a traceback deep in the network's build).
TIED_WRONG_WIDTH = {
    "input_shape": [8],
    "layers": [
        {"kind": "embedding", "vocab": 10, "dim": 8, "name": "e"},
        {"kind": "dense", "units": 4},
        {"kind": "dense", "units": 10, "tied_to": "e"},
        {"kind": "token_cross_entropy"},
    ],
}
# A conv whose padding makes an output of 7e19 values per sample: the kernel model's sizes
# outgrew int64 and predict --allow-oversubscribed-memory stopped with a TypeError.
HUGE_OUTPUT = {
    "input_shape": [3, 8, 8],
    "layers": [
        {"kind": "conv2d", "filters": 4, "kernel": 3, "padding": 2**31 - 1},
        {"kind": "flatten"},
        {"kind": "dense", "units": 10},
        LOSS,
    ],
}


def _write(tmp_path, doc, name: str = "w.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _with(**layer0) -> dict:
    """The small MLP with its first layer's settings changed."""
    return {**MLP, "layers": [{"kind": "dense", "units": 10, **layer0}, LOSS]}


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        (
            TIED_WRONG_WIDTH,
            [
                "layer 2 (dense2): tied to e (10 x 8), so it must read 8 features",
                "give the layer before it 8 units",
            ],
        ),
        (
            HUGE_OUTPUT,
            [
                "layer 0 (conv2d0): its output [4, 4294967300, 4294967300] holds",
                "values per sample, more than the 68,719,476,736",
                "give smaller sizes",
            ],
        ),
        ({**MLP, "input_shape": [2**30, 2**30]}, ["'input_shape' [1073741824, 1073741824]"]),
        ({**MLP, "name": "runs/../x"}, ["holds a path separator", "use '-' or '_'"]),
        ({**MLP, "name": "a\\b"}, ["holds a path separator"]),
        ({**MLP, "name": " mlp"}, ["' mlp' starts or ends with a space; remove it"]),
        (_with(name="fc "), ["layer 0 (dense): 'name' 'fc ' starts or ends with a space"]),
        (
            _with(bias=None),
            ["'bias' is null; give true or false, or leave it out for the default true"],
        ),
        (_with(units=None), ["dense needs 'units', an integer >= 1"]),
        (
            _with(inputs=["\x1b[2J" + "x" * 500]),
            ["reads '\\x1b[2Jxxx", "xxx..., which is no layer above"],
        ),
        (_with(tied_to="nope"), ["tied_to names 'nope', which is no embedding above it; name an"]),
    ],
)
def test_a_bad_workload_is_one_line_in_every_command_that_reads_it(tmp_path, doc, words):
    path = _write(tmp_path, doc)
    out = tmp_path / "out"
    for args in (
        ["workload", "show", path],
        ["workload", "show", path, "--json"],
        ["predict", "--model", path, "--nodes", "2", "--allow-oversubscribed-memory", *FAST],
        ["predict", "--model", path, "--nodes", "2", "--gpus", "4", *FAST],
        ["sweep", "--model", path, "--nodes", "1,2", "--out", str(out), *FAST],
        ["train", "--model", path, "--max-steps", "1", "--samples", "8", "--out", str(out)],
    ):
        line = refused_here(*args)
        for word in words:
            assert word in line, (args, line)
    assert not out.exists()


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        (
            {
                **MLP,
                "layers": [
                    {"kind": "dense", "units": 10, "name": "a"},
                    {"kind": "add", "inputs": ["a"]},
                    LOSS,
                ],
            },
            ["add takes two or more inputs, got 1; name them in its 'inputs'"],
        ),
        (
            {"input_shape": [3, 8, 8], "layers": [{"kind": "maxpool2d", "size": 9}, LOSS]},
            ["pool size 9 is larger than the padded input 8x8; give a size of at most 8"],
        ),
        (
            {
                "input_shape": [3, 8, 8],
                "layers": [{"kind": "avgpool2d", "size": 2, "padding": 2}, LOSS],
            },
            ["padding 2 is more than half the pool size 2; give a padding of at most 1"],
        ),
        (
            {
                "input_shape": [3, 4, 4],
                "layers": [{"kind": "conv2d", "filters": 2, "kernel": 7}, LOSS],
            },
            ["kernel 7 is larger than the padded input 4x4; give a kernel of at most 4"],
        ),
        (
            {**MLP, "layers": [LOSS, {"kind": "dense", "units": 10}, LOSS]},
            ["must be the last layer (a network has one loss); move it to the end or remove it"],
        ),
        (
            {**MLP, "layers": [{"kind": "dense", "units": 1}, LOSS]},
            ["needs at least 2 classes, got 1; give the layer before it 2 or more units"],
        ),
        (
            {
                **MLP,
                "layers": [
                    {"kind": "dense", "units": 8},
                    {"kind": "embedding", "vocab": 10, "dim": 4},
                    LOSS,
                ],
            },
            ['embedding reads the token ids of the network\'s input; give it "inputs": ["input"]'],
        ),
    ],
)
def test_shape_errors_say_how_to_fix_them(tmp_path, doc, words):
    line = refused_here("workload", "show", _write(tmp_path, doc))
    for word in words:
        assert word in line, line


def test_a_file_without_a_name_is_named_after_the_file(tmp_path, monkeypatch):
    """A bare file name gave the workload the name 'workload file w' (the error prefix's stem)."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, MLP, "tiny-net.json")
    result = pdlsim_here("workload", "show", "tiny-net.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("workload tiny-net: input [8]"), result.stdout
    shown = json.loads(pdlsim_here("workload", "show", "tiny-net.json", "--json").stdout)
    assert shown["workload"]["name"] == "tiny-net"
    assert Workload.load(str(tmp_path / "tiny-net.json")).name == "tiny-net"


@pytest.mark.parametrize(
    ("file_name", "problem"),
    [
        ("a\nb.json", "holds the unprintable character '\\n'"),
        ("a\x1b[31mb.json", "holds the unprintable character '\\x1b'"),
        (" spaced.json", "starts or ends with a space"),
        ("x" * 230 + ".json", "is 230 characters long"),
    ],
)
def test_a_file_name_that_cannot_name_the_workload_asks_for_a_name(tmp_path, file_name, problem):
    path = _write(tmp_path, MLP, file_name)
    line = refused_here("workload", "show", path)
    assert "the workload has no 'name', and its file's name cannot stand in for one" in line
    assert problem in line and line.endswith("give the workload a 'name'"), line
    assert "\x1b" not in line
    named = _write(tmp_path, {**MLP, "name": "fine"}, file_name)
    assert pdlsim_here("workload", "show", named).returncode == 0


def test_the_api_checks_dicts_as_it_checks_files():
    with pytest.raises(WorkloadError, match="tied to e .*must read 8 features") as info:
        Workload.load(TIED_WRONG_WIDTH)
    assert "\n" not in str(info.value)
    with pytest.raises(WorkloadError, match="values per sample"):
        Workload.load(HUGE_OUTPUT)


def test_the_largest_outputs_a_sample_may_hold_still_load():
    """The bound on a sample's values leaves room for long-context transformers: 128k tokens
    of a 53,248-wide MLP (7e9 values) still load."""
    doc = {
        "input_shape": [131072],
        "layers": [
            {"kind": "embedding", "vocab": 1000, "dim": 128},
            {"kind": "dense", "units": 53248},
            {"kind": "token_pool", "mode": "mean"},
            {"kind": "dense", "units": 10},
            LOSS,
        ],
    }
    assert Workload.load(doc).layers[1].output_shape == (131072, 53248)
