"""Which GEMMs a BLAS computes with its small-matrix kernel, and so on which side of a jump.

Some BLAS builds send small GEMMs to a separate kernel that neither packs its operands nor
spreads over threads (OpenBLAS on AVX-512 cores: below a million multiply-adds). Its speed is
not the packed kernel's: on a Xeon VM, a 4096 x 5 x 48 GEMM takes 36 us and 4096 x 5 x 49, one
column of ``k`` more and past the limit, 80 us. A table interpolated across that line prices
every shape near it from the wrong kernel's points, so :class:`~calibration.kernel_tables.
GemmTable` interpolates each kernel's points apart, choosing the side by
:meth:`SmallGemm.takes`.

The rules are data (``calibration/blas_small_gemm.json``), matched to the BLAS the kernel sweep
recorded (``machine.blas``: library and core type); ``benchmarks/blas_regimes.py`` times shapes
either side of a rule's line on the machine at hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RULES_FILE", "SmallGemm", "small_gemm_rules"]

RULES_FILE = Path(__file__).with_name("blas_small_gemm.json")


@dataclass(frozen=True)
class SmallGemm:
    """The shapes (m, n, k) of one layout that a BLAS computes with its small-matrix kernel:
    ``m * n * k <= max_mnk``, ``m * n <= max_mn`` and ``k >= min_k``."""

    max_mnk: float
    max_mn: float = math.inf
    min_k: float = 0.0

    def __post_init__(self) -> None:
        if not (self.max_mnk > 0 and self.max_mn > 0 and self.min_k >= 0):
            raise ValueError(f"a small-GEMM rule needs positive limits, not {self}")

    def takes(self, m: float, n: float, k: float) -> bool:
        """Whether the small-matrix kernel computes ``(m x k) @ (k x n)``."""
        return m * n * k <= self.max_mnk and m * n <= self.max_mn and k >= self.min_k

    def to_dict(self) -> dict[str, float]:
        out = {"max_mnk": self.max_mnk}
        if math.isfinite(self.max_mn):
            out["max_mn"] = self.max_mn
        if self.min_k:
            out["min_k"] = self.min_k
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SmallGemm:
        if not isinstance(doc, dict) or "max_mnk" not in doc:
            raise ValueError(
                f"a small-GEMM rule is an object with max_mnk (and max_mn, min_k), not {doc!r}"
            )
        return cls(
            float(doc["max_mnk"]),
            float(doc.get("max_mn", math.inf)),
            float(doc.get("min_k", 0.0)),
        )


def small_gemm_rules(
    blas: str | None, architecture: str | None, path: Path = RULES_FILE
) -> dict[str, SmallGemm]:
    """The small-kernel rule of each layout for BLAS library ``blas`` on core type
    ``architecture`` (as threadpoolctl names them); empty for a build the file does not list."""
    if not blas or not architecture:
        return {}
    for build in json.loads(path.read_text())["builds"]:
        if build["blas"].lower() == blas.lower() and architecture.lower() in {
            a.lower() for a in build["architectures"]
        }:
            return {layout: SmallGemm.from_dict(r) for layout, r in build["layouts"].items()}
    return {}
