"""A workload's twin in PyTorch: the same graph of layers as torch modules, so that a GPU (or
this machine, for comparison) can time the layers a workload description names.

Every layer kind of :mod:`microbench.workload.layers` has a module with the same parameters
(the twin's parameter count is the description's, tied output layers included) and the same
per-sample shapes: images channels first, tokens batch first. Attention is torch's
``MultiheadAttention`` (its fused kernels), GELU the tanh form as the description's, an
embedding adds its position and token-type tables (token type 0, as BERT's pretraining
inputs mostly are). The loss layer is not a module: :func:`twin_loss` applies it to the
twin's output. torch is an optional dependency, imported by the caller and passed in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["torch_twin", "twin_loss", "twin_inputs"]


def torch_twin(workload: Any, torch: Any) -> Any:
    """The workload's layers (all but the loss) as one ``torch.nn.Module`` whose ``forward``
    maps the network input to the logits; ``.body`` lists the layers' infos, ``.layers`` the
    modules in the same order."""
    nn = torch.nn

    class GlobalAvgPool(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.mean(dim=(2, 3))

    class Sum(nn.Module):
        def forward(self, *xs: Any) -> Any:
            return sum(xs[1:], xs[0])

    class Concat(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.dim = dim

        def forward(self, *xs: Any) -> Any:
            return torch.cat(xs, dim=self.dim)

    class TokenPool(nn.Module):
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mean = mode == "mean"

        def forward(self, x: Any) -> Any:
            return x.mean(dim=1) if self.mean else x[:, 0]

    class Embedding(nn.Module):
        def __init__(self, vocab: int, dim: int, positions: int, token_types: int) -> None:
            super().__init__()
            self.table = nn.Embedding(vocab, dim)
            self.positions = nn.Parameter(torch.zeros(positions, dim)) if positions else None
            self.types = nn.Parameter(torch.zeros(token_types, dim)) if token_types else None

        def forward(self, x: Any) -> Any:
            y = self.table(x.long())
            if self.positions is not None:
                y = y + self.positions[: x.shape[1]]
            return y if self.types is None else y + self.types[0]

    class ToTokens(nn.Module):
        def __init__(self, channels: int, tokens: int, cls: bool, positions: bool) -> None:
            super().__init__()
            self.cls = nn.Parameter(torch.zeros(1, 1, channels)) if cls else None
            self.positions = nn.Parameter(torch.zeros(tokens, channels)) if positions else None

        def forward(self, x: Any) -> Any:
            y = x.flatten(2).transpose(1, 2)
            if self.cls is not None:
                y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], dim=1)
            return y if self.positions is None else y + self.positions

    class Attention(nn.Module):
        def __init__(self, d: int, heads: int, causal: bool, bias: bool) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(d, heads, bias=bias, batch_first=True)
            self.causal = causal

        def forward(self, x: Any) -> Any:
            mask = None
            if self.causal:
                mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
            return self.mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=self.causal)[0]

    modules: dict[str, Any] = {}

    def module(info: Any) -> Any:
        s, shape, kind = info.layer.settings, info.input_shape, info.kind
        if kind == "dense":
            linear = nn.Linear(shape[-1], s["units"], bias=s.get("bias", True))
            if s.get("tied_to"):
                linear.weight = modules[s["tied_to"]].table.weight  # one tensor, as GPT-2's
            return linear
        if kind == "conv2d":
            return nn.Conv2d(shape[0], s["filters"], s["kernel"], s.get("stride", 1),
                             s.get("padding", 0), bias=s.get("bias", True))  # fmt: skip
        if kind in ("maxpool2d", "avgpool2d"):
            pool = nn.MaxPool2d if kind == "maxpool2d" else nn.AvgPool2d
            return pool(s["size"], s.get("stride") or s["size"], s.get("padding", 0))
        if kind == "embedding":
            return Embedding(s["vocab"], s["dim"], s.get("positions", 0), s.get("token_types", 0))
        if kind == "to_tokens":
            return ToTokens(shape[0], info.output_shape[0], bool(s.get("cls_token")),
                            bool(s.get("positions")))  # fmt: skip
        if kind == "attention":
            return Attention(shape[-1], s["heads"], s.get("causal", False), s.get("bias", True))
        simple = {
            "relu": nn.ReLU, "flatten": nn.Flatten, "global_avgpool": GlobalAvgPool, "add": Sum,
            "gelu": lambda: nn.GELU(approximate="tanh"),
            "concat": lambda: Concat(1 if len(shape) == 3 else -1),
            "layernorm": lambda: nn.LayerNorm(shape[-1]),
            "batchnorm2d": lambda: nn.BatchNorm2d(shape[0]),
            "dropout": lambda: nn.Dropout(s["rate"]),
            "token_pool": lambda: TokenPool(s.get("mode", "first")),
        }  # fmt: skip
        if kind not in simple:
            raise ValueError(f"no torch module for layer kind {kind!r}")
        return simple[kind]()

    class Twin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = [info for info in workload.layers if info.kind not in _LOSSES]
            built = []
            for info in self.body:
                built.append(module(info))
                modules[info.name] = built[-1]
            self.layers = nn.ModuleList(built)

        def forward(self, x: Any) -> Any:
            outs: dict[int, Any] = {-1: x}
            for info, layer in zip(self.body, self.layers, strict=True):
                outs[info.index] = layer(*(outs[j] for j in info.inputs))
            return outs[self.body[-1].index]

    return Twin()


_LOSSES = ("softmax_cross_entropy", "token_cross_entropy")


def twin_loss(logits: Any, labels: Any, torch: Any) -> Any:
    """Mean cross-entropy of the logits (a row per sample, or per token) against the labels."""
    flat = logits.reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, labels.reshape(-1).long())


def twin_inputs(workload: Any, batch: int, torch: Any, device: str = "cpu") -> tuple[Any, Any]:
    """A random batch for the twin: token ids where the network reads tokens, else values;
    labels per sample or per token."""
    generator = torch.Generator().manual_seed(0)
    vocab = workload.vocabulary
    shape = (batch, *workload.input_shape)
    if vocab:
        x = torch.randint(0, vocab, shape, generator=generator)
    else:
        x = torch.randn(shape, generator=generator)
    classes = workload.num_classes
    per_token = workload.layers[-1].kind == "token_cross_entropy"
    labels = (batch, workload.input_shape[0]) if per_token else (batch,)
    y = torch.randint(0, classes, labels, generator=generator)
    return x.to(device), y.to(device)
