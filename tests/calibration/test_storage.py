"""Checkpoint storage: the microbenchmark's records and clean-up, the fit recovering known
latency and bandwidth, and the profile round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration.profile import Profile, load_profile
from calibration.storage import StorageModel, storage_points
from microbench.__main__ import main as microbench_main
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe, read_records
from tests.profiles import STEP_TABLES
from tests.train.synthetic_comm import noisy_samples

PROFILE = STEP_TABLES
SIZES = tuple(64 << 10 << i for i in range(13))  # 64 KiB .. 256 MiB
# A made-up disk (test data, not a measurement): 2 ms per write (fsyncs), 400 MB/s.
ALPHA_S, BETA_S_PER_BYTE = 2e-3, 1 / 400e6
FILESYSTEM = {"type": "ext4", "mount_point": "/", "device": "/dev/sda1"}


def write_synthetic_records(path: Path, truth=lambda n: ALPHA_S + BETA_S_PER_BYTE * n) -> None:
    """Records shaped like ``python -m microbench storage``'s, with a known true line."""
    rng = np.random.default_rng(0)
    with RecordWriter(path, {"hostname": "synthetic"}) as writer:
        for nbytes in SIZES:
            params = {"bytes": nbytes, "operation": "atomic_write", "filesystem": FILESYSTEM}
            samples = noisy_samples(truth(nbytes), rng, 0.03, 20)
            m = Measurement(list(samples), benchmark="storage", name="atomic_write", params=params)
            writer.write(m.to_record())


def profile_with_storage(tmp_path: Path, model: StorageModel) -> Path:
    """The packaged profile with ``model`` as its storage section, saved under ``tmp_path``."""
    base = load_profile(PROFILE)
    profile = Profile.from_models({**base.models, "storage": model}, base.machine)
    return profile.save(tmp_path / "profile-with-storage.json")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> StorageModel:
    run = tmp_path_factory.mktemp("storage")
    write_synthetic_records(run / "storage.jsonl")
    return StorageModel(n_boot=50).fit(load_dataframe(run, type="measurement"))


def test_fit_recovers_the_known_latency_and_bandwidth(fitted):
    (regime,) = fitted.curve_.regimes_  # one straight line: one regime
    assert regime.beta_s_per_byte == pytest.approx(BETA_S_PER_BYTE, rel=0.03)
    assert regime.alpha_s == pytest.approx(ALPHA_S, rel=0.1)
    assert regime.alpha_ci.low <= regime.alpha_s <= regime.alpha_ci.high
    assert regime.beta_ci.low <= BETA_S_PER_BYTE <= regime.beta_ci.high
    assert fitted.curve_.quality_.median_rel_error < 0.03
    latency_s, bandwidth = fitted.cost(1 << 20)
    assert (latency_s, bandwidth) == (regime.alpha_s, 1 / regime.beta_s_per_byte)
    assert fitted.filesystems_ == [{"type": "ext4", "mount_point": "/"}]


def test_two_regimes_price_each_size_with_its_own_line(tmp_path):
    """A write cache: small files at 2 GB/s after 1 ms, large ones 5 ms + 300 MB/s."""
    small_max = 4 << 20

    def truth(n: int) -> float:
        return 1e-3 + n / 2e9 if n <= small_max else 5e-3 + n / 300e6

    write_synthetic_records(tmp_path / "storage.jsonl", truth)
    model = StorageModel(n_boot=0).fit(load_dataframe(tmp_path, type="measurement"))
    assert len(model.curve_.regimes_) == 2
    small, large = model.cost(1 << 20), model.cost(64 << 20)
    assert small[0] == pytest.approx(1e-3, rel=0.1) and small[1] == pytest.approx(2e9, rel=0.05)
    assert large[0] == pytest.approx(5e-3, rel=0.3) and large[1] == pytest.approx(300e6, rel=0.05)
    assert model.latency_s == small[0]  # the fixed cost: the smallest files' intercept


def test_model_round_trips_through_a_profile(fitted, tmp_path):
    again = load_profile(profile_with_storage(tmp_path, fitted)).model("storage")
    assert isinstance(again, StorageModel)
    assert again.cost(12345678) == fitted.cost(12345678)
    assert again.predict(12345678) == pytest.approx(fitted.predict(12345678), rel=1e-12)
    assert again.filesystems_ == fitted.filesystems_
    assert json.loads(json.dumps(again.to_dict())) == fitted.to_dict()


def test_command_writes_records_and_leaves_no_files_behind(tmp_path, no_inherited_rank, capsys):
    target, out = tmp_path / "disk", tmp_path / "run"
    target.mkdir()
    argv = ["storage", "--sizes", "64KiB,256KiB,1MiB", "--quick", "--time-cap", "0.01"]
    assert microbench_main([*argv, "--out", str(out), "--dir", str(target)]) == 0
    assert list(target.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == ["storage.jsonl"]
    header, records = read_records(out / "storage.jsonl")
    assert header["run"]["settings"]["dir"] == str(target)
    assert [r["params"]["bytes"] for r in records] == [64 << 10, 256 << 10, 1 << 20]
    for record in records:
        assert record["benchmark"] == "storage" and record["warmup_discarded"] == 1
        assert len(record["samples"]) >= 5 and min(record["samples"]) > 0
        assert record["params"]["filesystem"]["mount_point"].startswith("/")
    points = storage_points(load_dataframe(out, type="measurement"))
    assert list(points["bytes"]) == [64 << 10, 256 << 10, 1 << 20]
    assert "GB/s" in capsys.readouterr().out
    # without --dir: the run directory itself, and again only the records remain
    assert microbench_main([*argv, "--out", str(tmp_path / "run2")]) == 0
    assert [p.name for p in (tmp_path / "run2").iterdir()] == ["storage.jsonl"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing", "no such directory"),
        (lambda tmp: (tmp / "file").write_text("x") and tmp / "file", "is a file"),
    ],
)
def test_bad_dir_is_one_line_exit_2(tmp_path, make, message, no_inherited_rank, capsys):
    target = make(tmp_path)
    status = microbench_main(["storage", "--quick", "--out", str(tmp_path / "o"), "--dir",
                              str(target)])  # fmt: skip
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--dir" in err
    assert not (tmp_path / "o").exists()  # refused before any records file was made
