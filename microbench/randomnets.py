"""Random networks of the kinds the CPU model prices, drawn from a seed.

Two users, drawing from streams that never meet: ``pdlsim validate`` draws its held-out
workloads from the seed it is given (``numpy.random.default_rng(seed)``), and the kernel
sweep's step benchmark (:mod:`microbench.kernelbench`) draws the networks it measures the
in-step terms on from its own stream (``default_rng(STEP_STREAM)``), so a
calibration never times a held-out network:

* :func:`random_mlp`: 1 to 4 hidden dense layers (widths log-uniform in 24..1536, some odd),
  each followed by a relu, on an input of 64..3072 features, 10 or 100 classes.
* :func:`random_cnn`: an image of 1 or 3 channels and 12..32 pixels a side; 1 to 3 blocks of a
  convolution (4..64 filters, kernel 1, 3, 5 or 7, stride 1 or 2, "same" or no padding), a relu
  (now and then missing) and, while the image is large enough, a max-pool (2 or 3 wide,
  stride 2); then a flatten, 0 to 2 dense layers with relus, and the classifier.
* :func:`random_rescnn`: a graph: 1 or 2 stages, each a convolution (4..48 filters) and a relu,
  then 1 or 2 residual blocks (two 3x3 convolutions, the block's input added back, a relu),
  then a max- or average pool (2 or 3 wide, stride 2) while the image is 8 pixels or more; a
  global average pool (or now and then a flatten) and the classifier.
* :func:`random_transformer`: a graph on token ids: 8..64 tokens of a 64..4096-token vocabulary
  embedded 16..192 wide (with learned positions, now and then without), 1 to 3 blocks of
  1..8-head self-attention (causal now and then) and a GELU MLP 2 or 4 times as wide, each in a
  residual with layernorm before (or after) it; then either a mean or first-token pool and the
  classifier, or a language-model head over the vocabulary (now and then tied to the embedding)
  and a token-level cross-entropy.

Networks are kept to a size a small machine trains in milliseconds per step (FLOPs per sample
under :data:`MAX_FORWARD_FLOPS_PER_SAMPLE`), redrawn otherwise. Every draw is a plain workload
description (:meth:`microbench.workload.Workload.from_dict`), so it can be saved as a JSON file
and handed to ``pdlsim train`` and ``pdlsim predict`` like any user's workload.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from microbench.workload import Workload, WorkloadError
from microbench.workload.zoo import NetWriter, transformer_block

__all__ = [
    "MAX_FORWARD_FLOPS_PER_SAMPLE", "random_cnn", "random_mlp", "random_rescnn",
    "random_transformer", "random_workloads",
]  # fmt: skip

MAX_FORWARD_FLOPS_PER_SAMPLE = {"mlp": 6e6, "cnn": 3e7, "res": 3e7, "tfm": 1.5e7}


def _log_uniform_int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def random_mlp(rng: np.random.Generator, name: str) -> dict[str, Any]:
    features = int(rng.choice([64, 100, 256, 512, 784, 1024, 2048, 3072]))
    layers: list[dict[str, Any]] = []
    for _ in range(int(rng.integers(1, 5))):
        layers += [{"kind": "dense", "units": _log_uniform_int(rng, 24, 1536)}, {"kind": "relu"}]
    classes = int(rng.choice([10, 10, 100]))
    layers += [{"kind": "dense", "units": classes}, {"kind": "softmax_cross_entropy"}]
    return {"name": name, "input_shape": [features], "layers": layers}


def random_cnn(rng: np.random.Generator, name: str) -> dict[str, Any]:
    channels, input_side = int(rng.choice([1, 3])), int(rng.choice([12, 16, 24, 28, 32]))
    side = input_side
    layers: list[dict[str, Any]] = []
    for _ in range(int(rng.integers(1, 4))):
        kernel = int(rng.choice([1, 3, 3, 5, 7]))
        if kernel > side:
            break
        stride = int(rng.choice([1, 1, 1, 2]))
        padding = kernel // 2 if rng.random() < 0.7 else 0
        filters = _log_uniform_int(rng, 4, 64)
        layers.append(
            {"kind": "conv2d", "filters": filters, "kernel": kernel, "stride": stride,
             "padding": padding}
        )  # fmt: skip
        side = (side + 2 * padding - kernel) // stride + 1
        if rng.random() < 0.85:
            layers.append({"kind": "relu"})
        if side >= 4 and rng.random() < 0.75:
            size = int(rng.choice([2, 2, 3]))
            layers.append({"kind": "maxpool2d", "size": size, "stride": 2})
            side = (side - size) // 2 + 1
    layers.append({"kind": "flatten"})
    for _ in range(int(rng.integers(0, 3))):
        layers += [{"kind": "dense", "units": _log_uniform_int(rng, 16, 512)}, {"kind": "relu"}]
    classes = int(rng.choice([10, 10, 100]))
    layers += [{"kind": "dense", "units": classes}, {"kind": "softmax_cross_entropy"}]
    return {"name": name, "input_shape": [channels, input_side, input_side], "layers": layers}


def random_rescnn(rng: np.random.Generator, name: str) -> dict[str, Any]:
    """A residual CNN (module docstring): stages of a stem convolution and one or two
    residual blocks, pooled between, then a global average pool or a flatten."""
    channels, side = int(rng.choice([1, 3])), int(rng.choice([12, 16, 24, 32]))
    input_shape = [channels, side, side]
    layers: list[dict[str, Any]] = []
    x = "input"
    for stage in range(int(rng.integers(1, 3))):
        width = _log_uniform_int(rng, 4, 48)
        kernel = int(rng.choice([3, 3, 5])) if stage == 0 else 3
        pad = kernel // 2
        layers += [
            {"kind": "conv2d", "name": f"s{stage}.stem", "inputs": [x], "filters": width,
             "kernel": kernel, "padding": pad},
            {"kind": "relu", "name": f"s{stage}.stem.relu"},
        ]  # fmt: skip
        x = f"s{stage}.stem.relu"
        for block in range(int(rng.integers(1, 3))):
            b = f"s{stage}.b{block}"
            layers += [
                {"kind": "conv2d", "name": f"{b}.conv1", "inputs": [x], "filters": width,
                 "kernel": 3, "padding": 1},
                {"kind": "relu", "name": f"{b}.relu1"},
                {"kind": "conv2d", "name": f"{b}.conv2", "filters": width, "kernel": 3,
                 "padding": 1},
                {"kind": "add", "name": f"{b}.add", "inputs": [x, f"{b}.conv2"]},
                {"kind": "relu", "name": f"{b}.out"},
            ]  # fmt: skip
            x = f"{b}.out"
        if side >= 8:
            pool = "maxpool2d" if rng.random() < 0.5 else "avgpool2d"
            size = int(rng.choice([2, 2, 3]))
            layers.append({"kind": pool, "name": f"s{stage}.pool", "size": size, "stride": 2})
            x, side = f"s{stage}.pool", (side - size) // 2 + 1
    if rng.random() < 0.7:
        layers.append({"kind": "global_avgpool", "name": "gap"})
    else:
        layers.append({"kind": "flatten", "name": "flatten"})
    classes = int(rng.choice([10, 10, 100]))
    layers += [{"kind": "dense", "name": "fc", "units": classes},
               {"kind": "softmax_cross_entropy", "name": "loss"}]  # fmt: skip
    return {"name": name, "input_shape": input_shape, "layers": layers}


def random_transformer(rng: np.random.Generator, name: str) -> dict[str, Any]:
    """A transformer on token ids (module docstring), written as the zoo writes BERT and GPT-2
    (:func:`microbench.workload.zoo.transformer_block`), without dropout."""
    tokens = int(rng.choice([8, 12, 16, 24, 32, 48, 64]))
    vocab = _log_uniform_int(rng, 64, 4096)
    heads = int(rng.choice([1, 2, 4, 4, 8]))
    width = heads * int(rng.choice([8, 12, 16, 24]))
    pre_norm, causal = bool(rng.random() < 0.6), bool(rng.random() < 0.3)
    net = NetWriter(name, [tokens], "a random transformer (microbench.randomnets)")
    positions = {"positions": tokens} if rng.random() < 0.8 else {}
    x = net.add("embedding", "embed", vocab=vocab, dim=width, **positions)
    for block in range(int(rng.integers(1, 4))):
        x = transformer_block(net, f"b{block}", x, width, heads, pre_norm, causal, dropout=0.0,
                              mlp_ratio=int(rng.choice([2, 4])))  # fmt: skip
    if pre_norm:
        net.add("layernorm", "ln")
    if rng.random() < 0.7:
        net.add("token_pool", "pool", mode=str(rng.choice(["mean", "first"])))
        net.add("dense", "head", units=int(rng.choice([10, 10, 100])))
        net.add("softmax_cross_entropy", "loss")
    else:
        tied = {"tied_to": "embed"} if rng.random() < 0.5 else {}
        net.add("dense", "lm_head", units=vocab, **tied)
        net.add("token_cross_entropy", "loss")
    return net.doc


# Draws in a row that may fail (a network over its FLOPs bound, or one the workload checks
# refuse) before :func:`random_workloads` gives up: a few in a hundred fail by chance, all of
# them only when no draw can pass.
MAX_DRAWS = 1_000


def random_workloads(
    seed: int | np.random.Generator,
    count: int,
    kinds: tuple[str, ...] = ("mlp", "cnn"),
    prefix: str | None = None,
) -> list[Workload]:
    """``count`` random workloads alternating over ``kinds``, named ``<kind>-s<seed>-<i>``
    (``<prefix>-<kind>-<i>`` when ``seed`` is a generator: give ``prefix`` then)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    out: list[Workload] = []
    makers = {"mlp": random_mlp, "cnn": random_cnn, "res": random_rescnn,
              "tfm": random_transformer}  # fmt: skip
    misses, why = 0, "over the FLOPs bound"
    while len(out) < count:
        kind = kinds[len(out) % len(kinds)]
        name = f"{prefix}-{kind}-{len(out)}" if prefix else f"{kind}-s{seed}-{len(out)}"
        try:
            workload = Workload.from_dict(makers[kind](rng, name), f"random network {name}")
        except WorkloadError as exc:
            workload, why = None, str(exc)
        if workload is not None and (
            workload.forward_flops_per_sample <= MAX_FORWARD_FLOPS_PER_SAMPLE[kind]
        ):
            out.append(workload)
            misses = 0
            continue
        misses += 1
        if misses >= MAX_DRAWS:  # a draw that can never pass (a name no check takes) ends
            raise WorkloadError(f"no {kind} network drawn in {MAX_DRAWS:,} tries; the last: {why}")
    return out
