"""Profiles the tests read as fixtures, apart from the packaged ones a user gets.

``STEP_TABLES`` is a full calibration of a 2-core Xeon VM from before the kernel sweep: measured
whole steps (compute tables, drift, in-place steps and co-location at 2 ranks) and no kernel
tables. The tests that exercise the parts of the cost model reading those sections use it, so
that refreshing a packaged profile does not move them.
"""

from pathlib import Path

STEP_TABLES = Path(__file__).resolve().parent / "data" / "profiles" / "xeon-2core-2026-11-24.json"
