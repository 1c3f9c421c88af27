"""Hardware presets from public data sheets: network links between nodes, and GPUs.

These are **data-sheet figures, not measurements**: peak rates as vendors publish them. A
profile measured on one node says nothing about the network between nodes or about a GPU it
did not have, so a prediction for such a cluster combines the measured profile with one of
these; the prediction's provenance says which numbers came from here.

Network presets give the per-direction signalling rate of one port (what a single NIC can move
per second) and a typical one-way small-message latency as published with the product family.
The bandwidth is the line rate: protocol overheads (encoding, headers) are not subtracted, so a
prediction with a preset is optimistic by the few percent those cost.

GPU presets give dense (no sparsity) FP32 peaks, HBM bandwidth, the host link (PCIe, per
direction, theoretical) and NVLink (total bidirectional bandwidth per GPU, as the data sheets
state it), and memory capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from microbench.errors import UserError

__all__ = [
    "DEFAULT_GPU_PRESET",
    "DEFAULT_NETWORK_PRESET",
    "GPU_PRESETS",
    "NETWORK_PRESETS",
    "GpuPreset",
    "NetworkPreset",
    "gpu_preset",
    "network_preset",
]


@dataclass(frozen=True)
class NetworkPreset:
    """One inter-node link (a NIC port): latency and per-direction bandwidth."""

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    source: str
    kind: str = "data sheet"  # or "given" (from --inter-bw/--inter-lat)

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_bytes_per_s > 0):
            raise UserError(
                f"network '{self.name}': latency must be >= 0 and bandwidth > 0, "
                f"got {self.latency_s} s and {self.bandwidth_bytes_per_s} B/s"
            )


@dataclass(frozen=True)
class GpuPreset:
    """One GPU from its data sheet (dense figures, no sparsity)."""

    name: str
    fp32_flops_per_s: float  # non-tensor-core FP32
    tf32_tensor_flops_per_s: float  # dense TF32 tensor core
    hbm_bandwidth_bytes_per_s: float
    pcie_bytes_per_s: float  # host link, per direction, theoretical
    nvlink_bytes_per_s: float  # total bidirectional NVLink bandwidth per GPU
    memory_bytes: int
    source: str
    kind: str = "data sheet"


_GB = 1e9
_TFLOPS = 1e12

# Gb/s of the port -> bytes/s: / 8.
NETWORK_PRESETS: dict[str, NetworkPreset] = {
    p.name: p
    for p in (
        NetworkPreset(
            "ib-hdr",
            1.0e-6,
            200e9 / 8,
            "NVIDIA ConnectX-6 / Quantum HDR InfiniBand data sheets: 200 Gb/s per port, "
            "sub-microsecond to ~1 us end-to-end latency (1 us taken)",
        ),
        NetworkPreset(
            "ib-ndr",
            1.0e-6,
            400e9 / 8,
            "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand data sheets: 400 Gb/s per port, "
            "~1 us end-to-end latency",
        ),
        NetworkPreset(
            "roce-100g",
            2.0e-6,
            100e9 / 8,
            "NVIDIA ConnectX-5/6 Ethernet data sheets: 100 GbE with RoCE v2; ~2 us "
            "application-level latency as published for RoCE on these adapters",
        ),
        NetworkPreset(
            "eth-25g",
            10.0e-6,
            25e9 / 8,
            "IEEE 802.3by 25GBASE line rate; ~10 us MPI latency over kernel TCP, a typical "
            "published figure for commodity 25 GbE (no RDMA)",
        ),
        NetworkPreset(
            "eth-10g",
            25.0e-6,
            10e9 / 8,
            "IEEE 802.3ae 10GBASE line rate; ~25 us MPI latency over kernel TCP, a typical "
            "published figure for commodity 10 GbE (no RDMA)",
        ),
    )
}

GPU_PRESETS: dict[str, GpuPreset] = {
    p.name: p
    for p in (
        GpuPreset(
            "h100-sxm",
            fp32_flops_per_s=67 * _TFLOPS,
            tf32_tensor_flops_per_s=495 * _TFLOPS,
            hbm_bandwidth_bytes_per_s=3350 * _GB,
            pcie_bytes_per_s=64 * _GB,
            nvlink_bytes_per_s=900 * _GB,
            memory_bytes=80 * 10**9,
            source="NVIDIA H100 Tensor Core GPU data sheet (SXM5): FP32 67 TFLOP/s, TF32 "
            "tensor 989 TFLOP/s with sparsity (495 dense), HBM3 3.35 TB/s, 80 GB, NVLink "
            "900 GB/s, PCIe Gen5 x16 (64 GB/s per direction)",
        ),
        GpuPreset(
            "a100-sxm",
            fp32_flops_per_s=19.5 * _TFLOPS,
            tf32_tensor_flops_per_s=156 * _TFLOPS,
            hbm_bandwidth_bytes_per_s=2039 * _GB,
            pcie_bytes_per_s=32 * _GB,
            nvlink_bytes_per_s=600 * _GB,
            memory_bytes=80 * 10**9,
            source="NVIDIA A100 Tensor Core GPU data sheet (80GB SXM4): FP32 19.5 TFLOP/s, TF32 "
            "tensor 156 TFLOP/s dense, HBM2e 2,039 GB/s, NVLink 600 GB/s, PCIe Gen4 x16 "
            "(32 GB/s per direction)",
        ),
        GpuPreset(
            "v100",
            fp32_flops_per_s=15.7 * _TFLOPS,
            tf32_tensor_flops_per_s=15.7 * _TFLOPS,  # no TF32: FP32 through CUDA cores
            hbm_bandwidth_bytes_per_s=900 * _GB,
            pcie_bytes_per_s=16 * _GB,
            nvlink_bytes_per_s=300 * _GB,
            memory_bytes=32 * 10**9,
            source="NVIDIA Tesla V100 data sheet (SXM2 32GB): FP32 15.7 TFLOP/s (no TF32), "
            "HBM2 900 GB/s, NVLink 300 GB/s, PCIe Gen3 x16 (16 GB/s per direction)",
        ),
    )
}

DEFAULT_NETWORK_PRESET = "ib-hdr"
DEFAULT_GPU_PRESET = "h100-sxm"


def network_preset(name: str) -> NetworkPreset:
    if name not in NETWORK_PRESETS:
        raise UserError(f"unknown network preset '{name}'; known: {', '.join(NETWORK_PRESETS)}")
    return NETWORK_PRESETS[name]


def gpu_preset(name: str) -> GpuPreset:
    if name not in GPU_PRESETS:
        raise UserError(f"unknown GPU preset '{name}'; known: {', '.join(GPU_PRESETS)}, none")
    return GPU_PRESETS[name]
