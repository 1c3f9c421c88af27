"""Fit plots of a calibration, drawn from synthetic records fitted by the real modelers."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

from calibration.communication import CollectiveModels
from calibration.compute import ComputeModel
from calibration.formulas import cost
from calibration.jitter import JitterModel
from calibration.transfer import TransferModel
from microbench.measurement import Measurement
from microbench.records import RecordWriter, load_dataframe
from pdlsim.plots import plot_calibration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZES = [8 * 4**k for k in range(9)]  # 8 B .. 512 KiB
ALPHA, BETA = 3e-6, 2e-10  # allreduce link parameters (Rabenseifner)
PEAK, BW, OVERHEAD = 50e9, 10e9, 2e-6


def _noisy(rng: np.random.Generator, true_s: float, n: int = 12) -> np.ndarray:
    return true_s * rng.lognormal(0.0, 0.02, n)


def _write(writer: RecordWriter, samples, benchmark: str, name: str, params: dict) -> None:
    writer.write(Measurement(samples, benchmark, name, params).to_record())


def _collectives(writer: RecordWriter, rng: np.random.Generator) -> None:
    for ranks in (2, 4):
        base = {"ranks": ranks, "ranks_per_node": ranks, "algorithm": None}
        for n in SIZES:
            t = float(cost("allreduce", "rabenseifner", ranks, n, ALPHA, BETA))
            params = {**base, "op": "allreduce", "bytes": n, "total_bytes": n}
            _write(writer, _noisy(rng, t), "collectives", "allreduce", params)
        t = float(cost("barrier", "dissemination", ranks, 0, ALPHA, 0.0))
        params = {**base, "op": "barrier", "bytes": 0, "total_bytes": 0}
        _write(writer, _noisy(rng, t), "collectives", "barrier", params)
    one_rank = {"op": "allreduce", "bytes": 8, "total_bytes": 8, "ranks": 1, "ranks_per_node": 1}
    _write(writer, _noisy(rng, 1e-7), "collectives", "allreduce", one_rank)  # not fitted, not drawn


def _compute(writer: RecordWriter, rng: np.random.Generator) -> None:
    for threads in (1, 2):
        base = {"threads": threads, "device": "cpu"}
        gemm = 2 * 512**3
        _write(
            writer, _noisy(rng, gemm / PEAK / threads), "compute", "gemm", {**base, "flops": gemm}
        )
        _write(writer, _noisy(rng, 2**26 / BW), "compute", "triad", {**base, "bytes": 2**26})
        for batch in (16, 64, 256):
            for kind, phase, flops, nbytes in (
                ("dense", "forward", 2e5 * batch, 4e3 * batch + 1e5),
                ("dense", "backward", 4e5 * batch, 8e3 * batch + 1e5),
                ("sgd", "update", 2e5, 1.2e6),
            ):
                t = OVERHEAD + max(flops / (0.5 * PEAK * threads), nbytes / BW)
                params = {**base, "model": "toy", "op": f"{kind}0", "kind": kind, "phase": phase}
                params.update(batch=batch, flops=flops, bytes=nbytes, layers=[f"{kind}0"])
                _write(writer, _noisy(rng, t), "compute", "op", params)


def _jitter(writer: RecordWriter, rng: np.random.Generator) -> None:
    steps = 0.01 * rng.lognormal(0.0, 0.05, (2, 200))
    base = {"model": "toy", "batch": 32, "threads": 1, "ranks": 2, "ranks_per_node": 2}
    for rank in range(2):
        params = {**base, "rank": rank, "statistic": "per_rank"}
        _write(writer, steps[rank], "jitter", "step_compute", params)
    params = {**base, "rank": None, "statistic": "max_over_ranks"}
    _write(writer, steps.max(axis=0), "jitter", "step_compute", params)


def _copies(writer: RecordWriter, rng: np.random.Generator) -> None:
    for direction in ("h2d", "d2h"):
        for pinned, bandwidth in ((True, 20e9), (False, 8e9)):
            for n in SIZES:
                params = {"direction": direction, "pinned": pinned, "bytes": n, "device": 0}
                _write(writer, _noisy(rng, 8e-6 + n / bandwidth), "copies", direction, params)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Synthetic records through the real writer and loader, fitted by the real modelers."""
    run = tmp_path_factory.mktemp("records")
    rng = np.random.default_rng(0)
    with RecordWriter(run / "records.jsonl", {"hostname": "synthetic"}) as writer:
        for write in (_collectives, _compute, _jitter, _copies):
            write(writer, rng)
    frame = load_dataframe(run, type="measurement")
    models = {
        "collectives": CollectiveModels(n_boot=20).fit(frame),
        "compute": ComputeModel(n_boot=20).fit(frame),
        "jitter": JitterModel(n_boot=20).fit(frame),
        "transfer": TransferModel(n_boot=20).fit(frame),
        "overlap": None,
    }
    return models, frame


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_png_per_model_with_measured_points_fit_and_residuals(fitted, tmp_path):
    models, frame = fitted
    out = tmp_path / "plots"  # created by the call
    paths = plot_calibration(models, frame, out)
    names = ["collectives.png", "compute.png", "jitter.png", "transfer.png"]
    assert [p.name for p in paths] == names
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for path in paths:
        width, height = _png_size(path)
        assert width >= 600 and height >= 400, (path.name, width, height)
        assert path.stat().st_size > 20_000, path.name  # drawn, not an empty canvas


def test_missing_models_are_skipped(fitted, tmp_path):
    models, frame = fitted
    fewer = {"collectives": models["collectives"], "compute": None, "jitter": models["jitter"]}
    paths = plot_calibration(fewer, frame, tmp_path)
    assert [p.name for p in paths] == ["collectives.png", "jitter.png"]
    assert not (tmp_path / "compute.png").exists() and not (tmp_path / "transfer.png").exists()


def test_a_model_without_its_records_draws_nothing(fitted, tmp_path):
    models, frame = fitted
    no_copies = frame[frame["benchmark"] != "copies"]
    paths = plot_calibration({"transfer": models["transfer"]}, no_copies, tmp_path)
    assert paths == []


def test_svg_on_request(fitted, tmp_path):
    models, frame = fitted
    paths = plot_calibration({"jitter": models["jitter"]}, frame, tmp_path, fmt="svg")
    assert [p.name for p in paths] == ["jitter.svg"]
    text = paths[0].read_text(encoding="utf-8")
    assert text.lstrip().startswith("<?xml") and "<svg" in text[:2000]


def test_unknown_format_is_a_clear_error(fitted, tmp_path):
    models, frame = fitted
    with pytest.raises(ValueError, match="cannot write plots as 'bmpx'"):
        plot_calibration(models, frame, tmp_path / "plots", fmt="bmpx")
    assert not (tmp_path / "plots").exists()


def test_only_the_plots_module_imports_matplotlib():
    code = (
        "import sys, calibration.pipeline, microbench, pdlsim, pdlsim.sim\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported outside pdlsim.plots'\n"
        "import pdlsim.plots\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
