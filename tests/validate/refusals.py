"""What the validate refusal tests share: a small matrix of flags, the one line a refused
``pdlsim validate`` prints, and a folder's contents to compare before and after."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlsim.cli.main import main
from tests.profiles import STEP_TABLES

PROFILE = str(STEP_TABLES)
SMALL = ["--profile", PROFILE, "--models", "mlp", "--batches", "16", "--modes", "1x1",
         "--parallel", "data", "--gpu", "off", "--repeats", "1", "--steps", "2"]  # fmt: skip


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``pdlsim validate argv``: exit status 2 and one ``pdlsim: error:`` line, returned."""
    try:
        status = main(["validate", *argv])
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pdlsim: error: "), err
    assert "Traceback" not in err
    return err


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }
