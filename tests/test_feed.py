"""Mini-batches to the device (:mod:`pdlsim.train.feed`): in turn, or one step ahead on a copy
stream, with the same batches, the same losses and the copies where the simulator puts them.

CuPy is stood in for by :mod:`tests.fake_cupy` (numpy arrays, streams that count their copies
and waits); the copies' real overlap is measured where a GPU is lent."""

from __future__ import annotations

import numpy as np
import pytest

from pdlsim.train.comm import LocalComm
from pdlsim.train.config import TrainConfig
from pdlsim.train.data import Dataset
from pdlsim.train.device import Device, cpu_device
from pdlsim.train.feed import BatchFeed, step_indices
from pdlsim.train.loop import train
from pdlsim.train.model_loop import train_model_parallel
from tests import fake_cupy


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Device:
    cupy = fake_cupy.install(monkeypatch)
    return Device(kind="gpu", xp=cupy, name="fake-gpu", synchronize=lambda: None,
                  kernel_backend="array")  # fmt: skip


def _data(n: int = 40) -> Dataset:
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    return Dataset(x=x, y=np.arange(n, dtype=np.int64) % 10, name="ramp", num_classes=10)


def _epoch(feed: BatchFeed, data: Dataset, permutation: np.ndarray, steps: int) -> list:
    """Each step's (inputs, labels) as the network would read them, checked against the
    samples the step asked for."""
    seen = []
    for step in range(steps):
        index, following = step_indices(permutation, step, steps, feed.batch, 0, feed.batch)
        feed.gather(index, following)
        x, y = feed.to_device()
        np.testing.assert_array_equal(np.asarray(x), data.x[index])
        np.testing.assert_array_equal(np.asarray(y), data.y[index])
        seen.append(np.asarray(x).copy())
    return seen


def test_prefetch_feeds_every_step_its_own_samples_and_copies_each_batch_once(fake_gpu):
    data = _data()
    feed = BatchFeed(data, 4, fake_gpu, pinned=True, prefetch=True)
    rng = np.random.default_rng(1)
    for _ in range(2):  # two epochs: the first step of each copies in its own phase
        _epoch(feed, data, rng.permutation(len(data)), steps=5)
    stream = feed._stream
    assert stream.copies == 2 * 4 * 2  # x and y of steps 2..5 of each epoch, issued ahead
    assert stream.waits == 2 * 4  # each of those steps waited for its copy


def test_a_step_that_is_not_the_prefetched_one_still_gets_its_own_samples(fake_gpu):
    data = _data()
    feed = BatchFeed(data, 4, fake_gpu, pinned=True, prefetch=True)
    feed.gather(np.arange(4), np.arange(4, 8))
    feed.to_device()
    other = np.arange(20, 24)  # not what was copied ahead: wait for that copy, then copy this
    feed.gather(other)
    x, y = feed.to_device()
    np.testing.assert_array_equal(np.asarray(x), data.x[other])
    assert feed._stream.waits == 1


@pytest.mark.parametrize(("pinned", "prefetch"), [(False, False), (True, False), (True, True)])
def test_buffers_count_host_staging_and_device_copies(fake_gpu, pinned, prefetch):
    data = _data()
    one = 4 * 3 * 4 + 4 * 8  # a batch of 4 samples: 3 float32 inputs and an int64 label each
    feed = BatchFeed(data, 4, fake_gpu, pinned=pinned, prefetch=prefetch)
    staging = 4 * 3 * 4 if pinned and not prefetch else 0
    assert feed.buffer_bytes == (4 if prefetch else 2) * one + staging
    assert BatchFeed(data, 4, cpu_device(), pinned=False).buffer_bytes == one


def test_prefetch_needs_a_gpu_and_page_locked_memory(fake_gpu):
    with pytest.raises(ValueError, match="needs both"):
        BatchFeed(_data(), 4, cpu_device(), pinned=True, prefetch=True)
    with pytest.raises(ValueError, match="needs both"):
        BatchFeed(_data(), 4, fake_gpu, pinned=False, prefetch=True)


def test_step_indices_follow_the_ranks_slices_and_stop_at_the_epoch_end():
    permutation = np.arange(100)[::-1]
    index, following = step_indices(permutation, 0, 3, 8, 4, 4)  # rank 1 of 2, batch 4
    assert index.tolist() == [95, 94, 93, 92] and following.tolist() == [87, 86, 85, 84]
    assert step_indices(permutation, 2, 3, 8, 4, 4)[1] is None


def test_training_with_prefetch_gives_the_losses_of_training_without(fake_gpu, tmp_path):
    """Same samples in the same order: the loss curve of the CPU, of the GPU copying in turn
    and of the GPU copying ahead agree, data parallel and model parallel alike; the ahead
    copies leave the h2d phase a wait."""
    quiet = {"log": lambda line: None}
    base = TrainConfig(model="mlp", batch_per_rank=16, samples=128, test_samples=16, epochs=2)
    cpu = train(base, LocalComm(), cpu_device(), tmp_path / "cpu", **quiet)
    ahead_cfg = TrainConfig(**{**base.__dict__, "device": "gpu", "pinned": True, "prefetch": True})
    ahead = train(ahead_cfg, LocalComm(), fake_gpu, tmp_path / "ahead", **quiet)
    np.testing.assert_allclose(ahead.step_losses, cpu.step_losses, rtol=1e-5)
    assert ahead.epochs[-1].model_state_bytes["buffers"] == 4 * (16 * 784 * 4 + 16 * 8)
    model_cfg = TrainConfig(**{**ahead_cfg.__dict__, "parallel": "model"})
    split = train_model_parallel(model_cfg, LocalComm(), fake_gpu, tmp_path / "model", **quiet)
    np.testing.assert_allclose(split.step_losses, cpu.step_losses, rtol=1e-5)
