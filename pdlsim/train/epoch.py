"""An epoch's data and steps: the training and test sets a run draws or reads, and how many
global batches of them an epoch takes. Light on purpose: ``pdlsim train`` checks both in the
launching process before it starts any rank, without loading the network's kernels."""

from __future__ import annotations

from microbench.errors import UserError
from microbench.workload import Workload
from pdlsim.prediction.epoch import dataset_samples
from pdlsim.train.config import TrainConfig
from pdlsim.train.data import (
    Dataset,
    check_sets_fit_memory,
    load_dataset,
    samples_flag,
    synthetic_count,
)

__all__ = ["checked_train_samples", "model_steps_per_epoch", "prepare_data", "steps_per_epoch"]


def _train_count(config: TrainConfig, workload: Workload) -> int | None:
    """The training samples asked for (synthetic, unasked: as many as the epoch ``pdlsim
    predict`` prices, :func:`pdlsim.prediction.epoch.dataset_samples`; None: all of a file)."""
    if config.samples is None and config.data == "synthetic":
        return dataset_samples(workload.name)
    return config.samples


def prepare_data(config: TrainConfig, workload: Workload) -> tuple[Dataset, Dataset]:
    """The training and held-out test sets, shaped for the workload (synthetic: fresh draws,
    :func:`_train_count` of them)."""
    n_train = _train_count(config, workload)
    train = load_dataset(config.data, workload, n_samples=n_train, seed=config.seed, train=True)
    test = load_dataset(
        config.data, workload, n_samples=config.test_samples, seed=config.seed, train=False
    )
    return train, test


def checked_train_samples(config: TrainConfig, workload: Workload) -> int:
    """The training samples of ``config``'s data, every error loading it would raise raised:
    files are read, synthetic sets only checked, since every rank draws its own (so the
    training and test sets of all ``config.procs`` ranks must fit memory together)."""
    n_train = _train_count(config, workload)
    count = synthetic_count(config.data, workload, n_train)
    if count is None:
        train, _ = prepare_data(config, workload)
        return len(train)
    test = synthetic_count(config.data, workload, config.test_samples, samples_flag(False))
    assert test is not None  # the same data spec as the training set's
    check_sets_fit_memory(workload, count, test, config.procs)
    return count


def steps_per_epoch(config: TrainConfig, n_train: int) -> int:
    """Full global batches per epoch (a last partial one is dropped so ranks stay equal)."""
    too_large = (
        f"the global batch {config.procs} ranks x {config.batch_per_rank} = {config.global_batch}"
    )
    return _full_batches(config, n_train, config.global_batch, too_large)


def model_steps_per_epoch(config: TrainConfig, n_train: int) -> int:
    """Full batches per epoch in model parallelism, where every rank computes the same
    mini-batch (the last partial one dropped)."""
    too_large = (
        f"--batch {config.batch_per_rank} (the batch every rank shares in model parallelism)"
    )
    return _full_batches(config, n_train, config.batch_per_rank, too_large)


def _full_batches(config: TrainConfig, n_train: int, batch: int, too_large: str) -> int:
    """Whole batches of ``batch`` samples in ``n_train``, capped by ``--max-steps``; a
    UserError naming ``too_large`` where not even one fits."""
    steps = n_train // batch
    if steps == 0:
        raise UserError(
            f"{too_large} exceeds the {n_train} training samples; use a smaller --batch or "
            "more --samples"
        )
    if config.max_steps_per_epoch is not None:
        steps = min(steps, config.max_steps_per_epoch)
    return steps
