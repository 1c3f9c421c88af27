"""Profiles the tests read as fixtures, apart from the packaged ones a user gets.

``STEP_TABLES`` is a full calibration of a 2-core Xeon VM from before the kernel sweep: measured
whole steps (compute tables, drift, in-place steps and co-location at 2 ranks) and no kernel
tables. The tests that exercise the parts of the cost model reading those sections use it, so
that refreshing a packaged profile does not move them.

:func:`refused_edit` writes a packaged profile with one section edited by hand and runs
``pdlsim predict`` on it in this process: the reader's refusal of a damaged field.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEP_TABLES = Path(__file__).resolve().parent / "data" / "profiles" / "xeon-2core-2026-11-24.json"


def refused_edit(
    tmp_path: Path, capsys: Any, keys: tuple[str, ...], edit: Callable[[Any], object]
) -> tuple[Path, str]:
    """``h200-16core`` with ``edit`` applied to ``models.<keys...>``, written to a file and
    predicted at 8 ranks on one node: the file and the one line of its refusal (asserted: exit
    2, a single line)."""
    from calibration.profile import load_profile
    from pdlsim.cli.main import main

    doc = load_profile("h200-16core").to_dict()
    section = doc["models"]
    for key in keys:
        section = section[key]
    edit(section)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    status = main(["predict", "--nodes", "1", "--procs-per-node", "8", "--profile", str(path)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err, err
    return path, err
