"""The simulator and its analytic twin: predict a data-parallel training step on a cluster.

``simulate(cluster, scenario, cost)`` (simpy, :mod:`pdlsim.sim.engine`) and
``predict(cluster, scenario, cost)`` (closed form, :mod:`pdlsim.sim.analytic`) consume the
same :class:`CostModel` and return the same :class:`Prediction`: T_step and its breakdown
T_compute + T_comm + T_sync - T_overlap, per step and averaged. Imports numpy, scipy, simpy and
the workload description only.
"""

from .analytic import predict
from .cluster import DDP_BUCKET_BYTES, Bucket, Cluster, ConfigError, Scenario, StepPlan, build_plan
from .collectives import Step, TimedStep
from .cost import (
    CostModel,
    Jitter,
    LinearCostModel,
    LinkCost,
    LognormalJitter,
    Placement,
    max_of_draws,
)
from .engine import simulate, simulate_factors
from .result import BucketReport, Prediction, StepBreakdown
from .trace import Timeline, write_chrome_trace

__all__ = [
    "DDP_BUCKET_BYTES",
    "Bucket",
    "BucketReport",
    "Cluster",
    "ConfigError",
    "CostModel",
    "Jitter",
    "LinearCostModel",
    "LinkCost",
    "LognormalJitter",
    "Placement",
    "Prediction",
    "Scenario",
    "Step",
    "StepBreakdown",
    "StepPlan",
    "TimedStep",
    "Timeline",
    "build_plan",
    "max_of_draws",
    "predict",
    "simulate",
    "simulate_factors",
    "write_chrome_trace",
]
