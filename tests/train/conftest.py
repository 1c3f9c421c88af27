"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_pdlsim
from tests.train.runs import TINY


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run directory with checkpoints and a summary, as a short training leaves it (tests
    copy it before changing anything)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    first = run_pdlsim("train", *TINY, "--out", str(out))
    assert first.returncode == 0, first.stderr
    return out
