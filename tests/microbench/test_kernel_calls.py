"""The step's kernel calls as enumerated from the workload are the calls the real network makes."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from microbench.kernelbench import ATTENTION_MAX_BLOCKS, KernelPlan, loop_points
from microbench.kernels import cpu as kernels_cpu
from microbench.kernels import loops
from microbench.kernels.calls import KernelCall, call_features, op_calls, step_calls
from microbench.kernels.callspec import ROW_KERNELS, _im2col_run
from microbench.kernels.policy import PARALLEL_MIN_ELEMENTS
from microbench.loopcalls import loop_dims
from microbench.nn import Network, make_optimizer, random_batch
from microbench.randomnets import random_workloads
from microbench.threads import available_cores, set_threads
from microbench.workload import Workload, load_workload

ODD = Workload.from_dict(
    {
        "name": "odd",
        "input_shape": [3, 11, 11],
        "layers": [
            {"kind": "maxpool2d", "size": 3, "stride": 1},  # before any parameter: no backward
            {"kind": "conv2d", "filters": 5, "kernel": 3, "stride": 2, "padding": 0},
            {"kind": "maxpool2d", "size": 2},  # fused, no relu
            {"kind": "relu"},  # fused after the pool
            {"kind": "conv2d", "filters": 6, "kernel": 1},
            {"kind": "flatten"},
            {"kind": "relu"},  # standalone, in place
            {"kind": "dense", "units": 7},
            {"kind": "dense", "units": 3},  # no relu between
            {"kind": "softmax_cross_entropy"},
        ],
    }
)
OVERLAP = Workload.from_dict(
    {
        "name": "overlapping-pool",  # at batch 64 each loop has past 2^17 elements of work
        "input_shape": [3, 32, 32],
        "layers": [
            {"kind": "conv2d", "filters": 8, "kernel": 3},
            {"kind": "maxpool2d", "size": 3, "stride": 2},  # windows overlap: the untiled backward
            {"kind": "flatten"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    }
)
MLP_INPUT_RELU = Workload.from_dict(
    {
        "name": "relu-first",
        "input_shape": [9],
        "layers": [
            {"kind": "relu"},  # on the caller's input: a copy first
            {"kind": "dense", "units": 4},
            {"kind": "softmax_cross_entropy"},
        ],
    }
)

# A skip with three readers (its gradients: a copy into dsum, then two adds), a three-way add,
# a relu in place on it, overlapping average-pool windows, a global average pool.
THREE_READERS = Workload.from_dict(
    {
        "name": "three-readers",
        "input_shape": [3, 12, 12],
        "layers": [
            {"kind": "conv2d", "name": "c0", "filters": 4, "kernel": 3, "padding": 1},
            {"kind": "relu", "name": "r0"},
            {"kind": "conv2d", "name": "a", "filters": 4, "kernel": 3, "padding": 1},
            {"kind": "conv2d", "name": "b", "filters": 4, "kernel": 1, "inputs": ["r0"]},
            {"kind": "add", "name": "s", "inputs": ["r0", "a", "b"]},
            {"kind": "relu", "name": "s.relu"},
            {"kind": "avgpool2d", "name": "p", "size": 3, "stride": 2},
            {"kind": "global_avgpool", "name": "g"},
            {"kind": "dense", "name": "fc", "units": 5},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)
# A skip from the network's input, which gets no gradient.
INPUT_SKIP = Workload.from_dict(
    {
        "name": "input-skip",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "name": "c", "filters": 3, "kernel": 3, "padding": 1},
            {"kind": "add", "name": "s", "inputs": ["input", "c"]},
            {"kind": "relu", "name": "r"},
            {"kind": "global_avgpool", "name": "g"},
            {"kind": "dense", "name": "fc", "units": 4},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)
# Every token kind: types and positions, dropout, causal attention without biases, a dense
# without bias whose relu runs alone, a skip, the first token pooled.
TOKENS = Workload.from_dict(
    {
        "name": "tokens",
        "input_shape": [6],
        "layers": [
            {"kind": "embedding", "name": "e", "vocab": 13, "dim": 8, "positions": 7,
             "token_types": 2},
            {"kind": "dropout", "name": "d", "rate": 0.25},
            {"kind": "layernorm", "name": "ln"},
            {"kind": "attention", "name": "a", "heads": 2, "causal": True, "bias": False},
            {"kind": "gelu", "name": "g"},
            {"kind": "dense", "name": "fc", "units": 8, "bias": False},
            {"kind": "relu", "name": "r"},
            {"kind": "add", "name": "s", "inputs": ["d", "r"]},
            {"kind": "token_pool", "name": "p", "mode": "first"},
            {"kind": "dense", "name": "head", "units": 5},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip
# A language model: a label per token.
LANGUAGE = Workload.from_dict(
    {
        "name": "language",
        "input_shape": [5],
        "layers": [
            {"kind": "embedding", "vocab": 11, "dim": 8},
            {"kind": "attention", "heads": 4, "causal": True},
            {"kind": "layernorm"},
            {"kind": "dense", "units": 11},
            {"kind": "token_cross_entropy"},
        ],
    }
)
# GPT-2's shape: positions, a causal block, the output layer tied to the token table.
TIED = Workload.from_dict(
    {
        "name": "tied",
        "input_shape": [6],
        "layers": [
            {"kind": "embedding", "name": "wte", "vocab": 13, "dim": 8, "positions": 9},
            {"kind": "layernorm", "name": "ln"},
            {"kind": "attention", "name": "a", "heads": 2, "causal": True},
            {"kind": "add", "name": "s", "inputs": ["wte", "a"]},
            {"kind": "dense", "name": "head", "units": 13, "tied_to": "wte", "bias": False},
            {"kind": "token_cross_entropy", "name": "loss"},
        ],
    }
)
# Batchnorm after convolutions without bias, a padded max-pool (ResNet's stem), a residual
# block, a padded average pool, dropout on features.
NORMED = Workload.from_dict(
    {
        "name": "normed",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "name": "c0", "filters": 4, "kernel": 3, "padding": 1,
             "bias": False},
            {"kind": "batchnorm2d", "name": "bn0"},
            {"kind": "relu", "name": "r0"},
            {"kind": "maxpool2d", "name": "mp", "size": 3, "stride": 2, "padding": 1},
            {"kind": "conv2d", "name": "c1", "filters": 4, "kernel": 3, "padding": 1,
             "bias": False},
            {"kind": "batchnorm2d", "name": "bn1"},
            {"kind": "add", "name": "s", "inputs": ["mp", "bn1"]},
            {"kind": "relu", "name": "r1"},
            {"kind": "avgpool2d", "name": "p", "size": 3, "stride": 2, "padding": 1},
            {"kind": "global_avgpool", "name": "g"},
            {"kind": "dropout", "name": "d", "rate": 0.5},
            {"kind": "dense", "name": "fc", "units": 5},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip

# ViT's shape: patches by a strided convolution, a class token and positions, a block, the
# class token pooled; then tokens with positions only, mean-pooled.
PATCHES = Workload.from_dict(
    {
        "name": "patches",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "name": "patch", "filters": 8, "kernel": 4, "stride": 4},
            {"kind": "to_tokens", "name": "t", "cls_token": True, "positions": True},
            {"kind": "layernorm", "name": "ln"},
            {"kind": "attention", "name": "a", "heads": 2},
            {"kind": "add", "name": "s", "inputs": ["t", "a"]},
            {"kind": "token_pool", "name": "p", "mode": "first"},
            {"kind": "dense", "name": "head", "units": 5},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip
PLAIN_PATCHES = Workload.from_dict(
    {
        "name": "plain-patches",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "name": "patch", "filters": 6, "kernel": 2, "stride": 2},
            {"kind": "to_tokens", "name": "t", "positions": True},
            {"kind": "token_pool", "name": "p", "mode": "mean"},
            {"kind": "dense", "name": "head", "units": 5},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip
# Concatenations: of channels-last images (one branch from the input, which gets no
# gradient), of features, and of channels-first maps (no image layer: the network keeps them
# as they come; nothing before it learns, so it passes no gradient back).
CONCATS = Workload.from_dict(
    {
        "name": "concats",
        "input_shape": [3, 8, 8],
        "layers": [
            {"kind": "conv2d", "name": "a", "filters": 5, "kernel": 3, "padding": 1},
            {"kind": "conv2d", "name": "b", "filters": 3, "kernel": 1, "inputs": ["input"]},
            {"kind": "concat", "name": "j", "inputs": ["a", "b", "input"]},
            {"kind": "relu", "name": "r"},
            {"kind": "global_avgpool", "name": "g"},
            {"kind": "dense", "name": "fa", "units": 6},
            {"kind": "dense", "name": "fb", "units": 3, "inputs": ["g"]},
            {"kind": "concat", "name": "k", "inputs": ["fa", "fb"]},
            {"kind": "dense", "name": "head", "units": 4},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip
CHANNELS_FIRST = Workload.from_dict(
    {
        "name": "channels-first",
        "input_shape": [2, 3, 4],
        "layers": [
            {"kind": "relu", "name": "r"},
            {"kind": "concat", "name": "j", "inputs": ["r", "input"]},
            {"kind": "flatten", "name": "f"},
            {"kind": "dense", "name": "head", "units": 3},
            {"kind": "softmax_cross_entropy", "name": "loss"},
        ],
    }
)  # fmt: skip


def _trace(
    monkeypatch, workload: Workload, batch: int, threads: int, momentum: float = 0.0,
    optimizer: str = "sgd",
):  # fmt: skip
    """The calls one real step makes: (kernel, dims) for GEMMs and copies, (variant, None)
    for loops."""
    log: list[tuple[str, object]] = []
    matmul, copyto = np.matmul, np.copyto

    def side(x) -> str:  # a row or column vector is both layouts: either reading is right
        if x.flags.c_contiguous and x.flags.f_contiguous:
            return "?"
        return "n" if x.flags.c_contiguous else "t"

    def traced_matmul(a, b, out=None):
        log.append((f"gemm_{side(a)}{side(b)}", (a.shape[0], b.shape[1], a.shape[1])))
        return matmul(a, b, out=out)

    def traced_copyto(dst, src):
        log.append(("copy", (dst.size,)))
        return copyto(dst, src)

    shim = type(sys)("numpy_traced")
    shim.__dict__.update(np.__dict__)
    shim.matmul, shim.copyto = traced_matmul, traced_copyto

    class Loops:
        def __getattr__(self, name):
            fn = getattr(loops, name)
            rows = name.removesuffix("_serial") in ROW_KERNELS

            def call(*args):  # a row loop's first argument is its (rows, cols) matrix
                log.append((name, args[0].shape if rows else None))
                return fn(*args)

            return call

    monkeypatch.setattr(kernels_cpu, "np", shim)
    monkeypatch.setattr(kernels_cpu, "loops", Loops())
    set_threads(threads)
    try:
        net, opt = Network(workload), make_optimizer(optimizer, 0.01, momentum)
        x, y = random_batch(workload, batch, np.random.default_rng(0))
        net.forward(x, y)
        net.backward()
        opt.step(net.params, net.grads)
    finally:
        set_threads(1)
    return log


def _same(traced: list, expected: list) -> bool:
    if len(traced) != len(expected):
        return False
    for (kind, dims), (want, want_dims) in zip(traced, expected, strict=True):
        if dims != want_dims or len(kind) != len(want):
            return False
        if any(a not in ("?", b) for a, b in zip(kind, want, strict=True)):
            return False
    return True


def _expected(calls: list[KernelCall]) -> list[tuple[str, object]]:
    out = []
    for c in calls:
        if c.kernel.startswith("gemm_") or c.kernel == "copy":
            out.append((c.kernel, c.dims))
        elif c.kernel == "copy_runs":  # a copy into or out of slices: numpy's copyto too
            out.append(("copy", (c.dims[0] * c.dims[1],)))
        else:
            dims = c.dims if c.kernel in ROW_KERNELS else None
            out.append((c.variant.replace("sgd_momentum", "sgd"), dims))
    return out


WORKLOADS = [
    load_workload("mlp"),
    load_workload("cnn"),
    ODD,
    OVERLAP,
    MLP_INPUT_RELU,
    load_workload("rescnn"),
    load_workload("transformer"),
    TOKENS,
    LANGUAGE,
    TIED,
    NORMED,
    PATCHES,
    PLAIN_PATCHES,
    CONCATS,
    CHANNELS_FIRST,
    THREE_READERS,
    INPUT_SKIP,
    *random_workloads(3, 4),
    *random_workloads(4, 3, kinds=("res",)),
]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_enumerated_calls_are_the_networks_calls(monkeypatch, workload, batch):
    for threads in sorted({1, min(2, available_cores())}):
        traced = _trace(monkeypatch, workload, batch, threads)
        expected = _expected(step_calls(workload, batch, threads, gather=False))
        assert _same(traced, expected), (workload.name, batch, threads, traced, expected)


def test_momentum_updates_with_the_same_loop(monkeypatch):
    workload = load_workload("mlp")
    traced = _trace(monkeypatch, workload, 8, 1, momentum=0.9)
    calls = step_calls(workload, 8, 1, momentum=0.9, gather=False)
    assert calls[-1].kernel == "sgd_momentum"
    assert _same(traced, _expected(calls))
    assert {name for name, _ in calls[-1].reads} >= {"vW0", "dW0", "W0"}


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_updates_with_its_own_loop_over_both_moments(monkeypatch, optimizer):
    workload = load_workload("mlp")
    for threads in sorted({1, min(2, available_cores())}):
        traced = _trace(monkeypatch, workload, 8, threads, optimizer=optimizer)
        calls = step_calls(workload, 8, threads, gather=False, optimizer=optimizer)
        assert calls[-1].kernel == "adam" and _same(traced, _expected(calls))
        names = {name for name, _ in calls[-1].writes}
        assert names >= {"W0", "mW0", "vW0"} and "dW0" not in names


def test_a_step_starts_with_the_gather_and_forward_only_ends_at_the_loss():
    cnn = load_workload("cnn")
    calls = step_calls(cnn, 16, 1)
    assert (calls[0].kernel, calls[0].dims) == ("gather", (16, 3 * 32 * 32 * 4))
    assert calls[1].kernel == "nchw_to_nhwc" and calls[1].layer == 0
    forward = step_calls(cnn, 16, 1, training=False)
    assert forward[-1].kernel == "softmax_xent"
    assert [c.phase for c in forward] == [c.phase for c in calls[: len(forward)]]


def test_loops_go_parallel_by_the_kernels_own_rule():
    mlp, cnn = load_workload("mlp"), load_workload("cnn")

    def first(workload, batch: int, threads: int = 2) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for c in step_calls(workload, batch, threads):
            out.setdefault(c.kernel, c.parallel)
        return out

    assert PARALLEL_MIN_ELEMENTS == 1 << 17
    assert not first(mlp, 4)["bias_act"] and first(mlp, 512)["bias_act"]  # 4 x 256 < 2^17
    assert first(mlp, 4)["sgd"]  # 235,146 parameters
    assert not any(c.parallel for c in step_calls(mlp, 512, 1))
    # a whole-activation loop too goes parallel by its work, not always: the CNN's first
    # im2col writes 32 x 32 x 27 column entries a sample, 27,648, and its first pool reads
    # 32 x 32 x 32 taps: serial at batch 2, parallel at 64
    small, large = first(cnn, 2), first(cnn, 64)
    assert not small["im2col"] and not small["maxpool"] and not small["nchw_to_nhwc"]
    assert large["im2col"] and large["maxpool"]


def test_op_calls_count_every_op_the_network_runs():
    assert op_calls(load_workload("mlp")) == [
        (0, "forward"), (2, "forward"), (4, "forward"), (5, "loss"),
        (4, "backward"), (2, "backward"), (0, "backward"), (-1, "update"),
    ]  # fmt: skip
    # the pool before the first conv runs forward only; the flatten counts both ways
    ops = op_calls(ODD)
    assert (0, "forward") in ops and (0, "backward") not in ops
    assert (5, "forward") in ops and (5, "backward") in ops
    assert op_calls(ODD, training=False)[-1] == (9, "loss")


def test_features_count_taps_and_runs():
    assert call_features("maxpool", (2, 8, 8, 5, 2, 2)) == (2 * 4 * 4 * 5 * 4, 5)
    assert call_features("maxpool", (2, 8, 8, 5, 3, 2)) == (2 * 3 * 3 * 5 * 9, 5)
    assert call_features("maxpool_backward", (2, 8, 8, 5, 3, 2)) == (2 * 8 * 8 * 5 * 4, 5)
    assert call_features("gemm_tn", (3, 4, 5)) == (60, 1)
    assert call_features("gather", (16, 3072)) == (16 * 768, 768)
    # 16 windows of a 7-wide kernel with padding 3 on 16 columns: 10 inside (one run of
    # k*c per kernel row), 6 overhanging (k runs of c per kernel row)
    assert _im2col_run(16, 3, 7, 1, 3) == round(16 * 49 * 3 / (10 * 7 + 6 * 49))
    assert _im2col_run(16, 4, 3, 1, 0) == 12  # no padding: every run is k * c


def test_attentions_run_is_a_blocks_pairs_times_its_head_width():
    """Attention's run is one (sample, head) block's work, so that its table sees what a block
    costs apart from its pairs; the sweep's calls land on the runs it asks for."""
    assert call_features("attention", (3, 24, 48, 4, 0)) == (3 * 576 * 48, 576 * 12)
    # causal: the whole square of scores is computed, then masked
    assert call_features("attention_backward", (3, 24, 48, 4, 1)) == (3 * 576 * 48, 576 * 12)
    for run in (64, 256, 1024, 4096, 16384, 65536, 262144):
        for elements in (run, 2**15, 2**21, 2**24):
            if elements < run:
                continue
            got, got_run = call_features("attention", loop_dims("attention", elements, run))
            assert got_run == run  # 16-wide heads of square blocks: every sweep run exact
            assert elements / 2 <= got <= max(elements, 2 * run)  # a sample of 2 heads at least
    swept = [call_features(k, d) for k, _, d in loop_points(KernelPlan(threads=(1,)), 1)
             if k == "attention"]  # fmt: skip
    assert {run for _, run in swept} == {64, 256, 1024, 4096, 16384, 65536, 262144}
    assert max(e / run for e, run in swept) == ATTENTION_MAX_BLOCKS  # more is the same blocks


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="unknown kernel"):
        KernelCall("fft", (1,), 0, "forward")
    with pytest.raises(ValueError, match="takes dims"):
        KernelCall("gemm_nn", (1, 2), 0, "forward")
    with pytest.raises(ValueError, match="batch and threads"):
        step_calls(load_workload("mlp"), 0, 1)


@pytest.mark.parametrize("workload", [load_workload("cnn"), MLP_INPUT_RELU], ids=lambda w: w.name)
def test_the_recorder_catches_every_enumerated_call_and_times_them_alone(workload):
    """The step benchmark's "alone" sum is over the very calls the model prices."""
    from microbench.kernels.record import record_calls, time_alone
    from microbench.kernels.steps import step_fn

    step = step_fn(workload, 5)
    step()
    calls = record_calls(step)
    assert len(calls) == len(step_calls(workload, 5, 1, gather=False))
    assert kernels_cpu.np is np and kernels_cpu.loops is loops  # the real ones are back
    assert time_alone(calls, repeats=2) > 0
