"""Training data: a learnable synthetic set, and readers for MNIST (IDX) and CIFAR-10 (binary).

``pdlsim train`` and ``pdlsim validate`` need data whose shapes feed the workload; what is
measured is speed, so the data only has to be real enough that training does real work (the
loss falls, accuracy rises above chance). The synthetic set needs no download; the readers
take the files as distributed, so a user can check that the numbers hold on real data.

All arrays are float32, C-contiguous, samples first, channels first, normalised to roughly
zero mean and unit scale.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from microbench.memory import available_memory_bytes
from microbench.workload import Workload
from pdlsim.train.dataset import DataError, Dataset, check_counts
from pdlsim.train.token_data import check_tokens, synthetic_next_tokens, synthetic_tokens

DEFAULT_SYNTHETIC_SAMPLES = 10_000

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CLASSES = 10
_CIFAR_SUBDIR = "cifar-10-batches-bin"
_CIFAR_SHAPE = (3, 32, 32)
_CIFAR_RECORD_BYTES = 1 + math.prod(_CIFAR_SHAPE)  # label byte + pixels

# IDX type codes (third byte of the magic number) and the big-endian dtypes they name.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

# Synthetic data: samples live in a low-dimensional latent space (Gaussian classes with a
# shared, anisotropic covariance) mapped onto smooth input patterns, plus white pixel noise.
# The latent overlap sets how hard the task is: classes are mostly but not fully separable
# (a linear classifier reaches ~75-85% on 10 classes), so a single step cannot solve it.
_LATENT_DIM = 16
_CLASS_SPREAD = 0.75  # std of the class means per latent dimension, in units of latent noise
_LATENT_NOISE_RANGE = (0.6, 1.4)  # per-dimension latent noise std: anisotropic on purpose
_SCALE_RANGE = (0.75, 1.25)  # per-sample gain on the class prototype
_SHIFT_STD = 0.2  # per-sample brightness shift
_SIGNAL_VARIANCE = 0.5  # per-value variance of the smooth part; white noise brings it to ~1
_MAX_FREQUENCY = 3  # cycles per image side of the spatial sinusoids
_CHUNK_ROWS = 2048  # rows of white noise drawn at a time, to bound temporary memory
_DATA_MEMORY_SHARE = 0.5  # of the available memory, at most, for one synthetic set


# ---------------------------------------------------------------------------------------------
# Synthetic


def synthetic(
    input_shape: Sequence[int],
    num_classes: int,
    n_samples: int,
    seed: int = 0,
    *,
    train: bool = True,
) -> Dataset:
    """A learnable, class-structured data set, the same for the same arguments.

    Each class has a smooth prototype (for [C, H, W] shapes, per channel a mix of low-frequency
    2-D sinusoids; for flat shapes, a random vector). A sample is its class prototype with a
    random gain and brightness shift, plus structured noise along the same smooth patterns
    (which makes the classes overlap) and white noise on every value. Labels are balanced and
    shuffled. ``seed`` fixes the prototypes; ``train`` picks one of two independent sample
    streams over the same prototypes, so a test set is new samples of the same task.
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise DataError(f"synthetic data needs a positive input shape, got {list(shape)}")
    check_counts(num_classes, n_samples)
    proto_seed, train_seed, test_seed = np.random.SeedSequence(seed).spawn(3)
    prng = np.random.default_rng(proto_seed)
    size = math.prod(shape)
    basis = _smooth_basis(prng, shape, min(_LATENT_DIM, size))  # (d, size), orthogonal rows
    d = basis.shape[0]
    means = prng.standard_normal((num_classes, d)) * _CLASS_SPREAD
    means -= means.mean(axis=0)  # so the data as a whole has zero mean
    noise_std = prng.uniform(*_LATENT_NOISE_RANGE, size=d)
    # Expected squared latent norm, so the smooth part has _SIGNAL_VARIANCE per value.
    lo, hi = _SCALE_RANGE
    energy = (lo * lo + lo * hi + hi * hi) / 3 * np.mean(np.sum(means**2, axis=1))
    energy += np.sum(noise_std**2)
    gain = math.sqrt(_SIGNAL_VARIANCE * size / energy)
    basis = (basis * gain).astype(np.float32)

    rng = np.random.default_rng(train_seed if train else test_seed)
    y = rng.permutation(np.arange(n_samples, dtype=np.int64) % num_classes)
    scale = rng.uniform(lo, hi, size=(n_samples, 1)).astype(np.float32)
    latent = means.astype(np.float32)[y] * scale
    latent += rng.standard_normal((n_samples, d), dtype=np.float32) * noise_std.astype(np.float32)
    x = latent @ basis
    shift = rng.normal(0.0, _SHIFT_STD, size=(n_samples, 1)).astype(np.float32)
    white = np.float32(math.sqrt(1.0 - _SIGNAL_VARIANCE))
    for start in range(0, n_samples, _CHUNK_ROWS):
        rows = slice(start, min(start + _CHUNK_ROWS, n_samples))
        noise = rng.standard_normal((rows.stop - start, size), dtype=np.float32)
        noise *= white
        noise += shift[rows]
        x[rows] += noise
    return Dataset(x.reshape((n_samples, *shape)), y, "synthetic", num_classes)


def _smooth_basis(rng: np.random.Generator, shape: tuple[int, ...], d: int) -> np.ndarray:
    """``d`` orthonormal patterns of ``shape``, flattened: smooth images, or random vectors."""
    if len(shape) == 3:
        channels, height, width = shape
        rows = np.arange(height)[:, None] / height
        cols = np.arange(width)[None, :] / width
        patterns = np.zeros((d, channels, height, width))
        for k in range(d):
            for c in range(channels):
                for _ in range(2):  # two sinusoids per channel per pattern
                    fy, fx = 0, 0
                    while fy == 0 and fx == 0:
                        fy, fx = rng.integers(-_MAX_FREQUENCY, _MAX_FREQUENCY + 1, size=2)
                    phase = rng.uniform(0, 2 * np.pi)
                    patterns[k, c] += rng.normal() * np.cos(
                        2 * np.pi * (fy * rows + fx * cols) + phase
                    )
        flat = patterns.reshape(d, -1)
    else:
        flat = rng.standard_normal((d, math.prod(shape)))
    # Orthonormalise: combinations of smooth patterns stay smooth, and the latent geometry
    # then maps onto the input space without distortion.
    q, _ = np.linalg.qr(flat.T)
    return q.T


# ---------------------------------------------------------------------------------------------
# MNIST (IDX files)


def load_mnist(path: str | Path, train: bool = True, *, limit: int | None = None) -> Dataset:
    """MNIST-format IDX files in directory ``path`` (each may be gzipped): x is (n, 1, H, W).

    Pixels are scaled to [0, 1] and normalised with the MNIST mean and std. ``limit`` keeps
    only the first samples (before normalisation, to save memory).
    """
    _check_limit(limit)
    directory = _directory(path, "mnist")
    prefix = "train" if train else "t10k"
    images_path = _find(directory, f"{prefix}-images-idx3-ubyte", "mnist")
    labels_path = _find(directory, f"{prefix}-labels-idx1-ubyte", "mnist")
    images = _read_idx(images_path)
    labels = _read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise DataError(
            f"mnist file {images_path}: expected unsigned bytes with 3 dimensions "
            f"(count, rows, columns), got {images.dtype} with shape {list(images.shape)}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(
            f"mnist file {labels_path}: expected unsigned bytes with 1 dimension (count), "
            f"got {labels.dtype} with shape {list(labels.shape)}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"mnist: {images_path.name} has {images.shape[0]} images but {labels_path.name} "
            f"has {labels.shape[0]} labels; the two files must come from the same set"
        )
    if images.shape[0] == 0:
        raise DataError(f"mnist file {images_path}: holds no images")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    lut = ((np.arange(256) / 255.0 - MNIST_MEAN) / MNIST_STD).astype(np.float32)
    x = lut[images][:, None, :, :]  # a table look-up: exact, and no float64 temporaries
    num_classes = max(10, int(labels.max()) + 1)  # 10 for MNIST; more for e.g. EMNIST
    return Dataset(np.ascontiguousarray(x), labels.astype(np.int64), f"mnist:{path}", num_classes)


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not, told by its content) as an array in native byte order."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        magic = raw[:4].hex() or "empty"
        raise DataError(
            f"file {path}: bad magic number 0x{magic}; not an IDX file (expected 0x0000 then a "
            "type code and the number of dimensions); download the file again"
        )
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"file {path}: truncated IDX header; download the file again")
    dims = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(
            f"file {path}: {what} ({len(raw)} bytes, header {list(dims)} needs {expected}); "
            "download the file again"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=False)


# ---------------------------------------------------------------------------------------------
# CIFAR-10 (binary version)


def load_cifar10(path: str | Path, train: bool = True, *, limit: int | None = None) -> Dataset:
    """The CIFAR-10 binary batches in ``path`` (or its ``cifar-10-batches-bin/``).

    x is (n, 3, 32, 32), scaled to [0, 1] and normalised per channel. ``limit`` keeps only
    the first samples and reads no more batch files than it needs.
    """
    _check_limit(limit)
    directory = _directory(path, "cifar10")
    if (directory / _CIFAR_SUBDIR).is_dir():
        directory = directory / _CIFAR_SUBDIR
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    files = [_find(directory, name, "cifar10", gz=False) for name in names]
    for file in files:
        _check_records(file, file.stat().st_size)
    chunks: list[np.ndarray] = []
    have = 0
    for file in files:
        if limit is not None and have >= limit:
            break
        raw = _read_bytes(file)
        _check_records(file, len(raw))  # again: a gzipped file's size was not its records'
        records = np.frombuffer(raw, dtype=np.uint8)
        chunks.append(records.reshape(-1, _CIFAR_RECORD_BYTES))
        have += chunks[-1].shape[0]
    records = np.concatenate(chunks)[:limit]
    labels = records[:, 0]
    if labels.max() >= CIFAR10_CLASSES:
        raise DataError(
            f"cifar10 in {directory}: label {int(labels.max())} is out of range 0-9; these are "
            "not CIFAR-10 binary batches (CIFAR-100 has a different layout)"
        )
    pixels = records[:, 1:].reshape(-1, *_CIFAR_SHAPE)
    x = np.empty(pixels.shape, dtype=np.float32)
    levels = np.arange(256) / 255.0
    for c, (mean, std) in enumerate(zip(CIFAR10_MEAN, CIFAR10_STD, strict=True)):
        x[:, c] = ((levels - mean) / std).astype(np.float32)[pixels[:, c]]
    return Dataset(x, labels.astype(np.int64), f"cifar10:{path}", CIFAR10_CLASSES)


def _check_records(file: Path, size: int) -> None:
    """A DataError unless ``size`` bytes of ``file`` are whole CIFAR-10 records: checked on the
    file before any is read, and on its bytes once read (decompressed where it was gzipped)."""
    if size == 0 or size % _CIFAR_RECORD_BYTES:
        raise DataError(
            f"cifar10 file {file}: {size} bytes is not a whole number of "
            f"{_CIFAR_RECORD_BYTES}-byte records (1 label + 3072 pixels); the file is "
            "truncated or not the CIFAR-10 binary version"
        )


# ---------------------------------------------------------------------------------------------
# Shared file handling and the one entry point


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise DataError(f"the number of samples must be at least 1, got {limit}")


def _directory(path: str | Path, kind: str) -> Path:
    directory = Path(path).expanduser()
    if not directory.exists():
        raise DataError(f"{kind}: no directory {directory}; give the folder that holds the files")
    if not directory.is_dir():
        raise DataError(f"{kind}: {directory} is a file; give the folder that holds the files")
    return directory


def _find(directory: Path, name: str, kind: str, gz: bool = True) -> Path:
    candidates = [name, f"{name}.gz"] if gz else [name]
    if gz and "-idx" in name:  # some mirrors name them train-images.idx3-ubyte
        dotted = name.replace("-idx", ".idx")
        candidates += [dotted, f"{dotted}.gz"]
    for candidate in candidates:
        if (directory / candidate).is_file():
            return directory / candidate
    either = f"{name} or {name}.gz" if gz else name
    raise DataError(f"{kind}: {directory} has no {either}; put the {kind} files there")


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip, whatever the name says
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"file {path}: cannot read or decompress it ({exc})") from None
    return raw


def load_dataset(
    spec: str,
    workload: Workload,
    n_samples: int | None = None,
    seed: int = 0,
    train: bool = True,
) -> Dataset:
    """Data for ``workload`` from ``synthetic``, ``mnist:PATH`` or ``cifar10:PATH``.

    Samples are reshaped to the workload's input shape when one side is flat and the value
    counts match (MNIST 1x28x28 feeds a 784-input MLP); only the first ``n_samples`` are
    kept (default: all of a file set, or DEFAULT_SYNTHETIC_SAMPLES synthetic ones).
    """
    vocabulary = workload.vocabulary
    per_token = workload.layers[-1].kind == "token_cross_entropy"
    flag = samples_flag(train)
    count = synthetic_count(spec, workload, n_samples, flag)  # as the launcher checks it
    if count is not None:
        if per_token:
            (tokens,) = workload.input_shape
            return synthetic_next_tokens(tokens, vocabulary, count, seed, train=train)
        if vocabulary is not None:
            (tokens,) = workload.input_shape
            return synthetic_tokens(tokens, vocabulary, workload.num_classes, count, seed,
                                    train=train)  # fmt: skip
        return synthetic(workload.input_shape, workload.num_classes, count, seed, train=train)
    _check_asked(n_samples, flag)
    _check_per_token(workload)
    kind, _, where = spec.partition(":")
    kind = kind.strip().lower()
    if vocabulary is not None:
        raise DataError(
            f"workload '{workload.name}' reads token ids, and {kind} holds images; use "
            "--data synthetic (synthetic tokens)"
        )
    if kind not in ("mnist", "cifar10"):
        raise DataError(
            f"unknown data '{spec}'; use synthetic, mnist:DIR (the IDX files) or cifar10:DIR "
            "(the CIFAR-10 binary version)"
        )
    if not where.strip():
        raise DataError(f"data '{spec}' needs a directory: {kind}:DIR")
    loader = load_mnist if kind == "mnist" else load_cifar10
    data = loader(where.strip(), train=train, limit=n_samples)
    if n_samples is not None and len(data) < n_samples:
        raise DataError(
            f"asked for {n_samples} samples but {data.name} has only {len(data)} "
            f"{'training' if train else 'test'} samples; give {flag} {len(data)} or fewer"
        )
    if data.num_classes > workload.num_classes:
        raise DataError(
            f"{data.name} has {data.num_classes} classes but workload '{workload.name}' outputs "
            f"{workload.num_classes}; give its last dense layer {data.num_classes} units"
        )
    return _fit_shape(data, workload)


def samples_flag(train: bool) -> str:
    """The ``pdlsim train`` flag that sets the training set's size, or the test set's: the
    one an error about that set names."""
    return "--samples" if train else "--test-samples"


def synthetic_count(
    spec: str, workload: Workload, n_samples: int | None = None, flag: str = "--samples"
) -> int | None:
    """The samples of the synthetic set ``spec`` names for ``workload`` (None where ``spec``
    names no synthetic set), with every error drawing them would raise, raised without drawing
    them: what the launching process checks before any rank draws its own. ``flag`` sets
    ``n_samples`` (:func:`samples_flag`), and the errors name it."""
    kind, sep, _ = spec.partition(":")
    if kind.strip().lower() != "synthetic" or sep:
        return None
    _check_asked(n_samples, flag)
    count = DEFAULT_SYNTHETIC_SAMPLES if n_samples is None else n_samples
    _check_per_token(workload)
    if workload.vocabulary is not None:
        check_tokens(workload.input_shape[0], workload.vocabulary)
    check_counts(workload.num_classes, count)
    _check_fits_memory(workload, count, flag)
    return count


def check_sets_fit_memory(workload: Workload, n_train: int, n_test: int, ranks: int) -> None:
    """A DataError where the synthetic training and test sets that each of ``ranks`` ranks on
    this machine draws (every rank draws both whole) would not fit together, by the rule
    :func:`synthetic_overflow` holds one set to: each alone may fit and all of them not."""
    overflow = synthetic_overflow(workload, n_train + n_test, ranks)
    if overflow is not None:
        need, available = overflow
        each = f"{ranks} ranks each draw" if ranks > 1 else "the run draws"
        raise DataError(
            f"{each} {n_train} training and {n_test} test samples of {workload.name}'s input "
            f"{list(workload.input_shape)}: {need / 2**30:.1f} GiB, more than half the "
            f"{available / 2**30:.1f} GiB of memory available; give fewer --samples or "
            f"--test-samples{' or --procs' if ranks > 1 else ''}"
        )


def _check_asked(n_samples: int | None, flag: str) -> None:
    if n_samples is not None and n_samples < 1:
        raise DataError(f"{flag} must be at least 1, got {n_samples}")


def _check_per_token(workload: Workload) -> None:
    """A DataError where ``workload`` scores every token but its logits are not over its
    vocabulary (no data feeds it)."""
    if workload.layers[-1].kind == "token_cross_entropy" and (
        workload.vocabulary is None or workload.num_classes != workload.vocabulary
    ):
        raise DataError(
            f"workload '{workload.name}' scores every token against {workload.num_classes} "
            "classes; the synthetic next-token data needs an embedding input and logits over "
            "its vocabulary"
        )


def synthetic_overflow(
    workload: Workload, n_samples: int, ranks: int = 1
) -> tuple[int, int] | None:
    """``(bytes needed, bytes available)`` where ``n_samples`` synthetic samples of
    ``workload`` on each of ``ranks`` ranks would take more than :data:`_DATA_MEMORY_SHARE` of
    the memory this process may still use (a large network's images would otherwise push the
    machine into swap); None where they fit, or the memory is not known. ``pdlsim validate``
    asks it of every launch before the first."""
    available = available_memory_bytes()
    need = ranks * n_samples * math.prod(workload.input_shape) * 4
    if available is not None and need > _DATA_MEMORY_SHARE * available:
        return need, available
    return None


def _check_fits_memory(workload: Workload, n_samples: int, flag: str) -> None:
    """A DataError naming ``flag``, before any allocation, where :func:`synthetic_overflow`
    says so."""
    overflow = synthetic_overflow(workload, n_samples)
    if overflow is not None:
        need, available = overflow
        fit = max(1, int(_DATA_MEMORY_SHARE * available) // (math.prod(workload.input_shape) * 4))
        raise DataError(
            f"{n_samples} synthetic samples of {workload.name}'s input "
            f"{list(workload.input_shape)} take {need / 2**30:.1f} GiB, more than half the "
            f"{available / 2**30:.1f} GiB of memory available; give {flag} {fit} or fewer"
        )


def _fit_shape(data: Dataset, workload: Workload) -> Dataset:
    have, want = data.sample_shape, tuple(workload.input_shape)
    if have == want:
        return data
    if math.prod(have) == math.prod(want) and (len(have) == 1 or len(want) == 1):
        x = data.x.reshape((len(data), *want))
        return Dataset(x, data.y, data.name, data.num_classes)
    raise DataError(
        f"{data.name} samples are {'x'.join(map(str, have))} ({math.prod(have)} values) but "
        f"workload '{workload.name}' takes input_shape {list(want)} ({math.prod(want)} values); "
        "use a workload whose input fits this data, or other data"
    )
