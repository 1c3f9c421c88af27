"""The epoch of each workload: how many training samples ``pdlsim predict`` prices an epoch
at and ``pdlsim train`` draws for synthetic data, defined once so that the two agree."""

from __future__ import annotations

__all__ = ["DATASET_SAMPLES", "OTHER_DATASET_SAMPLES", "dataset_samples"]

DATASET_SAMPLES = {"cnn": 50_000, "mlp": 60_000}  # CIFAR-10 and MNIST training sets
OTHER_DATASET_SAMPLES = 50_000  # a workload file's, unless given


def dataset_samples(workload: str, given: int | None = None) -> int:
    """``given`` (``--dataset-samples``, ``--samples``) or the workload's default epoch."""
    return given if given is not None else DATASET_SAMPLES.get(workload, OTHER_DATASET_SAMPLES)
