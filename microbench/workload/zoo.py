"""Workloads by name: the presets pdlsim trains (``mlp``, ``cnn``, ``rescnn``, ``transformer``)
and a zoo of published networks, each written in the workload language
(:mod:`microbench.workload.graph`) as its reference implementation defines it, so that its
parameter count is the published one.

* ``resnet18``, ``resnet50``: torchvision's ResNets (He et al. 2016; the stride on the 3x3
  convolution of a bottleneck, "v1.5"), 224 x 224 images, 1000 classes: 11,689,512 and
  25,557,032 parameters. Convolutions have no bias; each is followed by a batchnorm.
* ``vgg16``: torchvision's VGG-16 (Simonyan and Zisserman 2015), 138,357,544 parameters (its
  adaptive average pool is the identity at 224 x 224 and is left out).
* ``bert-base``: BERT-base (Devlin et al. 2019) as Hugging Face's ``BertForMaskedLM`` of
  ``bert-base-uncased``: post-layernorm encoder, 512 tokens, the masked-language-model head whose
  output layer shares the token embedding; 109,514,298 parameters.
* ``bert-large``: the same for ``bert-large-uncased`` (24 layers of width 1024, 16 heads):
  335,174,458 parameters.
* ``gpt2``: GPT-2 small (Radford et al. 2019), pre-layernorm decoder of 1024 tokens with causal
  attention, output layer tied to the token embedding: 124,439,808 parameters.
* ``vit-b16``: torchvision's ViT-B/16 (Dosovitskiy et al. 2021): 16 x 16 patches of a 224 x 224
  image, a class token, learned positions, 86,567,656 parameters.

* ``rescnn``, ``transformer``: small networks of these kinds that ``pdlsim train`` runs in every
  execution mode on this machine's cores (with the same loss curve in each), so that the model
  is checked against real steps of networks with skips and attention, not only chains.

A builder returns the description as a dict, the JSON a user may write out
(``pdlsim workload show NAME --json``), copy and edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PRESETS", "ZOO", "NetWriter", "transformer_block"]

PRESETS: dict[str, dict[str, Any]] = {
    "mlp": {
        "name": "mlp",
        "input_shape": [784],
        "layers": [
            {"kind": "dense", "units": 256},
            {"kind": "relu"},
            {"kind": "dense", "units": 128},
            {"kind": "relu"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    },
    "cnn": {
        "name": "cnn",
        "input_shape": [3, 32, 32],
        "layers": [
            {"kind": "conv2d", "filters": 32, "kernel": 3, "padding": 1},
            {"kind": "relu"},
            {"kind": "maxpool2d", "size": 2},
            {"kind": "conv2d", "filters": 64, "kernel": 3, "padding": 1},
            {"kind": "relu"},
            {"kind": "maxpool2d", "size": 2},
            {"kind": "flatten"},
            {"kind": "dense", "units": 256},
            {"kind": "relu"},
            {"kind": "dense", "units": 10},
            {"kind": "softmax_cross_entropy"},
        ],
    },
}


class NetWriter:
    """A description being written: each :meth:`add` appends a layer reading the last one
    (or ``inputs``) and returns its name."""

    def __init__(self, name: str, input_shape: list[int], description: str) -> None:
        self.doc: dict[str, Any] = {"name": name, "input_shape": input_shape,
                                    "description": description, "layers": []}  # fmt: skip
        self.last = "input"

    def add(self, kind: str, name: str, inputs: list[str] | None = None, **settings: Any) -> str:
        layer: dict[str, Any] = {"kind": kind, "name": name, **settings}
        if inputs and inputs != [self.last]:
            layer["inputs"] = inputs
        self.doc["layers"].append(layer)
        self.last = name
        return name

    def conv_bn(self, name: str, filters: int, kernel: int, stride: int = 1,
                relu: bool = True, inputs: list[str] | None = None) -> str:  # fmt: skip
        self.add("conv2d", f"{name}.conv", inputs, filters=filters, kernel=kernel,
                 stride=stride, padding=kernel // 2, bias=False)  # fmt: skip
        out = self.add("batchnorm2d", f"{name}.bn")
        return self.add("relu", f"{name}.relu") if relu else out


def _resnet(name: str, blocks: list[int], bottleneck: bool, params: str) -> dict[str, Any]:
    net = NetWriter(
        name, [3, 224, 224], f"{name} (torchvision; He et al. 2016): {params} parameters"
    )
    net.conv_bn("stem", 64, 7, stride=2)
    x = net.add("maxpool2d", "stem.pool", size=3, stride=2, padding=1)
    channels, expansion = 64, 4 if bottleneck else 1
    for stage, count in enumerate(blocks):
        planes = 64 * 2**stage
        for b in range(count):
            block = f"layer{stage + 1}.{b}"
            stride = 2 if stage > 0 and b == 0 else 1
            if bottleneck:
                net.conv_bn(f"{block}.a", planes, 1, inputs=[x])
                net.conv_bn(f"{block}.b", planes, 3, stride)
                y = net.conv_bn(f"{block}.c", planes * expansion, 1, relu=False)
            else:
                net.conv_bn(f"{block}.a", planes, 3, stride, inputs=[x])
                y = net.conv_bn(f"{block}.b", planes, 3, relu=False)
            skip = x
            if stride != 1 or channels != planes * expansion:
                skip = net.conv_bn(f"{block}.down", planes * expansion, 1, stride,
                                   relu=False, inputs=[x])  # fmt: skip
            net.add("add", f"{block}.add", [y, skip])
            x = net.add("relu", f"{block}.out")
            channels = planes * expansion
    net.add("global_avgpool", "avgpool")
    net.add("dense", "fc", units=1000)
    net.add("softmax_cross_entropy", "loss")
    return net.doc


def resnet18() -> dict[str, Any]:
    return _resnet("resnet18", [2, 2, 2, 2], False, "11,689,512")


def resnet50() -> dict[str, Any]:
    return _resnet("resnet50", [3, 4, 6, 3], True, "25,557,032")


def vgg16() -> dict[str, Any]:
    about = "VGG-16 (torchvision; Simonyan and Zisserman 2015): 138,357,544 parameters"
    net = NetWriter("vgg16", [3, 224, 224], about)
    plan = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    for block, widths in enumerate(plan):
        for i, width in enumerate(widths):
            net.add("conv2d", f"conv{block + 1}_{i + 1}", filters=width, kernel=3, padding=1)
            net.add("relu", f"relu{block + 1}_{i + 1}")
        net.add("maxpool2d", f"pool{block + 1}", size=2)
    net.add("flatten", "flatten")
    for i in (1, 2):
        net.add("dense", f"fc{i}", units=4096)
        net.add("relu", f"fc{i}.relu")
        net.add("dropout", f"fc{i}.dropout", rate=0.5)
    net.add("dense", "fc3", units=1000)
    net.add("softmax_cross_entropy", "loss")
    return net.doc


def transformer_block(net: NetWriter, name: str, x: str, d: int, heads: int, pre_norm: bool,
                      causal: bool, dropout: float, mlp_ratio: int = 4) -> str:  # fmt: skip
    """One transformer block on ``x`` (its name): attention then an MLP ``mlp_ratio`` times
    as wide as the block, each in a residual, with layernorm before each (``pre_norm``,
    GPT-2, ViT) or after each add (BERT)."""

    def residual(tag: str, body: Callable[[str], str], x: str) -> str:
        h = net.add("layernorm", f"{name}.{tag}.ln", [x]) if pre_norm else x
        h = body(h)
        if dropout:
            h = net.add("dropout", f"{name}.{tag}.dropout", rate=dropout)
        out = net.add("add", f"{name}.{tag}.add", [x, h])
        return out if pre_norm else net.add("layernorm", f"{name}.{tag}.ln")

    def attention(h: str) -> str:
        return net.add("attention", f"{name}.attn", [h], heads=heads, causal=causal)

    def mlp(h: str) -> str:
        net.add("dense", f"{name}.fc1", [h], units=mlp_ratio * d)
        net.add("gelu", f"{name}.gelu")
        return net.add("dense", f"{name}.fc2", units=d)

    return residual("mlp", mlp, residual("attn", attention, x))


def _bert(name: str, layers: int, d: int, heads: int, params: str) -> dict[str, Any]:
    """BERT (Devlin et al. 2019) as Hugging Face's ``BertForMaskedLM``: post-layernorm blocks,
    512 tokens, the masked-language-model head's output layer tied to the token embedding."""
    title = "BERT-" + name.removeprefix("bert-")
    net = NetWriter(name, [512],
               f"{title} (Devlin et al. 2019) as Hugging Face's BertForMaskedLM of "
               f"{name}-uncased, 512 tokens: {params} parameters")  # fmt: skip
    net.add("embedding", "embed", vocab=30522, dim=d, positions=512, token_types=2)
    net.add("layernorm", "embed.ln")
    x = net.add("dropout", "embed.dropout", rate=0.1)
    for i in range(layers):
        x = transformer_block(
            net, f"layer{i}", x, d, heads, pre_norm=False, causal=False, dropout=0.1
        )
    net.add("dense", "mlm.transform", units=d)
    net.add("gelu", "mlm.gelu")
    net.add("layernorm", "mlm.ln")
    net.add("dense", "mlm.decoder", units=30522, tied_to="embed")
    net.add("token_cross_entropy", "loss")
    return net.doc


def bert_base() -> dict[str, Any]:
    return _bert("bert-base", 12, 768, 12, "109,514,298")


def bert_large() -> dict[str, Any]:
    return _bert("bert-large", 24, 1024, 16, "335,174,458")


def gpt2() -> dict[str, Any]:
    net = NetWriter("gpt2", [1024],
               "GPT-2 small (Radford et al. 2019), 1024 tokens, output layer tied to the "
               "token embedding: 124,439,808 parameters")  # fmt: skip
    net.add("embedding", "wte", vocab=50257, dim=768, positions=1024)
    x = net.add("dropout", "embed.dropout", rate=0.1)
    for i in range(12):
        x = transformer_block(net, f"h{i}", x, 768, 12, pre_norm=True, causal=True, dropout=0.1)
    net.add("layernorm", "ln_f")
    net.add("dense", "lm_head", units=50257, bias=False, tied_to="wte")
    net.add("token_cross_entropy", "loss")
    return net.doc


def vit_b16() -> dict[str, Any]:
    about = "ViT-B/16 (torchvision; Dosovitskiy et al. 2021): 86,567,656 parameters"
    net = NetWriter("vit-b16", [3, 224, 224], about)
    net.add("conv2d", "patch", filters=768, kernel=16, stride=16)
    x = net.add("to_tokens", "tokens", cls_token=True, positions=True)
    for i in range(12):
        x = transformer_block(
            net, f"encoder{i}", x, 768, 12, pre_norm=True, causal=False, dropout=0.0
        )
    net.add("layernorm", "ln")
    net.add("token_pool", "cls", mode="first")
    net.add("dense", "head", units=1000)
    net.add("softmax_cross_entropy", "loss")
    return net.doc


def rescnn() -> dict[str, Any]:
    about = ("a small residual CNN for 32 x 32 images that pdlsim trains: two residual blocks "
             "of 3x3 convolutions, max- and average-pooling, global average pooling; no "
             "batchnorm, so that every execution mode computes the same steps")  # fmt: skip
    net = NetWriter("rescnn", [3, 32, 32], about)
    x = "input"
    for stage, (width, pool) in enumerate(((16, "maxpool2d"), (32, "avgpool2d"))):
        name = f"stage{stage + 1}"
        net.add("conv2d", f"{name}.conv", [x], filters=width, kernel=3, padding=1)
        x = net.add("relu", f"{name}.relu")
        net.add("conv2d", f"{name}.block.conv1", filters=width, kernel=3, padding=1)
        net.add("relu", f"{name}.block.relu1")
        y = net.add("conv2d", f"{name}.block.conv2", filters=width, kernel=3, padding=1)
        net.add("add", f"{name}.block.add", [x, y])
        net.add("relu", f"{name}.block.out")
        x = net.add(pool, f"{name}.pool", size=2)
    net.add("global_avgpool", "avgpool")
    net.add("dense", "fc", units=10)
    net.add("softmax_cross_entropy", "loss")
    return net.doc


def transformer() -> dict[str, Any]:
    about = ("a small transformer encoder that pdlsim trains: 32 tokens of a 512-token "
             "vocabulary, two pre-layernorm blocks of width 64 with 4 heads, mean-pooled to "
             "10 classes")  # fmt: skip
    net = NetWriter("transformer", [32], about)
    x = net.add("embedding", "embed", vocab=512, dim=64, positions=32)
    for i in range(2):
        x = transformer_block(net, f"block{i}", x, 64, 4, pre_norm=True, causal=False, dropout=0.0)
    net.add("layernorm", "ln")
    net.add("token_pool", "pool", mode="mean")
    net.add("dense", "head", units=10)
    net.add("softmax_cross_entropy", "loss")
    return net.doc


ZOO: dict[str, Callable[[], dict[str, Any]]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "bert-base": bert_base,
    "bert-large": bert_large,
    "gpt2": gpt2,
    "vit-b16": vit_b16,
}

# The presets pdlsim trains in every execution mode: the two chains above and two graphs.
PRESETS.update({"rescnn": rescnn(), "transformer": transformer()})
