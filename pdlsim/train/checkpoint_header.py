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


def _epoch_problem(i: int, doc: Any) -> str | None:
    if not isinstance(doc, Mapping):
        return f"epochs[{i}] is not an object"
    missing = [k for k in EPOCH_FIELDS if k not in doc]
    if missing or set(doc) - set(EPOCH_FIELDS):
        return f"epochs[{i}] needs the fields {', '.join(EPOCH_FIELDS)}"
    if not (_count(doc["epoch"]) and _count(doc["steps"])):
        return f"epochs[{i}] needs counts epoch and steps"
    scalars = ("loss", "train_accuracy", "test_accuracy", "time_s", "samples_per_s")
    if not all(_number(doc[k]) for k in scalars):
        return f"epochs[{i}] needs finite numbers {', '.join(scalars)}"
    if not (_numbers(doc["phase_mean_s"]) and _numbers(doc["model_state_bytes"])):
        return f"epochs[{i}] needs objects of numbers phase_mean_s and model_state_bytes"
    return None


def header_problem(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of a checkpoint header ``doc`` (whose format, version
    and keys are checked already), or None."""
    for key in ("config", "workload", "rng_state", "epoch_sums"):
        if not isinstance(doc[key], Mapping):
            return f"{key} is not an object"
    position = doc["position"]
    if not isinstance(position, Mapping) or not all(
        _count(position.get(k)) for k in ("epoch", "step", "global_step")
    ):
        return "position needs integer epoch, step and global_step, each >= 0"
    sums = doc["epoch_sums"]
    if not all(_number(sums.get(k)) for k in EPOCH_SUM_FIELDS) or not _numbers(
        sums.get("phases_s")
    ):
        return f"epoch_sums needs finite numbers {', '.join(EPOCH_SUM_FIELDS)} and phases_s"
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
    return None
