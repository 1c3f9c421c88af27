"""The Python API: what ``pdlsim predict`` and ``pdlsim sweep`` do, callable from a notebook.

    import pdlsim

    cnn = pdlsim.Workload.load("cnn")  # a preset, a workload JSON file, or a dict like one
    p = pdlsim.predict(cnn, pdlsim.Cluster.gpus(nodes=16, gpus_per_node=4), batch=32)
    p["step_time_s"], p["band"]["p10_s"], p["breakdown"]["comm_s"]
    table = pdlsim.sweep("mlp", nodes=[1, 2, 4, 8], per_node=[1, 2])  # a pandas DataFrame

A prediction is the JSON document that ``pdlsim predict --json`` prints (docs/formats.md), so
that what a script reads and what the command line shows are the same numbers. Options are the
command line's (``pdlsim predict --help``) with dashes as underscores, e.g. ``overlap=False``
or ``network="roce-100g"``. Bad input raises :class:`microbench.errors.UserError`, whose
message is the one line the command line prints.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.profile import Profile, load_profile
from microbench.argtypes import (
    ArgumentTypeError,
    check_flag,
    check_integer,
    check_integers,
    check_name,
    check_text,
)
from microbench.errors import UserError
from microbench.workload import Workload
from pdlsim.cli.sweep import sweep as _sweep
from pdlsim.prediction.checks import unused_inter_node
from pdlsim.prediction.collective import collective_document
from pdlsim.prediction.config import PredictConfig, check_not_an_input, resolve_profile
from pdlsim.prediction.core import run_prediction
from pdlsim.sim import Cluster

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Cluster", "Workload", "collective", "load_profile", "predict", "sweep"]

WorkloadLike = str | Path | Mapping[str, Any] | Workload
ProfileLike = str | Path | Profile | None

# Set from the workload, the cluster and the arguments of their own: not options.
_STRUCTURAL = {"nodes", "gpus", "procs_per_node", "threads", "model", "batch", "profile", "speeds"}
OPTIONS = tuple(f.name for f in fields(PredictConfig) if f.name not in _STRUCTURAL)


def _config(
    workload: WorkloadLike,
    cluster: Cluster,
    batch: int,
    profile: ProfileLike,
    options: Mapping[str, Any],
) -> PredictConfig:
    _known(options, OPTIONS)
    if not isinstance(cluster, Cluster):
        raise ArgumentTypeError(f"cluster must be a pdlsim.Cluster, got {type(cluster).__name__}")
    gpu = cluster.device == "gpu"
    return PredictConfig(
        nodes=cluster.nodes,
        gpus=cluster.ranks_per_node if gpu else 0,
        procs_per_node=1 if gpu else cluster.ranks_per_node,
        threads=cluster.threads_per_rank,
        speeds=cluster.speeds,
        model=Workload.load(workload),
        batch=batch,
        profile=str(profile) if isinstance(profile, Path) else profile,
        **options,
    )


def _known(options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Refuse an option name that is none of ``known`` (a typo would else be ignored or fail
    deep inside)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ArgumentTypeError(
            f"unknown option(s) {', '.join(unknown)}; options: {', '.join(known)}"
        )


def _counts(name: str, values: int | Iterable[int]) -> tuple[int, ...]:
    """One integer or a non-empty list of them (a numpy array too), as a tuple of ints."""
    if not isinstance(values, Iterable) or getattr(values, "ndim", None) == 0:
        return (check_integer(name, values),)  # a number, numpy's or a 0-d array
    return check_integers(name, values)


# pdlsim.collective's options: the flags of ``pdlsim collective``, and how each is checked.
COLLECTIVE_OPTIONS = {
    "node": check_name, "gpus": check_integer, "network": check_name,
    "hardware": check_name, "algorithm": check_name, "protocol": check_name,
}  # fmt: skip


def predict(
    workload: WorkloadLike = "cnn",
    cluster: Cluster | None = None,
    *,
    batch: int = 32,
    profile: ProfileLike = None,
    trace: str | Path | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Predict one training configuration: ``workload`` on ``cluster`` (one CPU rank if None)
    at ``batch`` samples per rank, priced by ``profile`` (a packaged name, a path or a loaded
    :class:`Profile`; the packaged default if None). ``trace`` writes a Chrome trace of the
    simulated timeline. Returns the ``pdlsim predict --json`` document."""
    cfg = _config(workload, cluster or Cluster.cpus(1), batch, profile, options)
    if trace is not None and isinstance(workload, (str, Path)):  # cfg holds it loaded: no path
        check_not_an_input(replace(cfg, model=str(workload)), check_name("trace", trace), "--trace")
    unused = unused_inter_node(cfg, cfg.nodes)  # a sweep's one-node rows are not warned of
    if unused is not None:
        warnings.warn(unused, UserWarning, stacklevel=2)
    return run_prediction(cfg, trace=None if trace is None else check_name("trace", trace))


def collective(
    op: str = "allreduce",
    sizes: int | Iterable[int] = 2**30,
    nodes: int = 1,
    **options: Any,
) -> dict[str, Any]:
    """A GPU collective (``allreduce``, ``reduce_scatter``, ``allgather``) of ``sizes`` bytes
    on ``nodes`` GPU nodes, as ``pdlsim collective --json`` prints it: per size the time,
    algorithm and bus bandwidths and the algorithm NCCL would choose. Options are the
    command's flags with underscores (``node="dgx-a100"``, ``gpus=4``, ``network=...``)."""
    _known(options, COLLECTIVE_OPTIONS)
    checked = {k: None if v is None else COLLECTIVE_OPTIONS[k](k, v) for k, v in options.items()}
    op = check_text("op", op, "'allreduce'").replace("-", "_")
    listed = list(_counts("sizes", sizes))
    return collective_document(op, listed, nodes=check_integer("nodes", nodes), **checked)


def sweep(
    workload: WorkloadLike = "cnn",
    *,
    nodes: Iterable[int] = (1, 2, 4),
    per_node: Iterable[int] = (1,),
    batches: Iterable[int] = (32,),
    gpus: bool = False,
    threads: int = 1,
    profile: ProfileLike = None,
    **options: Any,
) -> pd.DataFrame:
    """Predict every (nodes, ranks per node, batch): one row each, the columns of ``pdlsim
    sweep``'s CSV. ``per_node`` counts GPUs per node when ``gpus``, else CPU processes per
    node running ``threads`` threads each. The profile is loaded once for the whole table."""
    nodes, per_node = _counts("nodes", nodes), _counts("per_node", per_node)
    batches = _counts("batches", batches)
    for name, values in (("nodes", nodes), ("per_node", per_node), ("batches", batches)):
        if min(values) < 1:
            raise UserError(
                f"sweep: {name} must be a non-empty list of positive integers, got {min(values)}"
            )
        if len(set(values)) != len(values):  # as the command line's lists: each value once
            twice = next(v for v in values if values.count(v) > 1)
            raise UserError(f"sweep: {name} lists {twice} twice; give each value once")
    threads = check_integer("threads", threads)
    profile, _ = resolve_profile(profile)
    if check_flag("gpus", gpus):
        if threads != 1:  # as --threads with --gpus: a setting the GPU ranks would ignore
            raise UserError(
                f"sweep: threads={threads} is for CPU ranks; with gpus=True every GPU is one "
                "rank: drop threads (or give gpus=False for CPU ranks)"
            )
        first = Cluster.gpus(1, per_node[0])
    else:
        first = Cluster.cpus(1, per_node[0], threads)
    base = _config(workload, first, batches[0], profile, options)
    return _sweep(replace(base), nodes, per_node, batches)
