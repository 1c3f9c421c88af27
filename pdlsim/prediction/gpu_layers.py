"""GPU compute measured on a GPU: ``pdlsim predict --layer-times FILE`` prices GPU ranks from
the layers ``pdlsim bench --layer-times`` timed there with PyTorch
(:mod:`microbench.layer_times`), instead of a data sheet's roofline.

The file holds each layer's forward and backward timed alone, the optimizer's update and the
whole training step, for one workload, batch and precision on one GPU. Layers timed alone do
not add up to the step they make up (launches overlap, caches are warm or not), so the
measured layers give the split and the measured step the total: every forward and backward
is multiplied by one factor, (step - update) / the layers' sum, and each layer's update is the
measured update's share by its parameters. The file must describe the configuration
predicted (same workload, batch, precision and optimizer): a measurement is not stretched to
another.
"""

from __future__ import annotations

from typing import Any

from microbench.errors import UserError
from microbench.fileio import read_json
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.gpu_step import given_compute

__all__ = ["with_layer_times"]


def _load(path: str) -> dict[str, Any]:
    doc = read_json(path, f"--layer-times {path}")
    needed = ("workload", "batch", "precision", "optimizer", "device", "layers", "step_s",
              "update_s")  # fmt: skip
    if not isinstance(doc, dict) or any(k not in doc for k in needed):
        raise UserError(
            f"--layer-times {path}: not a layer-times file (pdlsim bench --layer-times writes "
            f"one); it needs {', '.join(needed)}"
        )
    return doc


def with_layer_times(cfg: PredictConfig, cost: Any, workload: Any) -> tuple[Any, dict[str, str]]:
    """``cost`` with its GPU layers priced from ``cfg.layer_times``, and the provenance line;
    ``cost`` itself without the flag."""
    if cfg.layer_times is None:
        return cost, {}
    flag = f"--layer-times {cfg.layer_times}"
    if cfg.gpus == 0:
        raise UserError(f"{flag} times GPU layers: add --gpus G")
    if cfg.step_time is not None or cfg.mfu is not None or cfg.step_time_accum is not None:
        raise UserError(f"{flag} measures the GPU step itself: drop --step-time/--mfu "
                        "(and --step-time-accum)")  # fmt: skip
    doc = _load(cfg.layer_times)
    asked = {"workload": workload.name, "batch": cfg.batch, "precision": cfg.precision,
             "optimizer": cfg.optimizer}  # fmt: skip
    for key, value in asked.items():
        if doc[key] != value:
            raise UserError(
                f"{flag} timed {key} {doc[key]!r}, this prediction has {value!r}: time the "
                f"configuration predicted (pdlsim bench --layer-times)"
            )
    if not str(doc["device"]).startswith("cuda"):
        raise UserError(f"{flag} was timed on {doc['device']!r}, not a GPU: GPU ranks need a GPU's")
    timed = {row["name"]: row for row in doc["layers"]}
    missing = [info.name for info in workload.layers if info.name not in timed]
    if missing:
        raise UserError(f"{flag} has no times for layer(s) {', '.join(missing[:3])}")
    layers_s = sum(timed[info.name]["forward_s"] + timed[info.name]["backward_s"]
                   for info in workload.layers)  # fmt: skip
    step_s, update_s = float(doc["step_s"]), float(doc["update_s"])
    if not (0 <= update_s < step_s and layers_s > 0):
        raise UserError(f"{flag}: its step ({step_s} s) must exceed its update ({update_s} s)")
    factor = (step_s - update_s) / layers_s
    params = max(1, workload.param_count)
    table: dict[tuple[str, str], float] = {}
    for info in workload.layers:
        row = timed[info.name]
        table[info.name, "forward"] = row["forward_s"] * factor
        table[info.name, "backward"] = row["backward_s"] * factor
        table[info.name, "update"] = update_s * info.param_count / params
    line = (
        f"measured: {doc.get('device_name', doc['device'])}, torch {doc.get('torch_version')}, "
        f"{doc['precision']} ({flag}): each layer timed alone, scaled x{factor:.3g} to the "
        f"measured step of {step_s * 1e3:.4g} ms"
    )
    return given_compute(cost, gpu_layer_s=table), {"compute": line}
