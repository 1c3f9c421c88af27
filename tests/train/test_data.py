"""Tests for pdlsim.train.data: the synthetic set, the MNIST and CIFAR-10 readers, and the
errors."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pytest

from microbench.errors import UserError
from microbench.workload import Workload, load_workload
from pdlsim.train.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    MNIST_MEAN,
    MNIST_STD,
    Dataset,
    load_cifar10,
    load_dataset,
    load_mnist,
    synthetic,
)

MLP = load_workload("mlp")
CNN = load_workload("cnn")


def _flat(data: Dataset) -> np.ndarray:
    return data.x.reshape(len(data), -1)


def _nearest_mean_accuracy(train: Dataset, test: Dataset) -> float:
    x, xt = _flat(train), _flat(test)
    means = np.stack([x[train.y == c].mean(axis=0) for c in range(train.num_classes)])
    dist = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)
    return float((dist.argmin(axis=1) == test.y).mean())


# ---------------------------------------------------------------------------------------------
# Synthetic


@pytest.mark.parametrize("workload", [MLP, CNN], ids=["mlp", "cnn"])
def test_synthetic_shapes_and_types(workload: Workload) -> None:
    data = load_dataset("synthetic", workload, n_samples=300)
    assert data.x.shape == (300, *workload.input_shape)
    assert data.x.dtype == np.float32 and data.x.flags.c_contiguous
    assert data.y.dtype == np.int64 and data.y.shape == (300,)
    assert 0 <= data.y.min() and data.y.max() < workload.num_classes
    assert data.num_classes == workload.num_classes == 10
    assert data.name == "synthetic" and len(data) == 300


@pytest.mark.parametrize("shape", [(784,), (3, 32, 32)])
def test_synthetic_is_deterministic_in_the_seed(shape: tuple[int, ...]) -> None:
    a = synthetic(shape, 10, 500, seed=3)
    b = synthetic(shape, 10, 500, seed=3)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    other = synthetic(shape, 10, 500, seed=4)
    assert not np.array_equal(a.x, other.x)
    test = synthetic(shape, 10, 500, seed=3, train=False)
    assert not np.array_equal(a.x, test.x)


def test_synthetic_labels_are_balanced_and_shuffled() -> None:
    data = synthetic((784,), 10, 1003, seed=0)
    counts = np.bincount(data.y, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003
    assert not np.all(np.diff(data.y[:50]) >= 0)  # not sorted by class
    assert not np.array_equal(data.y[:20], np.arange(20) % 10)  # not round-robin


@pytest.mark.parametrize("shape", [(784,), (3, 32, 32)])
def test_synthetic_values_are_zero_mean_unit_scale(shape: tuple[int, ...]) -> None:
    x = synthetic(shape, 10, 1000, seed=1).x
    assert abs(float(x.mean())) < 0.1
    assert 0.8 < float(x.std()) < 1.2


def test_synthetic_image_prototypes_are_spatially_smooth() -> None:
    """Class means vary slowly across neighbouring pixels: structure for convolutions."""
    data = synthetic((3, 32, 32), 10, 2000, seed=0)
    proto = data.x[data.y == 0].mean(axis=0)  # (3, 32, 32), mostly noise-free
    left, right = proto[:, :, :-1].ravel(), proto[:, :, 1:].ravel()
    assert np.corrcoef(left, right)[0, 1] > 0.9
    assert proto.std() > 0.3  # a real pattern, not a flat image


@pytest.mark.parametrize("shape", [(784,), (3, 32, 32)])
def test_synthetic_is_learnable_but_not_trivial(shape: tuple[int, ...]) -> None:
    """Nearest class mean, fit on one stream, scores well above chance (10%) on fresh samples
    of the same task, but classes overlap: nothing linear gets everything right."""
    train = synthetic(shape, 10, 2000, seed=0)
    test = synthetic(shape, 10, 2000, seed=0, train=False)
    accuracy = _nearest_mean_accuracy(train, test)
    assert 0.6 < accuracy < 0.95, accuracy
    in_sample = _nearest_mean_accuracy(train, train)
    assert in_sample < 0.97, in_sample


def test_synthetic_one_step_does_not_solve_it_one_epoch_learns() -> None:
    """Softmax regression with minibatch SGD: one epoch of 3,000 samples learns the task,
    while the first step is far from it."""
    train = synthetic((784,), 10, 3000, seed=2)
    test = synthetic((784,), 10, 1000, seed=2, train=False)
    x, y, xt = _flat(train), train.y, _flat(test)
    w = np.zeros((784, 10), np.float32)
    accuracies = []
    for start in range(0, len(x), 32):
        xb, yb = x[start : start + 32], y[start : start + 32]
        z = xb @ w
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        w -= 0.01 * xb.T @ (p / len(yb))
        accuracies.append(float(((xt @ w).argmax(axis=1) == test.y).mean()))
    assert accuracies[-1] > 0.7, accuracies[-1]
    assert accuracies[0] < accuracies[-1] - 0.2, (accuracies[0], accuracies[-1])


def test_synthetic_generates_quickly() -> None:
    start = time.perf_counter()
    data = synthetic((3, 32, 32), 10, 10_000, seed=0)
    elapsed = time.perf_counter() - start
    assert data.x.shape == (10_000, 3, 32, 32)
    assert elapsed < 3.0, f"10,000 CIFAR-shaped samples took {elapsed:.2f} s"


def test_split_is_deterministic_and_covers_the_data() -> None:
    data = synthetic((784,), 10, 100, seed=0)
    train, test = data.split(20)
    assert (len(train), len(test)) == (80, 20)
    np.testing.assert_array_equal(np.concatenate([train.x, test.x]), data.x)
    np.testing.assert_array_equal(np.concatenate([train.y, test.y]), data.y)
    assert train.x.flags.c_contiguous and test.x.flags.c_contiguous
    again, _ = data.split(20)
    np.testing.assert_array_equal(again.x, train.x)


# ---------------------------------------------------------------------------------------------
# MNIST


def _write_idx(path: Path, array: np.ndarray, code: int = 0x08, gz: bool = False) -> None:
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)


def _mnist_dir(
    root: Path, n_train: int = 6, n_test: int = 4, gz: bool = False
) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    images[0, 0, :2] = (0, 255)
    labels = (np.arange(n_train) % 10).astype(np.uint8)
    _write_idx(root / "train-images-idx3-ubyte", images, gz=gz)
    _write_idx(root / "train-labels-idx1-ubyte", labels, gz=gz)
    _write_idx(root / "t10k-images-idx3-ubyte", images[:n_test], gz=gz)
    _write_idx(root / "t10k-labels-idx1-ubyte", labels[:n_test][::-1].copy(), gz=gz)
    return root, images, labels


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_load_mnist_exact_values(tmp_path: Path, gz: bool) -> None:
    root, images, labels = _mnist_dir(tmp_path, gz=gz)
    data = load_mnist(root)
    assert data.x.shape == (6, 1, 28, 28) and data.x.dtype == np.float32
    expected = ((images / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32)
    np.testing.assert_array_equal(data.x[:, 0], expected)
    assert data.x[0, 0, 0, 0] == pytest.approx(-0.4242129, abs=1e-6)  # pixel 0
    assert data.x[0, 0, 0, 1] == pytest.approx(2.8214867, abs=1e-6)  # pixel 255
    np.testing.assert_array_equal(data.y, labels)
    assert data.y.dtype == np.int64 and data.num_classes == 10
    assert data.name == f"mnist:{root}"
    test = load_mnist(root, train=False)
    assert len(test) == 4
    np.testing.assert_array_equal(test.y, labels[:4][::-1])


def test_load_dataset_mnist_reshapes_for_the_mlp(tmp_path: Path) -> None:
    root, images, _ = _mnist_dir(tmp_path, gz=True)
    data = load_dataset(f"mnist:{root}", MLP, n_samples=5)
    assert data.x.shape == (5, 784) and data.x.flags.c_contiguous
    expected = ((images[:5] / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32)
    np.testing.assert_array_equal(data.x, expected.reshape(5, 784))
    assert len(load_dataset(f"mnist:{root}", MLP, train=False)) == 4


def test_load_mnist_accepts_dotted_names(tmp_path: Path) -> None:
    root, _, _ = _mnist_dir(tmp_path)
    for kind in ("images-idx3", "labels-idx1"):
        src = root / f"train-{kind}-ubyte"
        src.rename(root / f"train-{kind.replace('-', '.')}-ubyte")
    assert len(load_mnist(root)) == 6


# ---------------------------------------------------------------------------------------------
# CIFAR-10


def _write_cifar(directory: Path, per_batch: int = 2, n_test: int = 3) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    written = {}
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for i, name in enumerate(names):
        n = n_test if name == "test_batch.bin" else per_batch
        records = rng.integers(0, 256, size=(n, 3073), dtype=np.uint8)
        records[:, 0] = (np.arange(n) + i) % 10
        (directory / name).write_bytes(records.tobytes())
        written[name] = records
    return written


def test_load_cifar10_exact_values(tmp_path: Path) -> None:
    written = _write_cifar(tmp_path)
    data = load_cifar10(tmp_path)
    assert data.x.shape == (10, 3, 32, 32) and data.x.dtype == np.float32
    assert data.x.flags.c_contiguous and data.num_classes == 10
    records = np.concatenate([written[f"data_batch_{i}.bin"] for i in range(1, 6)])
    np.testing.assert_array_equal(data.y, records[:, 0].astype(np.int64))
    pixels = records[:, 1:].reshape(10, 3, 32, 32)
    for c in range(3):
        expected = ((pixels[:, c] / 255.0 - CIFAR10_MEAN[c]) / CIFAR10_STD[c]).astype(np.float32)
        np.testing.assert_array_equal(data.x[:, c], expected)
    test = load_cifar10(tmp_path, train=False)
    np.testing.assert_array_equal(test.y, written["test_batch.bin"][:, 0])


def test_load_cifar10_accepts_the_parent_directory_and_limits(tmp_path: Path) -> None:
    written = _write_cifar(tmp_path / "cifar-10-batches-bin")
    data = load_dataset(f"cifar10:{tmp_path}", CNN, n_samples=3)
    assert data.x.shape == (3, 3, 32, 32)
    first = np.concatenate([written["data_batch_1.bin"], written["data_batch_2.bin"]])[:3]
    np.testing.assert_array_equal(data.y, first[:, 0])
    assert data.name == f"cifar10:{tmp_path}"


# ---------------------------------------------------------------------------------------------
# Errors: each one a UserError whose message names the problem


def test_error_unknown_spec_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown data 'imagenet:/x'.*synthetic, mnist:DIR"):
        load_dataset("imagenet:/x", MLP)
    with pytest.raises(UserError, match="needs a directory: mnist:DIR"):
        load_dataset("mnist", MLP)
    with pytest.raises(UserError, match="no directory .*nowhere"):
        load_dataset(f"mnist:{tmp_path / 'nowhere'}", MLP)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UserError, match="is a file"):
        load_dataset(f"cifar10:{tmp_path / 'file'}", CNN)


def test_error_bad_sample_counts() -> None:
    with pytest.raises(UserError, match="at least 1, got 0"):
        load_dataset("synthetic", MLP, n_samples=0)
    with pytest.raises(UserError, match="at least 1, got -2"):
        load_cifar10("/nonexistent", limit=-2)
    data = synthetic((784,), 10, 10)
    with pytest.raises(UserError, match="cannot hold out 10 test samples"):
        data.split(10)


def test_error_mnist_missing_file(tmp_path: Path) -> None:
    _mnist_dir(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match="no train-labels-idx1-ubyte or train-labels-idx1-ubyte.gz"):
        load_mnist(tmp_path)


def test_error_mnist_bad_magic_truncated_and_corrupt(tmp_path: Path) -> None:
    _mnist_dir(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte"
    good = images.read_bytes()
    images.write_bytes(b"\x12\x34" + good[2:])
    with pytest.raises(UserError, match="bad magic number 0x1234"):
        load_mnist(tmp_path)
    images.write_bytes(good[:-10])
    with pytest.raises(UserError, match="truncated"):
        load_mnist(tmp_path)
    images.write_bytes(good[:6])
    with pytest.raises(UserError, match="truncated IDX header"):
        load_mnist(tmp_path)
    images.write_bytes(gzip.compress(good)[:-20])
    with pytest.raises(UserError, match="cannot read or decompress"):
        load_mnist(tmp_path)


def test_error_mnist_inconsistent_files(tmp_path: Path) -> None:
    _mnist_dir(tmp_path)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(UserError, match="6 images but train-labels-idx1-ubyte has 5 labels"):
        load_mnist(tmp_path)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros((6, 1), np.uint8))
    with pytest.raises(UserError, match="expected unsigned bytes with 1 dimension"):
        load_mnist(tmp_path)
    _write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((6, 28, 28), np.int32), code=0x0C)
    with pytest.raises(UserError, match="expected unsigned bytes with 3 dimensions"):
        load_mnist(tmp_path)


def test_error_cifar10_missing_wrong_length_and_bad_labels(tmp_path: Path) -> None:
    _write_cifar(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(UserError, match="no data_batch_3.bin"):
        load_cifar10(tmp_path)
    _write_cifar(tmp_path)
    (tmp_path / "data_batch_2.bin").write_bytes(bytes(3073 * 2 - 1))
    with pytest.raises(UserError, match="data_batch_2.bin: 6145 bytes .* 3073-byte records"):
        load_cifar10(tmp_path)
    (tmp_path / "test_batch.bin").write_bytes(bytes([42]) + bytes(3072))
    with pytest.raises(UserError, match="label 42 is out of range"):
        load_cifar10(tmp_path, train=False)


def _gzip_of_size(data: bytes, multiple: int) -> bytes:
    """``data`` gzipped, its stored file name padded until the whole is a multiple of
    ``multiple`` bytes."""
    for pad in range(1, 2 * multiple):
        packed = gzip.compress(data, mtime=0)  # the header without a name: 10 bytes
        named = packed[:3] + bytes([packed[3] | 0x08]) + packed[4:10] + b"x" * pad + b"\0"
        named += packed[10:]
        if len(named) % multiple == 0:
            return named
    raise AssertionError("no padding fits")


def test_error_cifar10_gzipped_batch_of_broken_records(tmp_path: Path) -> None:
    """A gzipped batch whose file size happened to be whole records, but whose content was not,
    was a reshape traceback: the records are checked on the bytes read as well."""
    written = _write_cifar(tmp_path)
    raw = written["data_batch_1.bin"].tobytes()[:-5]
    (tmp_path / "data_batch_1.bin").write_bytes(_gzip_of_size(raw, 3073))
    with pytest.raises(UserError, match="data_batch_1.bin: 6141 bytes is not a whole number"):
        load_cifar10(tmp_path)
    (tmp_path / "data_batch_1.bin").write_bytes(_gzip_of_size(raw + bytes(5), 3073))
    assert len(load_cifar10(tmp_path)) == 10  # whole records gzipped are read


def test_error_data_does_not_fit_the_workload(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar")
    with pytest.raises(UserError, match=r"samples are 3x32x32 \(3072 values\).*'mlp'.*\[784\]"):
        load_dataset(f"cifar10:{tmp_path / 'cifar'}", MLP)
    _mnist_dir(tmp_path)
    with pytest.raises(UserError, match=r"1x28x28 .*'cnn' takes input_shape \[3, 32, 32\]"):
        load_dataset(f"mnist:{tmp_path}", CNN)
    five = Workload.from_dict(
        {
            "name": "five",
            "input_shape": [784],
            "layers": [{"kind": "dense", "units": 5}, {"kind": "softmax_cross_entropy"}],
        }
    )
    with pytest.raises(UserError, match="has 10 classes but workload 'five' outputs 5"):
        load_dataset(f"mnist:{tmp_path}", five)
    with pytest.raises(UserError, match="asked for 7 samples but .* has only 6"):
        load_dataset(f"mnist:{tmp_path}", MLP, n_samples=7)


LANGUAGE_MODEL = {
    "name": "tiny-lm",
    "input_shape": [12],
    "layers": [
        {"kind": "embedding", "name": "wte", "vocab": 40, "dim": 16, "positions": 12},
        {"kind": "attention", "name": "attn", "heads": 2, "causal": True},
        {"kind": "layernorm", "name": "ln"},
        {"kind": "dense", "name": "head", "units": 40, "bias": False, "tied_to": "wte"},
        {"kind": "token_cross_entropy", "name": "loss"},
    ],
}


def test_synthetic_tokens_classify_sequences_and_next_tokens_label_each_position() -> None:
    classifier = load_dataset("synthetic", load_workload("transformer"), n_samples=64)
    assert classifier.x.shape == (64, 32) and classifier.y.shape == (64,)
    assert classifier.x.dtype == np.float32 and np.all(classifier.x == np.round(classifier.x))
    assert classifier.x.min() >= 0 and classifier.x.max() < 512
    lm = load_dataset("synthetic", Workload.from_dict(LANGUAGE_MODEL), n_samples=200, seed=3)
    assert lm.x.shape == (200, 12) and lm.y.shape == (200, 12) and lm.labels_per_sample == 12
    np.testing.assert_array_equal(lm.y[:, :-1], lm.x[:, 1:])  # the label is the next token
    again = load_dataset("synthetic", Workload.from_dict(LANGUAGE_MODEL), n_samples=200, seed=3)
    np.testing.assert_array_equal(lm.x, again.x)
    # learnable: a token's most frequent successor follows it far more often than chance
    pairs = np.stack([lm.x[:, :-1].ravel(), lm.y[:, :-1].ravel()], 1).astype(int)
    counts = np.zeros((40, 40))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    assert (counts.max(1).sum() / counts.sum()) > 5 / 40


def test_token_data_refuses_what_it_cannot_label() -> None:
    head = [{"kind": "dense", "name": "head", "units": 7},
            {"kind": "token_cross_entropy", "name": "loss"}]  # fmt: skip
    scored = dict(LANGUAGE_MODEL, layers=[*LANGUAGE_MODEL["layers"][:3], *head])
    with pytest.raises(UserError, match="logits over its vocabulary"):
        load_dataset("synthetic", Workload.from_dict(scored), n_samples=8)
    with pytest.raises(UserError, match="reads token ids"):
        load_dataset("mnist:/nowhere", load_workload("transformer"), n_samples=8)


def test_launcher_check_draws_no_synthetic_sample_yet_refuses_what_a_draw_would(monkeypatch):
    """``pdlsim train`` checks the data once before any rank starts: a synthetic set is
    counted, not drawn (every rank draws its own), and every error a draw would raise is
    raised all the same."""
    from pdlsim.train import data
    from pdlsim.train.config import TrainConfig
    from pdlsim.train.epoch import checked_train_samples

    def no_draw(*args, **kwargs):
        raise AssertionError("the launcher's check drew synthetic samples")

    monkeypatch.setattr(data, "synthetic", no_draw)
    monkeypatch.setattr(data, "synthetic_tokens", no_draw)
    config = TrainConfig(model="cnn", samples=777, test_samples=8)
    assert checked_train_samples(config, CNN) == 777
    transformer = load_workload("transformer")
    assert checked_train_samples(TrainConfig(model="transformer", samples=9), transformer) == 9
    with pytest.raises(UserError, match="at least 1, got 0"):
        checked_train_samples(TrainConfig(model="mlp", samples=0), MLP)
    with pytest.raises(UserError, match="at least 1, got 0"):
        checked_train_samples(TrainConfig(model="mlp", samples=5, test_samples=0), MLP)
    monkeypatch.setattr(data, "available_memory_bytes", lambda: 2**20)
    with pytest.raises(UserError, match="give --samples 42 or fewer"):
        checked_train_samples(TrainConfig(model="cnn", samples=5000), CNN)


def test_launcher_check_reads_file_sets(tmp_path: Path) -> None:
    from pdlsim.train.config import TrainConfig
    from pdlsim.train.epoch import checked_train_samples

    _mnist_dir(tmp_path)
    config = TrainConfig(model="mlp", data=f"mnist:{tmp_path}", test_samples=2)
    assert checked_train_samples(config, MLP) == len(load_dataset(config.data, MLP))
    with pytest.raises(UserError, match="no directory"):
        checked_train_samples(TrainConfig(model="mlp", data=f"mnist:{tmp_path}/x"), MLP)
