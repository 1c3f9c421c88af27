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

import json
import math
from typing import Any, NoReturn

from microbench.errors import UserError, shown_text, shown_value
from microbench.fileio import read_json
from pdlsim.costmodel.limits import MAX_TIME_S, MIN_TIME_S
from pdlsim.prediction.config import PredictConfig
from pdlsim.prediction.gpu_step import given_compute

__all__ = ["with_layer_times"]


_NEEDED = ("workload", "batch", "precision", "optimizer", "device", "layers", "step_s", "update_s")
_TIMES = ("forward_s", "backward_s")  # each layer's, in seconds


def _shown(value: Any) -> str:
    """``value`` as the file spells it (null, "1e-5", Infinity), cut short: for messages."""
    try:
        return shown_text(json.dumps(value))
    except ValueError:  # a whole number too long to print
        return shown_value(value)


class _Checker:
    """Checks of one layer-times document, each refusal one :class:`UserError` line naming the
    file, the field's path in it (``layers[3].forward_s``) and what belongs there."""

    def __init__(self, path: str) -> None:
        self.flag = f"--layer-times {path}"

    def refuse(self, field: str, value: Any, expected: str) -> NoReturn:
        raise UserError(
            f"{self.flag}: {field} is {_shown(value)}, expected {expected}; fix the file or time "
            "it again (pdlsim bench --layer-times)"
        )

    def seconds(self, value: Any, field: str, positive: bool = False) -> float:
        """``value`` as seconds: a JSON number (not a bool, a string or null), finite, >= 0 (>
        0 with ``positive``) and at most :data:`MAX_TIME_S`, as ``--step-time``. NaN or
        infinity would pass through the scaling unnoticed and price every layer wrong, or blame
        another field; a step of 1e300 s was printed as a 300-digit step time."""
        expected = (
            f"a finite JSON number of seconds {'> 0' if positive else '>= 0'} and at most "
            f"{MAX_TIME_S:.0e}"
        )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.refuse(field, value, expected)
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            self.refuse(field, value, expected)
        if not 0 <= number <= MAX_TIME_S or (positive and number == 0):  # NaN fails too
            self.refuse(field, value, expected)
        if 0 < number < MIN_TIME_S:  # 1e-300 s: no layer runs in under a picosecond
            self.refuse(field, value, f"0 or at least {MIN_TIME_S:g} seconds")
        return number

    def text(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            self.refuse(field, value, "a string")
        return value

    def layers(self, rows: Any) -> dict[str, dict[str, float]]:
        """The ``layers`` list as {name: {"forward_s": s, "backward_s": s}}; each row checked,
        and a name timed twice refused (which of the two should count is not for us to guess)."""
        if not isinstance(rows, list):
            self.refuse("layers", rows, "a list of {name, forward_s, backward_s} rows")
        timed: dict[str, dict[str, float]] = {}
        for i, row in enumerate(rows):
            where = f"layers[{i}]"
            if not isinstance(row, dict):
                self.refuse(where, row, "an object with name, forward_s and backward_s")
            for key in ("name", *_TIMES):
                if key not in row:
                    raise UserError(
                        f"{self.flag}: {where} has no {key}; each layer needs name, forward_s "
                        "and backward_s (pdlsim bench --layer-times writes them)"
                    )
            name = self.text(row["name"], f"{where}.name")
            if name in timed:
                raise UserError(f"{self.flag}: {where}.name {name!r} is timed twice; keep one row")
            timed[name] = {key: self.seconds(row[key], f"{where}.{key}") for key in _TIMES}
        return timed


def _load(path: str) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The document at ``path`` and its layers' times, the whole of it checked before any of
    it is used: every field read has the right type, every time is finite and in range."""
    doc = read_json(path, f"--layer-times {path}")
    if not isinstance(doc, dict) or any(k not in doc for k in _NEEDED):
        raise UserError(
            f"--layer-times {path}: not a layer-times file (pdlsim bench --layer-times writes "
            f"one); it needs {', '.join(_NEEDED)}"
        )
    check = _Checker(path)
    for key in ("workload", "precision", "optimizer", "device"):
        check.text(doc[key], key)
    for key in ("device_name", "torch_version"):
        if key in doc:
            check.text(doc[key], key)
    batch = doc["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        check.refuse("batch", batch, "a whole number >= 1")
    check.seconds(doc["step_s"], "step_s", positive=True)
    check.seconds(doc["update_s"], "update_s")
    return doc, check.layers(doc["layers"])


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
    doc, timed = _load(cfg.layer_times)
    asked = {"workload": workload.name, "batch": cfg.batch, "precision": cfg.precision,
             "optimizer": cfg.optimizer}  # fmt: skip
    for key, value in asked.items():
        if doc[key] != value:
            raise UserError(
                f"{flag} timed {key} {doc[key]!r}, this prediction has {value!r}: time the "
                f"configuration predicted (pdlsim bench --layer-times)"
            )
    if not doc["device"].startswith("cuda"):
        raise UserError(f"{flag} was timed on {doc['device']!r}, not a GPU: GPU ranks need a GPU's")
    missing = [info.name for info in workload.layers if info.name not in timed]
    if missing:
        raise UserError(f"{flag} has no times for layer(s) {', '.join(missing[:3])}")
    names = {info.name for info in workload.layers}
    extra = [name for name in timed if name not in names]  # another network's, or a typo
    if extra:
        raise UserError(
            f"{flag} times layer(s) {', '.join(shown_text(n) for n in extra[:3])} that workload "
            f"{workload.name} lacks: time the workload predicted (pdlsim bench --layer-times)"
        )
    layers_s = sum(timed[info.name]["forward_s"] + timed[info.name]["backward_s"]
                   for info in workload.layers)  # fmt: skip
    step_s, update_s = float(doc["step_s"]), float(doc["update_s"])
    if update_s >= step_s:
        raise UserError(f"{flag}: its step ({step_s} s) must exceed its update ({update_s} s)")
    if not 0 < layers_s < math.inf:
        raise UserError(
            f"{flag}: its layers' forward and backward times add up to {layers_s:.3g} s; they need "
            "to add up to a finite time > 0 (time them again: pdlsim bench --layer-times)"
        )
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
