"""The training data's container, shared by the loaders of :mod:`pdlsim.train.data` and
:mod:`pdlsim.train.token_data`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from microbench.errors import UserError

__all__ = ["DataError", "Dataset", "check_counts"]


class DataError(UserError):
    """Data that is missing, malformed, or does not fit the workload."""


@dataclass(frozen=True)
class Dataset:
    """Samples ``x`` (n, *shape) float32 and labels ``y`` int64 in [0, num_classes): (n,), one
    per sample, or (n, tokens), one per token (a language model's next tokens)."""

    x: np.ndarray
    y: np.ndarray
    name: str
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.dtype != np.float32 or not self.x.flags.c_contiguous or self.x.ndim < 2:
            raise ValueError("Dataset.x must be a C-contiguous float32 array (n, *shape)")
        if self.y.dtype != np.int64 or self.y.ndim not in (1, 2) or len(self.y) != len(self.x):
            raise ValueError(f"Dataset.y must be int64 of shape ({self.x.shape[0]}[, tokens])")

    @property
    def labels_per_sample(self) -> int:
        """Labels each sample carries: 1, or its tokens."""
        return 1 if self.y.ndim == 1 else int(self.y.shape[1])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def split(self, n_test: int) -> tuple[Dataset, Dataset]:
        """(train, test): the last ``n_test`` samples are the test set (views, no copies).

        Deterministic by construction; the synthetic set is already shuffled and the MNIST
        and CIFAR-10 files are in no class order, so the tail is a fair sample.
        """
        if not 1 <= n_test < len(self):
            raise DataError(
                f"cannot hold out {n_test} test samples from {self.name} with {len(self)} "
                f"samples; choose between 1 and {len(self) - 1}"
            )
        cut = len(self) - n_test
        head = Dataset(self.x[:cut], self.y[:cut], self.name, self.num_classes)
        tail = Dataset(self.x[cut:], self.y[cut:], self.name, self.num_classes)
        return head, tail


def check_counts(num_classes: int, n_samples: int) -> None:
    """DataError unless a synthetic set asks for 2 or more classes and 1 or more samples."""
    if num_classes < 2:
        raise DataError(f"synthetic data needs at least 2 classes, got {num_classes}")
    if n_samples < 1:
        raise DataError(f"synthetic data needs at least 1 sample, got {n_samples}")
