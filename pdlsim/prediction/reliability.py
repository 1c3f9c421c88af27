"""Checkpoints and failures: what saving state costs, and what restarts cost, per epoch.

A checkpoint writes the model state (float32 weights, plus the optimizer's velocity with
momentum) once per interval; on a data-parallel job one rank writes it, so its cost is

    C = latency + state bytes / write bandwidth

and every rank waits for it (the step after a checkpoint starts when it is on disk). Failures
arrive as a Poisson process: a job on ``nodes`` nodes, each with mean time between failures
``node_mtbf_s``, fails with rate nodes / node_mtbf_s (M = node_mtbf_s / nodes). After a
failure the job restarts (``restart_s``: relaunch and reading the checkpoint back) and redoes
the work since the last checkpoint.

* Young's interval (1974): tau = sqrt(2 C M); Daly's higher-order optimum (2006):
  tau = sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + (C / 2M) / 9] - C for C < 2M, else M.
* Daly's expected wall time to finish W seconds of work, checkpointing every tau seconds of
  work, with exponential failures: T(tau) = M exp(R/M) (exp((tau + C)/M) - 1) W / tau. With no
  failures (M -> infinity) it falls to W (1 + C/tau).

Where C comes from: ``--checkpoint-bw``/``--checkpoint-latency`` when given, else the
profile's ``storage`` model (``python -m microbench storage``: the atomic, fsynced write the
checkpoint writer does, fitted as latency + bytes / bandwidth per size regime; the regime
covering the state's size is used, and with ``--checkpoint-bw`` alone the smallest files'
latency), else the assumptions below. The report says which (``cost_source``, the provenance's
``checkpoint cost``, and ``assumed``). The storage model describes the directory the profile's
machine measured; a cluster's parallel file system must be measured there. Not modelled:
serialising the state (``np.savez`` into memory, part of a real checkpoint's time).

Assumptions: failures are independent and exponential; a failure during a checkpoint or a
restart is covered by Daly's formula; checkpoints do not overlap computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from microbench.errors import UserError

__all__ = [
    "CheckpointPlan",
    "check_checkpoint_flags",
    "checkpoint_for_prediction",
    "format_checkpoint",
    "checkpoint_cost_s",
    "daly_interval_s",
    "expected_time_s",
    "young_interval_s",
]


def checkpoint_cost_s(state_bytes: float, write_bytes_per_s: float, latency_s: float) -> float:
    """Seconds to write one checkpoint of ``state_bytes``."""
    if write_bytes_per_s <= 0 or latency_s < 0 or state_bytes < 0:
        raise ValueError("need state_bytes >= 0, write bandwidth > 0 and latency >= 0")
    return latency_s + state_bytes / write_bytes_per_s


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum interval: sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum interval of computation between checkpoints."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s


def expected_time_s(
    work_s: float, interval_s: float, cost_s: float, mtbf_s: float, restart_s: float
) -> float:
    """Daly's expected wall time for ``work_s`` of computation (``mtbf_s`` = inf: no failures)."""
    if interval_s <= 0:
        raise ValueError(f"the checkpoint interval must be positive, got {interval_s}")
    if math.isinf(mtbf_s):
        return work_s * (1.0 + cost_s / interval_s)
    m = mtbf_s
    try:
        cycle = math.exp(restart_s / m) * math.expm1((interval_s + cost_s) / m)
        expected = m * cycle * work_s / interval_s
    except OverflowError:
        expected = math.inf
    if not math.isfinite(expected):
        raise UserError(
            f"a failure every {m:.3g} s (the nodes' MTBF over the nodes) against a restart of "
            f"{restart_s:.3g} s and {interval_s + cost_s:.3g} s between checkpoints: the job would "
            "never finish; check --mtbf, --restart-time and --checkpoint-every"
        )
    return expected


@dataclass(frozen=True)
class CheckpointPlan:
    """One job's checkpointing: steps between checkpoints (None: Daly's optimum) and the
    machine's write bandwidth, latency, per-node MTBF and restart time."""

    state_bytes: int
    write_bytes_per_s: float
    latency_s: float
    node_mtbf_s: float  # math.inf: no failures
    restart_s: float
    every_steps: int | None = None
    cost_source: str = "given"  # where latency and bandwidth came from
    assumed: tuple[str, ...] = ()  # the flags whose defaults (assumptions) were used

    def report(self, step_s: float, steps_per_epoch: int, nodes: int) -> dict[str, float | int]:
        """Cost per checkpoint, the interval used and Daly's optimum, the expected epoch time
        with checkpoints and restarts, and its overhead over the bare epoch."""
        cost = checkpoint_cost_s(self.state_bytes, self.write_bytes_per_s, self.latency_s)
        mtbf = self.node_mtbf_s / nodes
        optimum_s = daly_interval_s(cost, mtbf) if math.isfinite(mtbf) else math.inf
        if self.every_steps is not None:
            every = self.every_steps
        elif math.isfinite(optimum_s):
            every = max(1, round(optimum_s / step_s))
        else:
            every = steps_per_epoch  # no failures: once an epoch, at its end
        work = steps_per_epoch * step_s
        epoch = expected_time_s(work, every * step_s, cost, mtbf, self.restart_s)
        return {
            "checkpoint_cost_s": cost,
            "latency_s": self.latency_s,
            "write_bytes_per_s": (
                self.write_bytes_per_s if math.isfinite(self.write_bytes_per_s) else None
            ),
            "cost_source": self.cost_source,
            "assumed": list(self.assumed),
            "state_bytes": self.state_bytes,
            "every_steps": every,
            "optimal_every_steps": (
                max(1, round(optimum_s / step_s)) if math.isfinite(optimum_s) else None
            ),
            "young_interval_s": young_interval_s(cost, mtbf) if math.isfinite(mtbf) else None,
            "daly_interval_s": optimum_s if math.isfinite(optimum_s) else None,
            "job_mtbf_s": mtbf if math.isfinite(mtbf) else None,
            "epoch_time_s": epoch,
            "overhead_fraction": epoch / work - 1.0,
        }


# ---------------------------------------------------------------------------- command line
DEFAULT_WRITE_RATE = "1GB/s"  # assumption: one writer's share of a parallel file system
DEFAULT_LATENCY = "10ms"  # assumption: open, fsync and rename of one file
DEFAULT_RESTART = "60s"  # assumption: relaunch the job and read the checkpoint back
# Steps between checkpoints, at most: the longest training runs take about a million steps, so
# a billion is past any; a count with extra zeros (1e30) is a typo, not a plan.
MAX_CHECKPOINT_EVERY = 10**9


PROFILE_SOURCE = "profile (storage)"


def profile_storage_model(profile_name: str | None) -> Any:
    """The profile's :class:`calibration.storage.StorageModel`, or None when it has none. The
    profile is loaded here: the prediction has read it once already, and this costs a second
    read only when checkpoints are asked for without both cost flags."""
    from microbench.errors import UserError
    from pdlsim.prediction.config import resolve_profile

    profile, name = resolve_profile(profile_name)
    try:
        return profile.model("storage")
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"--profile {name}: models.storage is unusable ({exc})") from None


def check_checkpoint_flags(cfg: Any) -> tuple[int | None, float, float | None, float | None]:
    """The checkpoint flags of ``cfg`` read and checked, without the profile or the step: the
    steps between checkpoints (None: auto or not given), the node MTBF (inf: none), the write
    bandwidth and latency (None: not given). Run before any simulating
    (:func:`pdlsim.prediction.build.check_config`), so that a typo is refused at once."""
    from microbench.errors import UserError, shown_text
    from pdlsim.prediction.config import parse_rate, parse_time

    every: int | None = None
    if cfg.checkpoint_every not in (None, "auto"):
        try:
            every = int(cfg.checkpoint_every)
        except ValueError:
            every = 0
        if every < 1:
            raise UserError(
                f"--checkpoint-every: expected a positive number of steps or 'auto', "
                f"got '{shown_text(cfg.checkpoint_every)}'"
            )
        if every > MAX_CHECKPOINT_EVERY:
            raise UserError(
                f"--checkpoint-every: at most {MAX_CHECKPOINT_EVERY:,} steps (past any training "
                f"run), got {every:,}"
            )
    mtbf = parse_time(cfg.mtbf, "--mtbf") if cfg.mtbf is not None else math.inf
    if mtbf <= 0:
        raise UserError(f"--mtbf must be positive, got '{cfg.mtbf}'")
    if cfg.checkpoint_every == "auto" and math.isinf(mtbf):
        raise UserError("--checkpoint-every auto needs --mtbf (the optimum trades off failures)")
    bandwidth = parse_rate(cfg.checkpoint_bw, "--checkpoint-bw") if cfg.checkpoint_bw else None
    latency = None
    if cfg.checkpoint_latency:
        latency = parse_time(cfg.checkpoint_latency, "--checkpoint-latency")
    if cfg.restart_time is not None:
        parse_time(cfg.restart_time, "--restart-time")
    return every, mtbf, bandwidth, latency


def plan_from_config(cfg: Any, state_bytes: int) -> CheckpointPlan | None:
    """The checkpoint plan ``pdlsim predict`` flags ask for; None when no flag was given.
    Latency and bandwidth: the flags, else the profile's storage model, else the defaults."""
    from pdlsim.prediction.config import parse_rate, parse_time

    flags = (cfg.checkpoint_every, cfg.checkpoint_bw, cfg.checkpoint_latency, cfg.mtbf,
             cfg.restart_time)  # fmt: skip
    if all(f is None for f in flags):
        return None
    every, mtbf, bandwidth, latency = check_checkpoint_flags(cfg)
    fitted = None  # (latency_s, bytes_per_s) from the profile: its line at the state's size
    if bandwidth is None or latency is None:
        model = profile_storage_model(cfg.profile)
        if model is not None:
            fitted = model.cost(state_bytes)
            if bandwidth is not None:  # a latency alone: the small files' fixed cost
                fitted = (model.latency_s, fitted[1])
    sources, assumed = {}, []
    for what, flag, value, default in (
        ("bandwidth", "--checkpoint-bw", bandwidth, DEFAULT_WRITE_RATE),
        ("latency", "--checkpoint-latency", latency, DEFAULT_LATENCY),
    ):
        if value is not None:
            sources[what] = flag
        elif fitted is not None:
            sources[what] = PROFILE_SOURCE
        else:
            sources[what] = f"assumed {default}"
            assumed.append(flag)
    if bandwidth is None:
        bandwidth = fitted[1] if fitted else parse_rate(DEFAULT_WRITE_RATE)
    if latency is None:
        latency = fitted[0] if fitted else parse_time(DEFAULT_LATENCY)
    if cfg.restart_time is None:
        assumed.append("--restart-time")
    if sources["bandwidth"] == sources["latency"]:
        source = sources["bandwidth"]
    elif all(v.startswith("assumed") for v in sources.values()):
        source = f"assumed {DEFAULT_WRITE_RATE} and {DEFAULT_LATENCY}"
    else:
        source = "; ".join(f"{k} {v}" for k, v in sources.items())
    return CheckpointPlan(
        state_bytes=state_bytes,
        write_bytes_per_s=bandwidth,
        latency_s=latency,
        node_mtbf_s=mtbf,
        restart_s=parse_time(cfg.restart_time or DEFAULT_RESTART, "--restart-time"),
        every_steps=every,
        cost_source=source,
        assumed=tuple(sorted(assumed)),
    )


def checkpoint_for_prediction(cfg: Any, out: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint report of a ``pdlsim predict`` result (weights + optimizer state); it
    also adds ``checkpoint cost`` (where latency and bandwidth came from) to
    ``out["provenance"]``."""
    memory = out["memory_breakdown_bytes"]
    plan = plan_from_config(cfg, memory["weights"] + memory["optimizer_state"])
    if plan is None:
        return None
    steps = max(1, round(out["epoch_time_s"] / out["step_time_s"]))
    out["provenance"]["checkpoint cost"] = plan.cost_source
    return plan.report(out["step_time_s"], steps, cfg.nodes)


def format_checkpoint(doc: dict[str, Any]) -> str:
    every = f"every {doc['every_steps']} steps"
    if doc["optimal_every_steps"] is not None:
        every += f" (Daly's optimum {doc['optimal_every_steps']})"
    line = (
        f"checkpoints      {doc['checkpoint_cost_s'] * 1e3:.1f} ms each ({doc['state_bytes']:,} B"
        f", {doc['cost_source']})"
        f", {every}; expected epoch with checkpoints"
        + (" and restarts" if doc["job_mtbf_s"] is not None else "")
        + f" +{100 * doc['overhead_fraction']:.2f}%"
    )
    if doc["assumed"]:
        line += f" [assumed: {', '.join(doc['assumed'])}]"
    return line
