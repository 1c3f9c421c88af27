"""``pdlsim validate``'s checkpoint check: the measured checkpoint write against the prediction.

One configuration: the MLP, serial (P1T1), at the validation's smallest batch, trained by
``pdlsim train --checkpoint-every`` :data:`EVERY_STEPS` for :data:`STEPS` steps, so that rank 0
writes :data:`CHECKPOINTS` checkpoints (after every K-th step and at the end). Each adds a
``checkpoint`` record to rank 0's records with its ``write_s`` (serialising the state to an
in-memory ``.npz``, the atomic fsynced write, pruning old checkpoints) and the file's
``bytes``. Measured: the median ``write_s`` over the run's checkpoints, interval min..max.

Predicted: ``checkpoint_cost_s`` of ``pdlsim predict --checkpoint-every K`` for the same
configuration and the same profile as the rest of the validation
(:mod:`pdlsim.prediction.reliability`): latency + state bytes / bandwidth from the profile's
storage model when it has one, else the stated assumptions; ``cost_source`` says which, so an error
against an assumption is not read as the model's. The prediction prices the weights and optimizer
state; the file adds a JSON header and the zip directory (both bytes figures are reported).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from pdlsim.validate.measure import launch_train, run_records
from pdlsim.validate.plan import RunSpec, ValidateConfig

__all__ = [
    "CHECKPOINTS",
    "EVERY_STEPS",
    "STEPS",
    "checkpoint_spec",
    "compare",
    "format_checkpoint_check",
    "measured_checkpoints",
    "predicted_checkpoint",
    "validate_checkpoint",
]

MODEL = "mlp"
EVERY_STEPS = 4
STEPS = 40
CHECKPOINTS = (STEPS - 1) // EVERY_STEPS + 1  # every K-th step before the last, and the end


def checkpoint_spec(cfg: ValidateConfig) -> RunSpec:
    """The configuration checkpoints are validated on: the MLP, serial, smallest batch."""
    return RunSpec(MODEL, 1, 1, min(cfg.batches))


def measured_checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """The ``checkpoint`` records of rank 0 (``rank0*.jsonl``), in the order written."""
    found = run_records(Path(run_dir), "rank0*.jsonl", "checkpoint")
    if not found:
        raise UserError(f"no checkpoint records in {run_dir} (was --checkpoint-every given?)")
    return found


def predicted_checkpoint(spec: RunSpec, cfg: ValidateConfig) -> dict[str, Any]:
    """The ``checkpoint`` part of ``pdlsim predict --checkpoint-every`` :data:`EVERY_STEPS`
    for ``spec`` from ``cfg.profile`` (the cost does not depend on the simulated step, so a
    short simulation suffices)."""
    from microbench.threads import available_cores
    from pdlsim.prediction.config import PredictConfig
    from pdlsim.prediction.core import run_prediction

    pcfg = PredictConfig(
        nodes=1, gpus=0, procs_per_node=spec.procs, threads=spec.threads, model=spec.model,
        batch=spec.batch, profile=cfg.profile, overlap=False, iterations=10, samples=2,
        cpu_sockets=(1, available_cores()), checkpoint_every=str(EVERY_STEPS),
    )  # fmt: skip
    return run_prediction(pcfg)["checkpoint"]


def compare(records: list[dict[str, Any]], predicted: dict[str, Any]) -> dict[str, Any]:
    """Measured (median, min..max of ``write_s``) against ``predicted["checkpoint_cost_s"]``."""
    writes = [float(r["write_s"]) for r in records]
    measured = statistics.median(writes)
    cost = float(predicted["checkpoint_cost_s"])
    low, high = min(writes), max(writes)
    return {
        "checkpoints": len(writes),
        "write_s": writes,
        "file_bytes": int(statistics.median(int(r["bytes"]) for r in records)),
        "measured_s": measured,
        "measured_low_s": low,
        "measured_high_s": high,
        "predicted_s": cost,
        "predicted_state_bytes": int(predicted["state_bytes"]),
        "predicted_latency_s": float(predicted["latency_s"]),
        "predicted_write_bytes_per_s": predicted["write_bytes_per_s"],
        "cost_source": predicted["cost_source"],
        "rel_error": abs(cost - measured) / measured if measured > 0 else math.inf,
        "in_interval": bool(low <= cost <= high),
        "timed": "rank 0's save: state to .npz in memory, atomic fsynced write, pruning",
    }


def validate_checkpoint(cfg: ValidateConfig, log: Any = print) -> dict[str, Any]:
    """Train :func:`checkpoint_spec` with checkpoints, predict their cost, compare."""
    spec = checkpoint_spec(cfg)
    run_dir = cfg.out / "runs" / f"{spec.label}-checkpoint" / "r0"
    launch_train(spec, STEPS, run_dir, extra=("--checkpoint-every", str(EVERY_STEPS)))
    doc = compare(measured_checkpoints(run_dir), predicted_checkpoint(spec, cfg))
    doc = {"configuration": spec.label, "every_steps": EVERY_STEPS, "steps": STEPS, **doc}
    doc["run_dir"] = str(run_dir)
    log(format_checkpoint_check(doc))
    return doc


def format_checkpoint_check(doc: dict[str, Any]) -> str:
    """One line: measured median [min..max] over the writes, predicted, its source, error."""
    return (
        f"checkpoint write ({doc['configuration']}, every {doc['every_steps']} steps, "
        f"{doc['checkpoints']} writes of {doc['file_bytes']:,} B): measured "
        f"{doc['measured_s'] * 1e3:.3f} ms [{doc['measured_low_s'] * 1e3:.3f}.."
        f"{doc['measured_high_s'] * 1e3:.3f}], predicted {doc['predicted_s'] * 1e3:.3f} ms "
        f"for {doc['predicted_state_bytes']:,} B ({doc['cost_source']}), error "
        f"{100 * doc['rel_error']:.1f}%"
    )
