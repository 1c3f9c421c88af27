"""The document ``pdlsim predict --json`` prints, the same for every parallel mode.

Definitions: speedup = replicas x the one-device step / the step (replicas: the data-parallel
copies of the model, each of ``samples_per_step / replicas`` samples); efficiency = speedup /
devices; communication overhead = exposed communication (T_comm - T_overlap) over T_step; epoch
= ceil(dataset / samples per step) steps.

The band is the prediction's spread around its step time: each draw's mean step
(:func:`band_step_times`) divided by the draws' median, times the step time. Its P50 is the
step time itself, and P10 <= step <= P90 holds in every report (``predict``, ``sweep``, the
JSON and the CSVs). The draws keep their relative spread (the fitted parameters' intervals and
jitter); what they lose is the offset of their median from the full simulation's step, which
comes from their fewer steps and other jitter seeds, not from the machine.

Energy (:mod:`pdlsim.prediction.energy`) and, where asked, checkpoints and restarts
(:mod:`pdlsim.prediction.reliability`) are added from the finished document.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pdlsim.prediction.energy import energy_for_prediction
from pdlsim.prediction.reliability import checkpoint_for_prediction

__all__ = ["band_step_times", "prediction_document"]


def band_step_times(
    run: Any, cluster: Any, scenario: Any, cost: Any, samples: int, seed: int, iterations: int
) -> list[float]:
    """The band's step times: ``samples`` runs of ``run(cluster, scenario, cost)``, each with
    a perturbed cost model (:meth:`~pdlsim.costmodel.model.ProfileCostModel.perturbed`, run i with
    the machine's speed drawn from stratum i of ``samples``; its straggler's draw slows the
    cluster's last rank) and its own jitter seed, over ``iterations`` steps."""
    import numpy as np

    short = replace(scenario, iterations=iterations)
    rng = np.random.default_rng(seed)
    times = []
    for i in range(samples):
        drawn = cost.perturbed(rng, stratum=(i, samples))
        ranks = cluster if drawn.straggler is None else replace(
            cluster, straggler=drawn.straggler.factor
        )  # fmt: skip
        times.append(run(ranks, replace(short, seed=seed + 1 + i), drawn).step_time_s)
    return times


def prediction_document(
    cfg: Any,
    cluster: Any,
    breakdown: Any,
    band_s: list[float],
    *,
    base_step_s: float,
    replicas: int,
    samples_per_step: int,
    dataset: int,
    memory: dict[str, int],
    provenance: dict[str, str],
    gpu: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """One prediction as a JSON-ready dict; ``extra`` keys (buckets, parallel, ...) go in as
    given."""
    import numpy as np

    b, devices = breakdown, cluster.ranks
    step = b.step_s
    speedup = replicas * base_step_s / step
    p10, p50, p90 = (float(v) for v in np.percentile(band_s, [10, 50, 90]))
    low, high = min(step, step * (p10 / p50)), max(step, step * (p90 / p50))
    out = {
        "step_time_s": step,
        "epoch_time_s": math.ceil(dataset / samples_per_step) * step,
        "throughput_samples_per_s": samples_per_step / step,
        "speedup": speedup,
        "efficiency": speedup / devices,
        "comm_overhead_pct": 100.0 * (b.comm_s - b.overlap_s) / step,
        "breakdown": {
            "compute_s": b.compute_s,
            "comm_s": b.comm_s,
            "sync_s": b.sync_s,
            "overlap_s": b.overlap_s,
        },
        "band": {"p10_s": low, "p50_s": step, "p90_s": high},
        "memory_bytes_per_rank": memory["total"],
        "memory_breakdown_bytes": memory,
        "gpu_utilization": (b.compute_s - b.h2d_exposed_s) / step
        if cluster.device == "gpu"
        else None,
        "single_device_step_time_s": base_step_s,
        "dataset_samples": dataset,
        "samples_per_step": samples_per_step,
        "config": {**cfg.to_dict(), "mode": cluster.mode, "devices": devices},
        **extra,
        "provenance": provenance,
    }
    if cluster.device == "gpu" and gpu is not None and memory["total"] > gpu.memory_bytes:
        out["warning"] = (  # refused unless asked for (pdlsim.prediction.checks)
            f"needs {memory['total'] / 1e9:.1f} GB per GPU, more than the {gpu.name}'s "
            f"{gpu.memory_bytes / 1e9:.1f} GB: predicted anyway (--allow-oversubscribed-memory)"
        )
    checkpoint = checkpoint_for_prediction(cfg, out)
    if checkpoint is not None:
        out["checkpoint"] = checkpoint
    out["energy"] = energy_for_prediction(cfg, out, gpu)
    out["provenance"]["power_model"] = out["energy"]["source"]
    out["data_sheet"] = sorted(k for k, v in out["provenance"].items() if "data sheet" in v)
    return out
