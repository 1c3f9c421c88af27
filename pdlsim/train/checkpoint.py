"""Checkpoints of a training run: the state needed to continue it exactly where it stopped.

A checkpoint is one ``checkpoint-step{global_step:08d}.npz`` file in the run directory, numpy's
zip of arrays, read back without pickle. Its members:

- ``header``: a JSON document (a 0-d string array) with the format name and version, the run's
  configuration and workload, the position (``epoch`` to continue, ``step``: steps of it done,
  ``global_step``: optimizer steps done in all), the state of the data-order generator as it
  was before that epoch's permutation was drawn, ``epoch_sums`` (the current epoch's loss,
  correct predictions and phase seconds so far, summed over ranks, and its elapsed time on rank
  0) and ``epochs`` (the results of the completed epochs);
- ``params``: the flat float32 weights, the same on every rank after the allreduce;
- the optimizer's state, named as :attr:`microbench.nn.optim.SGD.state` names it: ``velocity``
  (SGD with momentum), ``adam_m`` and ``adam_v`` (Adam, AdamW; their step count is the
  position's ``global_step``);
- ``running`` (where the network has any): its state that is not trained, batchnorm's running
  statistics (rank 0's: each rank's follow its own samples). Dropout's masks need no member:
  each step's are seeded by the run's seed, the rank and ``global_step``.

Rank 0 alone writes, atomically (temporary file, fsync, rename, directory fsync), so a run
killed at any moment leaves the previous checkpoint or the new one whole, never a torn file;
the newest :data:`KEEP` are kept. Every rank reads the same file on resume. A resumed run
repeats the uninterrupted one bit for bit when it runs with the same settings
(:data:`RESUME_MUST_MATCH`, checked), threads and device; with other threads or another
device, to float32 rounding.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from microbench.errors import UserError
from microbench.fileio import atomic_write_bytes, special_kind
from microbench.machine import utc_now
from pdlsim.train.checkpoint_header import header_problem
from pdlsim.train.config import TrainConfig

FORMAT = "pdlsim.checkpoint"
FORMAT_VERSION = 1
RUNNING = "running"  # the member holding the network's state that is not trained
KEEP = 2  # checkpoints kept: the newest, and one before it should the newest be damaged
_NAME = re.compile(r"checkpoint-step(\d{8,})\.npz")
_HEADER_KEYS = ("config", "workload", "position", "rng_state", "epoch_sums", "epochs")

# The settings that decide the computation, and the flag that sets each: a resume that
# differs in any of them is refused (threads, device, --epochs and --checkpoint-every may change).
RESUME_MUST_MATCH = {
    "model": "--model",
    "procs": "--procs",
    "batch_per_rank": "--batch",
    "lr": "--lr",
    "momentum": "--momentum",
    "optimizer": "--optimizer",
    "weight_decay": "--weight-decay",
    "scale_lr": "--scale-lr",
    "seed": "--seed",
    "data": "--data",
    "samples": "--samples",
    "test_samples": "--test-samples",
    "max_steps_per_epoch": "--max-steps",
    "init": "--init",
}


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: one line naming the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {path}: {problem}")


@dataclass(frozen=True)
class Checkpoint:
    header: dict[str, Any]
    params: np.ndarray
    state: dict[str, np.ndarray]  # the optimizer's arrays by name
    path: Path
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def velocity(self) -> np.ndarray | None:
        return self.state.get("velocity")

    @property
    def epoch(self) -> int:
        return int(self.header["position"]["epoch"])

    @property
    def step(self) -> int:
        return int(self.header["position"]["step"])

    @property
    def global_step(self) -> int:
        return int(self.header["position"]["global_step"])


def checkpoint_path(run_dir: Path, global_step: int) -> Path:
    return Path(run_dir) / f"checkpoint-step{global_step:08d}.npz"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run directory's checkpoints, oldest (fewest steps) first."""
    found = []
    for path in Path(run_dir).glob("checkpoint-step*.npz"):
        match = _NAME.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint ``--resume`` continues from; UserError when there is none."""
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise UserError(
            f"--resume: --out {run_dir} is {special_kind(run_dir) or 'a file'}, not a run "
            "directory; give the --out of the run to continue"
        )
    found = list_checkpoints(run_dir) if Path(run_dir).is_dir() else []
    if not found:
        raise UserError(
            f"--resume: no checkpoint in {run_dir} (a run writes them with --checkpoint-every "
            "N); give the --out of a run that did, or start without --resume"
        )
    return found[-1]


def _host(array: Any) -> np.ndarray:
    """A numpy or CuPy array as a numpy array on the host."""
    get = getattr(array, "get", None)
    return np.asarray(get() if callable(get) else array)


def save_checkpoint(
    run_dir: Path, header: dict[str, Any], params: Any, state: dict[str, Any], running: Any = None
) -> Path:
    """Write one checkpoint (``header`` without the format fields; ``state``: the optimizer's
    arrays by name; ``running``: the network's state that is not trained) and prune old ones."""
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "created_utc": utc_now(), **header}
    arrays = {"header": np.array(json.dumps(doc)), "params": _host(params)}
    arrays.update({name: _host(a) for name, a in state.items()})
    if running is not None and running.size:
        arrays[RUNNING] = _host(running)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path = checkpoint_path(run_dir, int(header["position"]["global_step"]))
    for stale in Path(run_dir).glob(".checkpoint-step*.npz.*.tmp"):  # left by a killed write
        stale.unlink(missing_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    for old in list_checkpoints(run_dir)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def _check_header(path: Path, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(path, f"not a {FORMAT} file")
    if doc.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            path,
            f"format version {doc.get('format_version')!r}, but this pdlsim reads version "
            f"{FORMAT_VERSION}",
        )
    missing = [key for key in _HEADER_KEYS if key not in doc]
    if missing:
        raise CheckpointError(path, f"header lacks {', '.join(missing)}")
    if _diverged(doc):
        raise CheckpointError(
            path, "the run had diverged when it was written (its loss is not finite), so its "
            "weights are no state to continue from; train afresh with a lower --lr"
        )  # fmt: skip
    problem = header_problem(doc)
    if problem is not None:
        raise CheckpointError(path, f"{problem} (was it edited?)")
    return doc


def _diverged(doc: dict[str, Any]) -> bool:
    """Whether the training loop had recorded a non-finite loss (its warning "the run
    diverged") by the time ``doc`` was written: in a finished epoch or the running one."""
    sums = doc.get("epoch_sums")
    losses = [e.get("loss") for e in doc.get("epochs") or [] if isinstance(e, dict)]
    losses.append(sums.get("loss") if isinstance(sums, dict) else None)
    return any(isinstance(x, float) and not math.isfinite(x) for x in losses)


def _header_json(path: Path, text: str) -> Any:
    """The header's JSON (``json.loads``, not :func:`microbench.fileio.loads`: the generator
    state holds 128-bit integers); nested past the recursion limit it is a CheckpointError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CheckpointError(path, "header nested too deeply (was it edited?)") from None


def _is_zip(path: Path) -> bool:
    """Whether ``path`` is a zip as numpy tells one: by its first bytes (a zip's local header, or
    the end record of an empty one). :func:`zipfile.is_zipfile` looks only at the end, so a zip
    damaged at its start passed it, and numpy took it for a pickle ("allow_pickle=...")."""
    with path.open("rb") as file:
        head = file.read(4)
    return head in (b"PK\x03\x04", b"PK\x05\x06") and zipfile.is_zipfile(path)


def _read(path: Path, arrays: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The checked header and, with ``arrays``, the arrays; CheckpointError if unusable.

    Only a regular file that is a zip is opened: numpy would wait forever on a FIFO, and takes
    any other file for a pickle (a truncated checkpoint would be reported as "pickled data").
    A member that is no ``.npy`` array (numpy hands it back as bytes) is refused by name."""
    try:
        kind = special_kind(path)
        if kind is not None:
            raise CheckpointError(path, f"is {kind}, not a checkpoint file")
        if path.exists() and not _is_zip(path):
            raise CheckpointError(
                path, "unreadable: not a zip of arrays (cut off, or not a checkpoint)"
            )
        with np.load(path, allow_pickle=False) as members:
            if "header" not in members.files:
                raise CheckpointError(path, "no header member")
            header = _check_header(path, _header_json(path, str(members["header"])))
            if arrays and "params" not in members.files:
                raise CheckpointError(path, "no params member")
            names = [n for n in members.files if n != "header"] if arrays else []
            found = {name: members[name] for name in names}
            for name, array in found.items():
                if not isinstance(array, np.ndarray):
                    raise CheckpointError(path, f"member {name!r} is not a numpy array")
            return header, found
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(path, f"unreadable ({type(exc).__name__}: {exc})") from None


def read_header(path: Path) -> dict[str, Any]:
    """A checkpoint's checked JSON header, without reading its arrays."""
    return _read(Path(path), arrays=False)[0]


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and check a checkpoint (without pickle); CheckpointError says what is wrong."""
    path = Path(path)
    header, arrays = _read(path, arrays=True)
    params = arrays.pop("params")
    running = arrays.pop(RUNNING, np.zeros(0, np.float32))
    for name, array in (("params", params), (RUNNING, running)):
        if array.dtype != np.float32 or array.ndim != 1:
            raise CheckpointError(path, f"{name} are {array.dtype} {array.shape}, not flat float32")
    for name, array in arrays.items():
        if array.shape != params.shape:
            raise CheckpointError(path, f"{name} {array.shape} does not match params")
    for name, array in (("params", params), (RUNNING, running), *arrays.items()):
        if array.dtype.kind != "f" or not np.all(np.isfinite(array)):
            raise CheckpointError(path, f"{name} hold values that are not finite numbers")
    _order_generator(path, header)
    return Checkpoint(header, params, arrays, path, running)


def _order_generator(path: Path, header: dict[str, Any]) -> np.random.Generator:
    """The data-order generator (numpy's default, as the training loop draws it) in the state
    ``header`` saved; a CheckpointError where that state is none numpy takes: found on
    loading, so that ``--resume`` refuses it before any rank starts."""
    order = np.random.default_rng()
    try:
        order.bit_generator.state = header["rng_state"]
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(path, f"bad data-order generator state ({exc})") from None
    return order


def _flag(flag: str, value: Any, exact: bool = False) -> str:
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {'(default)' if value is None else repr(value) if exact else value}"


def check_resumable(
    header: dict[str, Any], config: TrainConfig, workload: dict, path: Path
) -> None:
    """Refuse, with one line naming every difference, a resume that would not continue the run
    ``header`` describes; ``workload`` is the current workload's ``to_dict()``."""
    # a setting newer than the checkpoint was at its default then
    saved = {**TrainConfig().to_dict(), **header["config"]}
    now = config.to_dict()
    differ = [key for key in RESUME_MUST_MATCH if saved.get(key) != now[key]]
    if differ:
        was = " ".join(_flag(RESUME_MUST_MATCH[k], saved.get(k)) for k in differ)
        asked = " ".join(_flag(RESUME_MUST_MATCH[k], now[k]) for k in differ)
        if was == asked:  # alike but for their types (an edited header's "1" for 1)
            was = " ".join(_flag(RESUME_MUST_MATCH[k], saved.get(k), True) for k in differ)
            asked = " ".join(_flag(RESUME_MUST_MATCH[k], now[k], True) for k in differ)
        raise UserError(
            f"--resume: {path} was written with {was}, not {asked}; give the same settings to "
            "resume it, or train into a new --out"
        )
    if header["workload"] != json.loads(json.dumps(workload)):
        raise UserError(
            f"--resume: {path} was written for another workload than {config.model} has now "
            "(its layers changed); restore the workload file, or train into a new --out"
        )
    position = header["position"]
    started = position["epoch"] + (1 if position["step"] > 0 else 0)
    if config.epochs < started:
        raise UserError(
            f"--resume: {path} is already in epoch {started} of the run; give --epochs "
            f"{started} or more"
        )


def restore(
    path: Path, config: TrainConfig, workload: dict, net: Any, opt: Any, order: Any,
    steps: int | None = None, phases: tuple[str, ...] = (),
) -> Checkpoint:  # fmt: skip
    """Load ``path`` into the network's weights, the optimizer's state and the data-order
    generator ``order`` (a numpy Generator), checking first that it continues this run: of
    ``steps`` per epoch (where given), its sums timing ``phases``."""
    ckpt = load_checkpoint(path)
    check_resumable(ckpt.header, config, workload, ckpt.path)
    if steps is not None and ckpt.step >= steps:
        raise CheckpointError(
            ckpt.path, f"position step {ckpt.step} is past the epoch's {steps} steps"
        )
    done = [entry["steps"] for entry in ckpt.header["epochs"]]
    wrong = next((i for i, n in enumerate(done) if n != steps), None)
    if steps is not None and wrong is not None:
        raise CheckpointError(
            ckpt.path, f"epochs[{wrong}].steps is {done[wrong]}, but this run's epochs take "
            f"{steps} steps (was it edited?)"
        )  # fmt: skip
    missing = [name for name in phases if name not in ckpt.header["epoch_sums"]["phases_s"]]
    if missing:
        raise CheckpointError(ckpt.path, f"epoch_sums' phases_s lacks {', '.join(missing)}")
    if ckpt.params.shape != tuple(net.params.shape):
        raise CheckpointError(
            ckpt.path, f"{ckpt.params.size} weights, but the network has {net.params.size}"
        )
    if set(ckpt.state) != set(opt.state_names()):
        held = ", ".join(sorted(ckpt.state)) or "none"
        raise CheckpointError(
            ckpt.path, f"its optimizer state ({held}) does not match --optimizer/--momentum"
        )
    order.bit_generator.state = _order_generator(ckpt.path, ckpt.header).bit_generator.state
    if ckpt.running.size != net.state.size:
        raise CheckpointError(
            ckpt.path, f"{ckpt.running.size} running statistics, but the network has "
            f"{net.state.size}"
        )  # fmt: skip
    net.params[...] = net.xp.asarray(ckpt.params)  # in place: the layers hold views of it
    net.state[...] = net.xp.asarray(ckpt.running)
    net.steps = ckpt.global_step
    opt.load_state(ckpt.state, ckpt.global_step)
    return ckpt


def records_path(run_dir: Path, rank: int, resumed: bool) -> Path:
    """This rank's records: ``rankR.jsonl``; a resumed run adds ``rankR.resumeK.jsonl`` (the
    first K free), so that every file's header (pid, host, time) is true for its records."""
    path = Path(run_dir) / f"rank{rank}.jsonl"
    k = 1
    while resumed and path.exists():
        path = Path(run_dir) / f"rank{rank}.resume{k}.jsonl"
        k += 1
    return path
