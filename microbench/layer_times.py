"""Each layer of a workload timed on a device with PyTorch, at a precision: what GPU ranks'
compute is priced from when it was measured rather than read off a data sheet.

A layer is timed alone, as the twin (:mod:`microbench.torch_twin`) builds it, on random inputs
of its input shapes at the batch: its forward, then its backward from a random output
gradient, each ``repeats`` times after ``warmup`` discarded runs, the device synchronised
around each timed call. The loss is timed on logits of its shape, the optimizer's update on
the whole twin's gradients, and the whole training step (forward, loss, backward, update) as
well, so that the sum of the layers can be held against the step they make up. Every raw
sample is kept; the medians are the figures.

Precisions: ``fp32`` (TF32 off), ``tf32`` (TF32 matrix units on), ``bf16`` and ``fp16``
(``torch.autocast``: the float32 parameters cast per op, as mixed-precision training runs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PRECISIONS", "time_layers"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


def _timed(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int,
           before: Callable[[], Any] | None = None) -> list[float]:  # fmt: skip
    """Seconds of ``fn`` per run, ``before`` (untimed) ahead of each; warm-up runs dropped."""
    samples = []
    for i in range(warmup + repeats):
        state = before() if before is not None else None
        sync()
        start = time.perf_counter()
        fn(state) if before is not None else fn()
        sync()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def _optimizer(name: str, params: Any, torch: Any) -> Any:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01)
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return (torch.optim.Adam if name == "adam" else torch.optim.AdamW)(params, lr=1e-4)


class _Device:
    """Where the twin runs: synchronisation and the precision's autocast."""

    def __init__(self, device: str, precision: str, torch: Any) -> None:
        self.name, self.torch = device, torch
        self.cuda = device.startswith("cuda")
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.name)

    def autocast(self) -> Any:
        return self.torch.autocast(self.name.split(":")[0], dtype=self.dtype,
                                   enabled=self.dtype is not None)  # fmt: skip


def _row(name: str, kind: str, fwd: list[float], bwd: list[float]) -> dict[str, Any]:
    return {
        "name": name, "kind": kind, "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd) if bwd else 0.0,
        "forward_samples": fwd, "backward_samples": bwd,
    }  # fmt: skip


def time_layers(workload: Any, batch: int, precision: str, device: str, torch: Any,
                optimizer: str = "sgd", warmup: int = 3,
                repeats: int = 10) -> dict[str, Any]:  # fmt: skip
    """Every layer's forward and backward, the loss, the update and the whole step of
    ``workload`` at ``batch`` on ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``): medians in
    seconds and every raw sample (module docstring)."""
    from microbench.torch_twin import torch_twin, twin_inputs, twin_loss

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(_OPTIMIZERS)}")
    dev = _Device(device, precision, torch)
    twin = torch_twin(workload, torch).to(device)
    x, y = twin_inputs(workload, batch, torch, device)
    generator = torch.Generator(device=device).manual_seed(1)
    rows = []
    for info, layer in zip(twin.body, twin.layers, strict=True):
        inputs = [_input(workload, info, j, batch, x, torch, device, generator)
                  for j in info.inputs]  # fmt: skip

        def forward(layer: Any = layer, inputs: list[Any] = inputs) -> Any:
            with dev.autocast():
                return layer(*inputs)

        def backward(out: Any) -> None:
            torch.autograd.backward(out, torch.ones_like(out))

        trains = any(t.requires_grad for t in inputs) or any(
            p.requires_grad for p in layer.parameters()
        )
        fwd = _timed(forward, dev.sync, warmup, repeats)
        bwd = _timed(backward, dev.sync, warmup, repeats, before=forward) if trains else []
        rows.append(_row(info.name, info.kind, fwd, bwd))
    with torch.no_grad(), dev.autocast():
        logits = twin(x).float().requires_grad_(True)

    def loss_forward() -> Any:
        return twin_loss(logits, y, torch)

    loss = workload.layers[-1]
    rows.append(_row(loss.name, loss.kind, _timed(loss_forward, dev.sync, warmup, repeats),
                     _timed(lambda out: out.backward(), dev.sync, warmup, repeats,
                            before=loss_forward)))  # fmt: skip
    opt = _optimizer(optimizer, twin.parameters(), torch)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with dev.autocast():
            out = twin_loss(twin(x), y, torch)
        out.backward()
        opt.step()

    steps = _timed(step, dev.sync, warmup, repeats)
    updates = _timed(opt.step, dev.sync, warmup, repeats)  # on the gradients the last step left
    return {
        "workload": workload.name, "batch": batch, "precision": precision,
        "optimizer": optimizer, "device": device, "warmup": warmup, "repeats": repeats,
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if dev.cuda else "cpu",
        "layers": rows, "update_s": statistics.median(updates), "update_samples": updates,
        "step_s": statistics.median(steps), "step_samples": steps,
    }  # fmt: skip


def _input(workload: Any, info: Any, j: int, batch: int, x: Any, torch: Any, device: str,
           generator: Any) -> Any:  # fmt: skip
    """A random input of layer ``info``'s ``j``-th source: the network input itself (token
    ids stay ids), or values of that layer's output shape, tracking a gradient where the layer
    passes one back."""
    if j == -1:
        return x
    shape = (batch, *workload.layers[j].output_shape)
    values = torch.randn(shape, generator=generator, device=device)
    return values.requires_grad_(bool(info.needs_input_grad))
