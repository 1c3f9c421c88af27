"""What gradient compression costs a rank, from the profile's measurements (or a GPU data sheet).

:meth:`pdlsim.costmodel.model.ProfileCostModel.compression_time` answers through
:func:`compression_seconds`. Phases, for a bucket of ``nbytes`` float32 gradient bytes:
``compress`` (before the collective), ``decompress`` (after it: the fp16 cast back, or for
top-k zeroing a dense gradient and scatter-adding the ``ranks`` contributions an allgather
delivers), ``round_trip`` (both).

**CPU ranks**: the profile's :class:`calibration.compression.CompressionModel`, fitted to
``python -m microbench compression`` (numpy on the host). Top-k was measured at one density
F_m: compressing is dominated by the O(n) selection and is used as measured; expanding is
``decompress(n) + (ranks F / F_m - 1) scatter(n)`` (the measured expansion holds one rank's
scatter at F_m; each further rank's, scaled to density F, adds one ``scatter``).

**GPU ranks** (an **assumption**, not measured): memory-bound kernels at the preset's HBM
bandwidth x the assumed ``gpu_memory_efficiency`` (:data:`pdlsim.costmodel.presets.ASSUMPTIONS`),
one kernel launch each. Bytes moved per float32 element: fp16 6 each way (read 4, write 2); top-k
compression 8 (two passes over the gradient, as a radix select does) plus 8 per kept element,
expansion 4 (zeroing) plus 16 per received element (read the pair, read-modify-write the value).
"""

from __future__ import annotations

from typing import Any

from pdlsim.sim.cluster import ConfigError
from pdlsim.sim.compression import parse_compression

__all__ = ["PHASES", "compression_seconds"]

PHASES = ("compress", "decompress", "round_trip")


def compression_seconds(
    model: Any,
    method: str,
    nbytes: int,
    phase: str = "round_trip",
    ranks: int = 1,
    gpu_bytes_per_s: float | None = None,
    kernel_launch_s: float = 0.0,
) -> float:
    """Seconds for ``phase`` of ``method`` on ``nbytes`` (module docstring). ``model``: the
    profile's compression model or None; ``gpu_bytes_per_s``: given for GPU ranks."""
    if phase not in PHASES:
        raise ValueError(f"unknown compression phase '{phase}'; known: {', '.join(PHASES)}")
    parsed = parse_compression(method)
    if parsed is None:
        return 0.0
    if phase == "round_trip":
        return sum(
            compression_seconds(model, method, nbytes, p, ranks, gpu_bytes_per_s, kernel_launch_s)
            for p in ("compress", "decompress")
        )
    name, density = parsed
    if gpu_bytes_per_s is not None:
        return kernel_launch_s + _gpu_bytes(name, density, nbytes, phase, ranks) / gpu_bytes_per_s
    if model is None:
        raise ConfigError(
            "the profile has no compression model: measure one with 'python -m microbench "
            "compression --out DIR' and calibrate from DIR, or leave --compression out"
        )
    if name not in model.methods:
        raise ConfigError(f"the profile's compression model has no '{name}' measurements")
    if name == "fp16" or phase == "compress":
        return float(model.predict(name, phase, nbytes))
    measured = model.density_.get(name, density)
    extra = ranks * density / measured - 1.0
    expand = float(model.predict(name, "decompress", nbytes))
    return max(0.0, expand + extra * float(model.predict(name, "scatter", nbytes)))


def _gpu_bytes(name: str, density: float | None, nbytes: int, phase: str, ranks: int) -> float:
    if name == "fp16":
        return 1.5 * nbytes
    kept = density * nbytes / 4  # elements
    if phase == "compress":
        return 2.0 * nbytes + 8.0 * kept
    return float(nbytes) + 16.0 * kept * ranks
