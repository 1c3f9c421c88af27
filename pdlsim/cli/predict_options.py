"""Option groups that ``pdlsim predict`` and ``pdlsim sweep`` share beyond the common ones:
power, parallelism, what-ifs, checkpoints; with the argument types they parse with."""

from __future__ import annotations

import argparse
import math
from typing import Any

from pdlsim.cli.args import positive_int
from pdlsim.costmodel.limits import watts_problem
from pdlsim.prediction.checks import (
    MAX_CORES_PER_SOCKET,
    MAX_SOCKETS,
    MAX_WATTS,
    PARALLEL_MODES,
    SCHEDULES,
)
from pdlsim.prediction.energy import CPU_POWER_PRESET, POWER_PRESETS
from pdlsim.prediction.reliability import DEFAULT_LATENCY, DEFAULT_RESTART, DEFAULT_WRITE_RATE


def _watts_pair(flag: str, unit: str) -> Any:
    def parse(text: str) -> tuple[float, float]:
        try:
            idle, busy = (float(x) for x in text.split(","))
        except ValueError:
            idle = busy = -1.0
        if not 0 <= idle <= busy <= MAX_WATTS:
            raise argparse.ArgumentTypeError(
                f"expected IDLE,BUSY watts {unit} with 0 <= IDLE <= BUSY <= {MAX_WATTS:,.0f} "
                f"(e.g. 80,270), got '{text}'"
            )
        problem = watts_problem(idle, "IDLE") or watts_problem(busy, "BUSY")
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return idle, busy

    parse.__name__ = flag  # argparse names the type in its messages
    return parse


def _sockets(text: str) -> tuple[int, int]:
    sockets_text, _, cores_text = text.lower().partition("x")
    try:  # int(), not str.isdigit(): '²' is a digit to isdigit and no number to int
        sockets, cores = int(sockets_text), int(cores_text)
    except ValueError:
        sockets = cores = 0
    if not (1 <= sockets <= MAX_SOCKETS and 1 <= cores <= MAX_CORES_PER_SOCKET):
        raise argparse.ArgumentTypeError(
            f"expected SOCKETSxCORES per node, e.g. 2x40 (2 sockets of 40 cores; at most "
            f"{MAX_SOCKETS}x{MAX_CORES_PER_SOCKET}), got '{text}'"
        )
    return sockets, cores


def _watts(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_WATTS:
        raise argparse.ArgumentTypeError(f"expected watts from 0 to {MAX_WATTS:,.0f}, got '{text}'")
    problem = watts_problem(value, "the figure")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def add_power_options(p: argparse.ArgumentParser) -> None:
    """The power-model flags of ``pdlsim predict`` and ``sweep``."""
    p.add_argument("--power-preset", default=None, metavar="NAME",
                   help=f"power model: {', '.join(POWER_PRESETS)} (default: the --gpu-preset's "
                   f"node for GPU runs, {CPU_POWER_PRESET} for CPU runs)")  # fmt: skip
    p.add_argument("--cpu-watts", type=_watts_pair("cpu-watts", "per socket"), default=None,
                   metavar="IDLE,BUSY", help="CPU watts per socket, e.g. 80,270")  # fmt: skip
    p.add_argument("--gpu-watts", type=_watts_pair("gpu-watts", "per GPU"), default=None,
                   metavar="IDLE,BUSY", help="GPU watts, e.g. 70,700")  # fmt: skip
    p.add_argument("--node-other-watts", type=_watts, default=None, metavar="W",
                   help="constant watts per node for the rest (memory, NICs, fans); 0")  # fmt: skip
    p.add_argument("--cpu-sockets", type=_sockets, default=None, metavar="SxC",
                   help="sockets x cores per socket of a node, e.g. 2x40")  # fmt: skip


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", choices=PARALLEL_MODES, default="data",
                   help="data (default), model (tensor: dense layers split over all ranks), "
                   "pipeline (layers split into --stages)")  # fmt: skip
    p.add_argument("--stages", type=positive_int, default=None, metavar="S",
                   help="pipeline stages (with --parallel pipeline)")  # fmt: skip
    p.add_argument("--microbatches", type=positive_int, default=None, metavar="M",
                   help="micro-batches per pipeline step (with --parallel pipeline)")  # fmt: skip
    p.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="pipeline schedule: 1f1b (default) or gpipe")  # fmt: skip
    p.add_argument("--inference", action="store_true",
                   help="forward pass only: no backward, update or gradient exchange")  # fmt: skip


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got '{text}'") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def compression_arg(text: str) -> str | None:
    """argparse type: none, fp16, topk or topk:F (F in (0, 1]); "none" is None."""
    from pdlsim.sim.compression import parse_compression

    try:
        parsed = parse_compression(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if parsed is None:
        return None
    return "fp16" if parsed[0] == "fp16" else f"topk:{parsed[1]:g}"


def speeds_arg(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated positive speeds, one per rank."""
    return tuple(positive_number(item.strip()) for item in text.split(","))


def add_whatif_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("what-ifs (pdlsim.prediction.whatif)")
    group.add_argument(
        "--compression",
        type=compression_arg,
        default=None,
        metavar="METHOD",
        help="none (default), fp16 or topk:F (keep F of the gradient, 0.01)",
    )
    group.add_argument(
        "--sync-every",
        type=positive_int,
        default=1,
        metavar="K",
        help="local SGD: allreduce every K-th step (1)",
    )
    group.add_argument(
        "--network-scale",
        type=positive_number,
        default=1.0,
        metavar="X",
        help="inter-node bandwidth x X (1)",
    )
    group.add_argument(
        "--latency-scale",
        type=positive_number,
        default=1.0,
        metavar="Y",
        help="inter-node latency x Y (1)",
    )
    group.add_argument(
        "--slow-ranks",
        type=int,
        default=0,
        metavar="K",
        help="the last K ranks are --slow-factor times slower",
    )
    group.add_argument("--slow-factor", type=positive_number, default=None, metavar="F",
                       help="how many times slower the --slow-ranks are, e.g. 2")  # fmt: skip
    group.add_argument(
        "--speeds",
        type=speeds_arg,
        default=None,
        metavar="S,...",
        help="relative speed of every rank (1 = the profile's device)",
    )
    group.add_argument("--balance", choices=("static", "proportional"), default="static",
                       help="batch per rank: equal (static) or proportional to speed")  # fmt: skip


def add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints and failures (pdlsim.prediction.reliability)")
    g.add_argument(
        "--checkpoint-every",
        default=None,
        metavar="STEPS|auto",
        help="steps between checkpoints; auto: Daly's optimum (needs --mtbf)",
    )
    g.add_argument(
        "--checkpoint-bw",
        default=None,
        metavar="RATE",
        help=f"checkpoint write bandwidth ({DEFAULT_WRITE_RATE}, an assumption)",
    )
    g.add_argument(
        "--checkpoint-latency",
        default=None,
        metavar="TIME",
        help=f"fixed cost per checkpoint ({DEFAULT_LATENCY}, an assumption)",
    )
    g.add_argument(
        "--mtbf",
        default=None,
        metavar="TIME",
        help="mean time between failures of ONE node, e.g. 5000h (none: no failures)",
    )
    restart = f"relaunch + reading the checkpoint ({DEFAULT_RESTART}, an assumption)"
    g.add_argument("--restart-time", default=None, metavar="TIME", help=restart)
