"""Progress of a long command on stderr, never on stdout (which carries tables and JSON).

On a terminal one line is rewritten after every item (``sweep: 12/42 configurations``); into a
file or a pipe, a line at most every :data:`QUIET_INTERVAL_S` seconds and at the end, so that
logs stay short. Nothing is printed for work that ends within :data:`FIRST_AFTER_S` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["FIRST_AFTER_S", "QUIET_INTERVAL_S", "Progress"]

FIRST_AFTER_S = 2.0  # quick commands stay silent
QUIET_INTERVAL_S = 10.0


class Progress:
    """A callable ``(done, total)`` that reports ``{what}: done/total {unit}`` on ``stream``."""

    def __init__(self, what: str, unit: str, stream: TextIO | None = None) -> None:
        self.what, self.unit = what, unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.last: float | None = None  # when the last line was printed

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.start < FIRST_AFTER_S:
            return
        line = f"{self.what}: {done}/{total} {self.unit}"
        if self.tty:
            self.stream.write(f"\r{line}" + ("\n" if done >= total else ""))
        elif done >= total or self.last is None or now - self.last >= QUIET_INTERVAL_S:
            self.stream.write(line + "\n")
        else:
            return
        self.stream.flush()
        self.last = now
