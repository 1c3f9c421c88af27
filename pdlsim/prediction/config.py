"""One prediction's settings: :class:`PredictConfig` (what ``pdlsim predict``'s flags and the
Python API's arguments fill in), the units its rates and times are given in, and the profile it
prices with."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from microbench.argtypes import (
    check_flag,
    check_integer,
    check_integers,
    check_name,
    check_number,
    check_numbers,
)
from microbench.errors import UserError, shown_text
from pdlsim.costmodel.limits import MAX_TIME_S, MIN_TIME_S, RATE_RANGE_BYTES_PER_S

if TYPE_CHECKING:
    from calibration.profile import Profile
    from microbench.workload import Workload


_NUMBER = r"((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)"  # 25, 2.5, .5, 1e-6: what float() reads
_RATE = re.compile(rf"^\s*{_NUMBER}\s*([kMGT]?)(B|b|bit)/s\s*$")


_TIME = re.compile(rf"^\s*{_NUMBER}\s*(d|h|min|s|ms|us|ns)\s*$")

# What a number that is no quantity looks like: a sign, nan, inf; and a number with no unit.
_SIGNED = re.compile(r"^\s*-\s*(?:\d|\.\d|inf)", re.IGNORECASE)
_NOT_FINITE = re.compile(r"^\s*[+-]?\s*(nan|inf)", re.IGNORECASE)
_BARE = re.compile(rf"^\s*\+?{_NUMBER}\s*$")


_SECONDS = {"d": 86400.0, "h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _not_a_quantity(text: str, where: str, what: str, example: str) -> UserError:
    """Why ``text`` is no ``what`` (a time, a bandwidth), naming the real problem: a negative
    or non-finite number, a number without its unit, or no number at all."""
    shown = shown_text(text)
    if _NOT_FINITE.match(text):
        return UserError(f"{where}{what} must be a finite number with a unit like {example}, "
                         f"got '{shown}'")  # fmt: skip
    if _SIGNED.match(text):
        return UserError(f"{where}{what} cannot be negative, got '{shown}'; give one like "
                         f"{example}")  # fmt: skip
    if _BARE.match(text):
        return UserError(f"{where}'{shown}' has no unit; give {what} with one, like {example}")
    return UserError(f"{where}expected {what} like {example}, got '{shown}'")


def parse_rate(text: str, flag: str = "") -> float:
    """'25GB/s' -> 25e9 bytes/s; '100Gb/s' (bits) -> 12.5e9; within
    :data:`RATE_RANGE_BYTES_PER_S`; ``flag`` names the option in an error."""
    where = f"{flag}: " if flag else ""
    m = _RATE.match(text)
    if not m:
        raise _not_a_quantity(text, where, "a bandwidth", "25GB/s or 100Gb/s")
    if float(m.group(1)) <= 0:
        raise UserError(f"{where}a bandwidth must be above 0, got '{text}'")
    value = float(m.group(1)) * _PREFIX[m.group(2)]
    rate = value if m.group(3) == "B" else value / 8
    low, high = RATE_RANGE_BYTES_PER_S
    if not low <= rate <= high:
        raise UserError(f"{where}bandwidth '{text}' is out of range: give 1B/s to 1000TB/s")
    return rate


def parse_time(text: str, flag: str = "") -> float:
    """'2us' -> 2e-6 s; 'ns', 'us', 'ms', 's', 'min', 'h' and 'd' are understood; 0 or from
    :data:`MIN_TIME_S` to :data:`MAX_TIME_S`; ``flag`` names the option in an error. Never
    negative (a caller that needs a time above 0 checks for 0 itself)."""
    where = f"{flag}: " if flag else ""
    m = _TIME.match(text)
    if not m:
        raise _not_a_quantity(text, where, "a time", "2us, 1.5ms, 60s or 5000h")
    seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if not seconds <= MAX_TIME_S:
        raise UserError(f"{where}time '{text}' is out of range: give at most {MAX_TIME_S:.0e} s")
    if 0 < seconds < MIN_TIME_S:
        raise UserError(
            f"{where}time '{shown_text(text)}' is out of range: give 0 or at least "
            f"{MIN_TIME_S:g} s (a picosecond)"
        )
    return seconds


@dataclass(frozen=True)
class PredictConfig:
    nodes: int = 1
    gpus: int = 0  # per node; 0: CPU ranks
    procs_per_node: int = 1
    threads: int = 1
    model: str | Workload = "cnn"  # a preset name, a workload file's path, or a Workload
    batch: int = 32
    tokens: int | None = None  # tokens per sample of a token network; None: its description's
    profile: str | Profile | None = None  # a packaged name or a path; None: the default
    network: str | None = None
    inter_bw: str | None = None
    inter_lat: str | None = None
    gpu_preset: str | None = None  # a GPU preset or file; None: the node's; "none": profile's
    node: str | None = None  # GPU ranks' node preset or file; None: DEFAULT_NODE_PRESET
    step_time: str | None = (
        None  # one GPU's measured step at the batch (pdlsim.prediction.gpu_step)
    )
    mfu: float | None = None  # or its model-FLOPs utilisation
    layer_times: str | None = None  # or its layers timed there (prediction.gpu_layers)
    grad_accum: int = 1  # micro-batches per optimizer step
    step_time_accum: int | None = None  # micro-batches per update when step_time was measured
    iterations: int = 100
    bucket_mb: float = 25.0
    overlap: bool = True
    pinned: bool = True
    prefetch: bool = False
    seed: int = 0
    samples: int = 20
    dataset_samples: int | None = None
    algorithm: str | None = None
    power_preset: str | None = None  # power model (pdlsim.prediction.energy); None: by device
    cpu_watts: tuple[float, float] | None = None  # idle, busy W per socket
    gpu_watts: tuple[float, float] | None = None  # idle, busy W per GPU
    node_other_watts: float | None = None
    cpu_sockets: tuple[int, int] | None = None  # sockets, cores per socket
    parallel: str = "data"  # data, model or pipeline (pdlsim.prediction.layerwise)
    stages: int | None = None  # pipeline stages
    microbatches: int | None = None  # micro-batches per pipeline step
    schedule: str | None = None  # gpipe or 1f1b (default)
    inference: bool = False  # forward pass only
    precision: str = "fp32"  # how the job trains (pdlsim.costmodel.training)
    optimizer: str = "sgd"
    compression: str | None = None  # what-ifs (pdlsim.prediction.whatif): none, fp16, topk:F
    sync_every: int = 1  # local SGD: allreduce every k-th step
    network_scale: float = 1.0  # inter-node bandwidth x
    latency_scale: float = 1.0  # inter-node latency x
    slow_ranks: int = 0  # the last K ranks ...
    slow_factor: float | None = None  # ... F times slower
    speeds: tuple[float, ...] | None = None  # or one speed per rank
    balance: str = "static"  # batch per rank: static or proportional to speed
    checkpoint_every: str | None = None  # steps, or "auto" (pdlsim.prediction.reliability)
    checkpoint_bw: str | None = None
    checkpoint_latency: str | None = None
    mtbf: str | None = None  # per node
    restart_time: str | None = None
    corrections: str = "all"  # named corrections switched on (pdlsim.costmodel.corrections)
    hardware: str | None = None  # a file overlaying the packaged presets and assumptions
    allow_oversubscribed_memory: bool = False  # predict a layout that does not fit anyway

    def __post_init__(self) -> None:
        for name, value in checked_types(self).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """The settings as the JSON document's ``config``: a workload or a profile given as an
        object appears by its name."""
        model = self.model if isinstance(self.model, str) else self.model.name
        profile = self.profile if self.profile is None or isinstance(self.profile, str) else "given"
        return asdict(replace(self, model=model, profile=profile))


# What a setting of each declared type must be (microbench.argtypes), so that a script's
# ``batch="32"`` or ``overlap="no"`` is one line naming the setting, not a failure deep in the
# simulator or a wrong value taken; a text setting may not be empty (``network=""`` would else
# be taken as no network given, the default). ``model`` and ``profile`` are checked where they
# are loaded (Workload.load, resolve_profile).
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "int": check_integer,
    "int | None": check_integer,
    "float": check_number,
    "float | None": check_number,
    "bool": check_flag,
    "str": lambda name, v: check_name(name, v, _EXAMPLES.get(name, "")),
    "str | None": lambda name, v: check_name(name, v, _EXAMPLES.get(name, "")),
    "tuple[float, float] | None": lambda name, v: check_numbers(name, v, 2),
    "tuple[int, int] | None": lambda name, v: check_integers(name, v, 2),
    "tuple[float, ...] | None": check_numbers,
}
CHECKED_ELSEWHERE = frozenset({"model", "profile"})

# How the settings given as text are spelled, for the error that refuses another type.
_EXAMPLES = {
    "inter_bw": "'25GB/s'", "checkpoint_bw": "'2GB/s'", "inter_lat": "'2us'",
    "checkpoint_latency": "'1ms'", "step_time": "'60ms'", "mtbf": "'5000h'",
    "restart_time": "'10min'", "checkpoint_every": "'auto' or '500'",
}  # fmt: skip


def checked_types(cfg: PredictConfig) -> dict[str, Any]:
    """The settings of ``cfg`` whose value is not in its declared type's canonical form, in
    that form (a numpy integer as an int, a list as a tuple); an
    :class:`~microbench.argtypes.ArgumentTypeError` for a value of another type."""
    changed = {}
    for f in fields(cfg):
        value = given = getattr(cfg, f.name)
        if f.name in CHECKED_ELSEWHERE or (value is None and str(f.type).endswith("None")):
            continue
        if f.name == "checkpoint_every" and type(value) is int:
            value = str(value)  # a number of steps, as the flag spells it
        checked = _CHECKS[str(f.type)](f.name, value)
        if checked is not given:
            changed[f.name] = checked
    return changed


# The settings that may name an input file, by their flags: an output must not be one of them.
INPUT_FILES = {
    "model": "--model", "profile": "--profile", "network": "--network", "node": "--node",
    "gpu_preset": "--gpu-preset", "hardware": "--hardware", "layer_times": "--layer-times",
}  # fmt: skip


def check_not_an_input(cfg: PredictConfig, output: str | os.PathLike[str], flag: str) -> None:
    """Refuse ``output`` (given as ``flag``) when it is one of ``cfg``'s input files, by any
    name (a link, ``./``, another spelling): writing it would replace the workload, profile or
    preset the result was computed from, and a rerun would then read the output instead."""
    for name, input_flag in INPUT_FILES.items():
        value = getattr(cfg, name)
        if isinstance(value, (str, os.PathLike)) and _same_file(value, output):
            raise UserError(
                f"{flag} {os.fspath(output)} is the {input_flag} file {os.fspath(value)}: "
                f"writing it would replace that input; give {flag} another name"
            )


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` are one existing file (False when either is none)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # missing, unreadable, or a NUL in a name
        return False


# The profile a prediction uses without --profile: the first of these that is packaged (else
# the first packaged one). The 2-core Xeon VM's, which the README's examples print (its kernel
# tables and step terms price any workload); the others are there for --profile.
DEFAULT_PROFILES = ("xeon-2core",)


def resolve_profile(name: str | os.PathLike[str] | Profile | None) -> tuple[Profile, str]:
    """The profile a prediction prices with, and what to call it: a packaged name or a path,
    the packaged default (:data:`DEFAULT_PROFILES`) for None, or a profile already loaded."""
    from calibration.profile import Profile, ProfileError, load_profile, packaged_profile_names

    if isinstance(name, Profile):
        try:
            return name.checked(), f"given (created {name.created_utc})"
        except ProfileError as exc:
            raise UserError(f"--profile: {exc}") from None
    if name is None:
        names = packaged_profile_names()
        if not names:
            raise UserError("no packaged reference profile is installed; give --profile PATH")
        name = next((n for n in DEFAULT_PROFILES if n in names), names[0])
    try:
        return load_profile(name), str(name)
    except ProfileError as exc:
        raise UserError(f"--profile: {exc}") from None
