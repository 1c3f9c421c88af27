"""The shape of a checkpoint's JSON header (:mod:`pdlsim.train.checkpoint`), checked whole.

A resume reads the header's position, sums and finished epochs straight into the training
loop; a header edited by hand (or written by something else) with a field of the wrong type or
missing would otherwise fail there, deep inside (``'list' object has no attribute 'get'``, an
epoch result missing its arguments), or continue from a position that makes no sense (a
negative step). :func:`header_problem` says what is wrong in one phrase, or None.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["EPOCH_FIELDS", "EPOCH_SUM_FIELDS", "header_problem"]

# An entry of ``epochs``: the fields of pdlsim.train.loop.EpochResult.
EPOCH_FIELDS = ("epoch", "steps", "loss", "train_accuracy", "test_accuracy", "time_s",
                "samples_per_s", "phase_mean_s", "peak_rss_bytes_max", "device_pool_bytes_max",
                "model_state_bytes")  # fmt: skip
# ``epoch_sums``: the numbers of pdlsim.train.loop._EpochSums, and its per-phase seconds.
EPOCH_SUM_FIELDS = ("loss", "correct", "elapsed_s")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(doc: Any) -> bool:
    return isinstance(doc, Mapping) and all(_number(v) for v in doc.values())


def _outside(
    field: str, doc: Mapping[str, Any], keys: Any = None, low: float = 0.0, high: float = math.inf
) -> str | None:
    """The first of ``doc``'s numbers ``keys`` (all, by default) outside [low, high], as
    ``field.key`` names it (None when every one is inside): a loss, a time or a byte count is
    never negative, an accuracy never past 1."""
    for key in doc if keys is None else keys:
        if not low <= doc[key] <= high:
            bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f">= {low:g}"
            return f"{field}.{key} must be {bound}, got {doc[key]!r}"
    return None


def _epoch_problem(i: int, doc: Any) -> str | None:
    if not isinstance(doc, Mapping):
        return f"epochs[{i}] is not an object"
    missing = [k for k in EPOCH_FIELDS if k not in doc]
    if missing or set(doc) - set(EPOCH_FIELDS):
        return f"epochs[{i}] needs the fields {', '.join(EPOCH_FIELDS)}"
    if not (_count(doc["epoch"]) and _count(doc["steps"])):
        return f"epochs[{i}] needs counts epoch and steps"
    if doc["epoch"] != i or doc["steps"] < 1:
        return (f"epochs[{i}] must be epoch {i} of at least 1 step, got epoch {doc['epoch']} of "
                f"{doc['steps']} steps")  # fmt: skip
    scalars = ("loss", "train_accuracy", "test_accuracy", "time_s", "samples_per_s")
    if not all(_number(doc[k]) for k in scalars):
        return f"epochs[{i}] needs finite numbers {', '.join(scalars)}"
    if not (_numbers(doc["phase_mean_s"]) and _numbers(doc["model_state_bytes"])):
        return f"epochs[{i}] needs objects of numbers phase_mean_s and model_state_bytes"
    at = f"epochs[{i}]"
    return (
        _outside(at, doc, ("train_accuracy", "test_accuracy"), high=1.0)
        or _outside(at, doc, ("loss", "time_s", "samples_per_s"))
        or _outside(f"{at}.phase_mean_s", doc["phase_mean_s"])
        or _outside(f"{at}.model_state_bytes", doc["model_state_bytes"])
    )


def header_problem(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of a checkpoint header ``doc`` (whose format, version
    and keys are checked already), or None."""
    for key in ("config", "workload", "rng_state", "epoch_sums"):
        if not isinstance(doc[key], Mapping):
            return f"{key} is not an object"
    position = doc["position"]
    if not isinstance(position, Mapping):
        return "position is not an object"
    for key in ("epoch", "step", "global_step"):
        if not _count(position.get(key)):
            return f"position.{key} must be a whole number >= 0, got {position.get(key)!r}"
    sums = doc["epoch_sums"]
    if not all(_number(sums.get(k)) for k in EPOCH_SUM_FIELDS) or not _numbers(
        sums.get("phases_s")
    ):
        return f"epoch_sums needs finite numbers {', '.join(EPOCH_SUM_FIELDS)} and phases_s"
    negative = _outside("epoch_sums", sums, EPOCH_SUM_FIELDS)
    negative = negative or _outside("epoch_sums.phases_s", sums["phases_s"])
    if negative:
        return negative
    if position["step"] == 0 and any(
        [*map(sums.get, EPOCH_SUM_FIELDS), *sums["phases_s"].values()]
    ):
        return "epoch_sums must be 0 at step 0 of an epoch (nothing of it has run)"
    epochs = doc["epochs"]
    if not isinstance(epochs, list):
        return "epochs is not a list"
    for i, entry in enumerate(epochs):
        problem = _epoch_problem(i, entry)
        if problem is not None:
            return problem
    if len(epochs) != position["epoch"]:
        return (
            f"position is in epoch {position['epoch'] + 1}, but {len(epochs)} finished "
            "epoch(s) are recorded"
        )
    return _steps_problem(position, epochs)


def _steps_problem(position: Mapping[str, Any], epochs: list[Any]) -> str | None:
    """Whether ``position``'s steps agree with the finished epochs: every epoch of a run takes
    the same steps, the position's step lies inside the next one, and ``global_step`` (Adam's
    step count and each step's dropout seed on resume) is the steps done, no more."""
    per_epoch = {entry["steps"] for entry in epochs}
    if len(per_epoch) > 1:
        return f"epochs hold different steps per epoch ({', '.join(map(str, sorted(per_epoch)))})"
    if per_epoch and position["step"] >= min(per_epoch):
        return (f"position.step {position['step']} is past the epoch's {min(per_epoch)} "
                "steps")  # fmt: skip
    done = sum(entry["steps"] for entry in epochs) + position["step"]
    if position["global_step"] != done:
        return (
            f"position.global_step must be the {done} steps done ({len(epochs)} finished "
            f"epoch(s) and step {position['step']}), got {position['global_step']!r}"
        )
    return None
