"""Training runs the checkpoint and stop tests share: a tiny run's arguments, and a run stopped
by a signal once its first checkpoint is written."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from pdlsim.train.checkpoint import list_checkpoints
from tests.conftest import MPI_TIMEOUT_S

# A run of four steps with a checkpoint every two (the mlp preset, synthetic data).
TINY = ["--samples", "64", "--test-samples", "16", "--batch", "16", "--checkpoint-every", "2"]


def stop_after_first_checkpoint(
    args: list[str], out: Path, sig: int, timeout_s: float = 60.0
) -> tuple[int, str]:
    """Start ``pdlsim ARGS --out OUT``, send it ``sig`` once a checkpoint appears there, and
    return its exit status and stderr. SIGINT reaches it as a terminal's Ctrl-C would, even
    where the test runner ignores SIGINT."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pdlsim", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + MPI_TIMEOUT_S
        while not (out.is_dir() and list_checkpoints(out)):
            assert process.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=timeout_s)
    finally:
        process.kill()
        process.wait()
    return process.returncode, stderr
