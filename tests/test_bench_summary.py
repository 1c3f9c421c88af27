"""The bench's printed summary: jitter tables pool the moments, one table per rank count."""

from __future__ import annotations

from pdlsim.cli.bench_summary import jitter_summaries


def _per_rank(rank: int, moment: str | None, samples: list[float], ranks: int = 2) -> dict:
    params = {"model": "mlp", "batch": 32, "threads": 1, "ranks": ranks, "rank": rank,
              "statistic": "per_rank"}  # fmt: skip
    if moment is not None:
        params["moment"] = moment
    return {"type": "measurement", "benchmark": "jitter", "name": "step_compute",
            "params": params, "samples": samples}  # fmt: skip


def test_moments_are_pooled_per_rank_and_each_keeps_its_own_wait():
    """Moment 1: ranks at 1.0 and 1.2 ms (the mean rank waits 0.1 ms, 9.1% of the 1.1 ms
    median); moment 2: both at 1.0 ms (no wait). Pooled: 2 ranks x 4 samples, 0.05 ms."""
    records = [
        _per_rank(0, "jitter 1 of 2", [1e-3, 1e-3]),
        _per_rank(1, "jitter 1 of 2", [1.2e-3, 1.2e-3]),
        _per_rank(0, "jitter 2 of 2", [1e-3, 1e-3]),
        _per_rank(1, "jitter 2 of 2", [1e-3, 1e-3]),
        _per_rank(0, None, [1e-3, 1.1e-3, 1e-3], ranks=1),
    ]
    one, two = jitter_summaries(records)
    assert "1 rank(s) x 3 samples" in one and "each moment" not in one
    assert "2 rank(s) x 4 samples" in two
    assert "expected wait of the mean rank for the slowest: 0.050 ms per step" in two
    assert two.endswith("jitter 1 of 2: 9.1%, jitter 2 of 2: 0.0%")
