"""``pdlsim train``: one real training run in one execution mode, with per-phase timers."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microbench.cli import path_argument, under_launcher
from microbench.errors import UserError, shown_names
from microbench.fileio import check_folder_exists, check_writable, new_run_dir
from microbench.options import given
from microbench.threads import oversubscription, set_threads, size_numba_pool, too_many_threads
from pdlsim.cli.args import non_negative_float, positive_int, seed
from pdlsim.cli.train_summary import check_run_outputs, finish_run
from pdlsim.prediction.epoch import DATASET_SAMPLES, OTHER_DATASET_SAMPLES
from pdlsim.train.config import DEVICES, PARALLEL_MODES, TrainConfig
from pdlsim.train.launch import SUPERVISED_ENV, Stopped, launch_ranks, mpi_settings_in_env

if TYPE_CHECKING:
    from pdlsim.train.loop import TrainResult


def add_train_parser(commands: Any) -> None:

    epochs = ", ".join(f"{name} {n:,}" for name, n in DATASET_SAMPLES.items())
    p = commands.add_parser(
        "train",
        help="run real training (serial, threads, MPI, hybrid, GPU) with per-phase timers",
        description=(
            "Train a workload for real and time every phase of every step. --batch is the "
            "per-rank batch B; with P ranks the global batch is P x B and one step consumes "
            "P x B samples. The learning rate is not scaled with P unless --scale-lr is given. "
            "With --procs > 1 this command starts mpiexec itself; it also runs as one rank "
            "of a job you start with your own mpiexec or srun. --parallel model splits the "
            "dense layers' neurons over the ranks instead: every rank computes the same batch "
            "B, which is then the global batch. --inference times the forward pass only."
        ),
    )
    p.add_argument("--model", default="mlp", metavar="NAME|PATH", help="workload (default: mlp)")
    p.add_argument(
        "--procs",
        type=positive_int,
        default=None,
        help="MPI ranks (default: the size of the MPI job this runs in, else 1)",
    )
    p.add_argument("--threads", type=positive_int, default=1, help="BLAS/numba threads per rank")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cpu (default) or gpu (CuPy)")
    p.add_argument("--epochs", type=positive_int, default=1, help="passes over the data (1)")
    p.add_argument(
        "--batch",
        type=positive_int,
        default=32,
        help="per-rank batch B (default 32); with --parallel model the batch all ranks share",
    )
    p.add_argument(
        "--lr", type=non_negative_float, default=0.02, help="learning rate (default 0.02)"
    )
    p.add_argument("--momentum", type=non_negative_float, default=None,
                   help="SGD momentum (0; 0.9 with --optimizer momentum)")  # fmt: skip
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adamw"), default="sgd",
                   help="sgd (default), momentum (SGD with --momentum), adam, adamw")  # fmt: skip
    p.add_argument("--weight-decay", type=non_negative_float, default=0.0,
                   help="adam: L2 added to the gradient; adamw: decoupled (0)")  # fmt: skip
    p.add_argument("--scale-lr", action="store_true", help="linear scaling rule: lr x P")
    p.add_argument("--seed", type=seed, default=0, help="initialisation, data and order seed")
    p.add_argument(
        "--data",
        default="synthetic",
        metavar="SPEC",
        help="synthetic (default), mnist:DIR (IDX files) or cifar10:DIR (binary batches)",
    )
    p.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help="training samples (synthetic default: the workload's epoch, as pdlsim predict "
        f"prices it: {epochs}, a workload file {OTHER_DATASET_SAMPLES:,})",
    )
    p.add_argument("--test-samples", type=positive_int, default=1024, help="held-out samples")
    p.add_argument("--max-steps", type=positive_int, default=None, help="steps per epoch cap")
    p.add_argument("--init", choices=("he", "xavier"), default="he", help="weight init")
    p.add_argument("--pinned", action="store_true", help="GPU: copy batches from pinned memory")
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="GPU, with --pinned: copy the next mini-batch on a copy stream while this step "
        "computes (the h2d phase then times only the wait for it)",
    )
    p.add_argument("--out", type=path_argument, default=None, help="run directory for the records")
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=None,
        metavar="N",
        help="write a checkpoint (weights, optimizer, data order) into --out every N optimizer "
        "steps, counted across epochs, and at the end",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its latest checkpoint (same settings required)",
    )
    p.add_argument(
        "--parallel",
        choices=PARALLEL_MODES,
        default="data",
        help="data (default: a replica per rank, gradients allreduced) or model (dense layers' "
        "output neurons split over the ranks, activations gathered, one shared batch)",
    )
    p.add_argument(
        "--inference",
        action="store_true",
        help="time the forward pass (and loss) only: no backward, no update",
    )
    p.set_defaults(handler=run_train_command)


MAX_LR = 1000.0  # a learning rate, or a weight decay, beyond any that trains
# Passes over the data: long trainings run hundreds; a count with extra zeros would run (and
# write records) until stopped, --max-steps capping each epoch, not the epochs.
MAX_EPOCHS = 100_000


def config_from_args(args: argparse.Namespace, procs: int) -> TrainConfig:
    optimizer, momentum = _optimizer(args)
    if momentum >= 1.0:
        raise UserError(f"--momentum must be below 1, got {momentum}")
    if args.epochs > MAX_EPOCHS:
        raise UserError(
            f"--epochs must be at most {MAX_EPOCHS:,}, got {args.epochs:,}; to train on more "
            "data per epoch, give --samples"
        )
    if args.lr == 0:
        raise UserError("--lr must be above 0")
    if args.lr > MAX_LR:
        raise UserError(
            f"--lr must be at most {MAX_LR:g}, got {args.lr:g}: a larger step throws float32 "
            "weights to infinity at once; try 0.01-0.1"
        )
    if args.weight_decay > MAX_LR:
        raise UserError(f"--weight-decay must be at most {MAX_LR:g}, got {args.weight_decay:g}")
    checkpointing = args.checkpoint_every is not None or args.resume
    if args.pinned and args.device != "gpu":
        raise UserError("--pinned is for copies to a GPU: add --device gpu, or drop --pinned")
    if args.inference:
        for dest in ("lr", "momentum", "scale_lr", "optimizer", "weight_decay"):
            flag = given(args, dest)
            if flag:
                raise UserError(f"--inference updates no weights, so {flag} is unused: drop it")
    if args.prefetch and args.device != "gpu":
        raise UserError("--prefetch copies mini-batches to a GPU: add --device gpu --pinned")
    if args.prefetch and not args.pinned:
        raise UserError(
            "--prefetch needs --pinned: a copy from pageable memory cannot run behind the compute"
        )
    if args.parallel == "model" and args.scale_lr:
        raise UserError(
            "--scale-lr is for data parallelism (its global batch grows with P); model "
            "parallelism keeps the batch: drop --scale-lr"
        )
    if args.parallel == "model" and checkpointing:
        raise UserError(
            "--checkpoint-every/--resume are for data parallelism; drop them with --parallel model"
        )
    if args.inference and checkpointing:
        raise UserError(
            "--inference trains nothing, so there is nothing to checkpoint: drop "
            "--checkpoint-every/--resume"
        )
    return TrainConfig(
        model=args.model,
        procs=procs,
        threads=args.threads,
        device=args.device,
        epochs=args.epochs,
        batch_per_rank=args.batch,
        lr=args.lr,
        momentum=momentum,
        optimizer=optimizer,
        weight_decay=args.weight_decay,
        scale_lr=args.scale_lr,
        seed=args.seed,
        data=args.data,
        samples=args.samples,
        test_samples=args.test_samples,
        max_steps_per_epoch=args.max_steps,
        pinned=args.pinned,
        prefetch=args.prefetch,
        init=args.init,
        checkpoint_every=args.checkpoint_every,
        parallel=args.parallel,
        inference=args.inference,
    )


def _optimizer(args: argparse.Namespace) -> tuple[str, float]:
    """``(optimizer, momentum)`` of the flags: ``momentum`` is SGD with ``--momentum`` (0.9
    unless given); adam and adamw keep their own moments and take no ``--momentum``."""
    name, momentum = args.optimizer, args.momentum
    if name in ("adam", "adamw"):
        if momentum:
            raise UserError(f"--optimizer {name} keeps its own moments: drop --momentum")
        return name, 0.0
    if args.weight_decay:
        raise UserError("--weight-decay is for --optimizer adam or adamw")
    if name == "momentum":
        return "sgd", 0.9 if momentum is None else momentum
    return "sgd", momentum or 0.0


def _update(config: TrainConfig) -> str:
    """The optimizer as the banner names it."""
    if config.optimizer == "sgd":
        return f"momentum {config.momentum:g}"
    decay = f", weight decay {config.weight_decay:g}" if config.weight_decay else ""
    return f"optimizer {config.optimizer}{decay}"


def config_to_args(config: TrainConfig, out: Path, resume: bool = False) -> list[str]:
    """The command-line arguments that make a rank run ``config`` into ``out``."""
    args = ["train", "--model", config.model, "--procs", str(config.procs)]
    args += ["--threads", str(config.threads), "--device", config.device]
    args += ["--epochs", str(config.epochs), "--batch", str(config.batch_per_rank)]
    if not config.inference:  # no update: its settings are refused
        args += ["--lr", repr(config.lr), "--momentum", repr(config.momentum)]
        args += ["--optimizer", config.optimizer, "--weight-decay", repr(config.weight_decay)]
    args += ["--seed", str(config.seed), "--data", config.data, "--init", config.init]
    args += ["--test-samples", str(config.test_samples), "--out", str(out)]
    if config.samples is not None:
        args += ["--samples", str(config.samples)]
    if config.max_steps_per_epoch is not None:
        args += ["--max-steps", str(config.max_steps_per_epoch)]
    if config.checkpoint_every is not None:
        args += ["--checkpoint-every", str(config.checkpoint_every)]
    args += ["--scale-lr"] * config.scale_lr + ["--pinned"] * config.pinned
    args += ["--prefetch"] * config.prefetch
    args += ["--parallel", config.parallel] + ["--inference"] * config.inference
    return args + ["--resume"] * resume


def default_run_dir(config: TrainConfig) -> Path:
    """A new, empty ``runs/train/<workload>-<mode>-pPtT-<UTC date-time>`` (created here, so
    that two runs started in the same second get two folders)."""
    name = f"{Path(config.model).stem}-{config.mode.replace('+', '-')}"
    name += "-model" * (config.parallel == "model") + "-inference" * config.inference
    return new_run_dir(Path("runs") / "train", f"{name}-p{config.procs}t{config.threads}-")


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that is a file, lies in a folder that does not exist (a
    mistyped one is not created), or already holds records: never overwrite."""
    check_writable(run_dir, "dir", "--out", "for the run's records")
    check_folder_exists(run_dir, "--out", "--out")
    if run_dir.is_dir() and any(run_dir.glob("*.jsonl")):
        from pdlsim.train.checkpoint import list_checkpoints

        resume = ", or add --resume to continue it" if list_checkpoints(run_dir) else ""
        raise UserError(
            f"--out {run_dir} already holds records; choose a new directory (nothing is "
            f"overwritten){resume}"
        )
    check_run_outputs(run_dir)


def resume_checkpoint(run_dir: Path | None, config: TrainConfig) -> Path:
    """The checkpoint ``--resume`` continues from, checked against ``config`` (UserError)."""
    from microbench.workload import load_workload
    from pdlsim.train.checkpoint import (
        CheckpointError,
        check_resumable,
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
    )

    if run_dir is None:
        raise UserError("--resume needs --out DIR, the run directory to continue")
    path = latest_checkpoint(run_dir)
    try:  # arrays as well as header: a damaged one is refused here, not by every rank later
        header = load_checkpoint(path).header
    except CheckpointError as exc:  # the one before it is kept for this (checkpoint.KEEP)
        earlier = [p for p in list_checkpoints(run_dir) if p != path]
        fix = "start the run again into a new --out, without --resume"  # this one is taken
        if earlier:
            try:  # advise it only where it can be read: else the next try names it
                load_checkpoint(earlier[-1])
                fix = f"move it aside to resume from {earlier[-1].name}"
            except CheckpointError:
                fix = f"the one before it, {earlier[-1].name}, is unreadable too; {fix}"
        raise UserError(f"{exc}; {fix}") from None
    check_resumable(header, config, load_workload(config.model).to_dict(), path)
    check_run_outputs(run_dir)
    return path


def run_train_command(args: argparse.Namespace) -> int:
    if under_launcher():
        return _run_as_rank(args)
    if args.procs in (None, 1):  # this process trains: numba's pool as asked (warned below)
        size_numba_pool(args.threads)
    config = config_from_args(args, procs=args.procs or 1)
    resume = resume_checkpoint(args.out, config) if args.resume else None
    if resume is None and args.out is not None:
        check_run_dir(args.out)
    _validate(config)
    run_dir = args.out or default_run_dir(config)  # made only once the run is known to start
    warning = oversubscription(config.procs, config.threads)
    if warning:
        print(f"pdlsim: warning: {warning}", file=sys.stderr)
    if config.procs == 1:
        return _run_local(config, run_dir, resume)
    try:
        child_args = config_to_args(config, run_dir, resume=args.resume)
        status = launch_ranks(child_args, config.procs, config.threads)
    except KeyboardInterrupt:
        print(
            f"pdlsim: interrupted; all ranks stopped{_left_behind(run_dir)}",
            file=sys.stderr,
        )
        return 130
    except Stopped as stopped:
        print(
            f"pdlsim: stopped by {stopped}; all ranks stopped{_left_behind(run_dir)}",
            file=sys.stderr,
        )
        return 128 + stopped.signum
    if status == 2:  # a rank's one line (a UserError, before or in training) said why
        return 2
    if status != 0:
        print(
            f"pdlsim: error: training stopped: mpiexec exited with status {status} (a rank "
            f"failed or was killed){_mpi_settings_hint()}{_left_behind(run_dir)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _mpi_settings_hint() -> str:
    """What to check when mpiexec failed with MPI settings in the environment: their names."""
    names = mpi_settings_in_env()
    if not names:
        return ""
    them = "it" if len(names) == 1 else "them"
    return (
        f"; the environment sets {shown_names(names)} for MPI: check {them} against mpiexec's "
        f"message above, or unset {them}"
    )


def _left_behind(run_dir: Path | None) -> str:
    """The end of a stopped run's one line: where its records are and, where it wrote a
    checkpoint, how to continue it; or that it wrote none (stopped while it drew its data),
    rather than pointing at a folder that holds nothing, or at a --resume that would refuse."""
    from pdlsim.train.checkpoint import list_checkpoints

    if run_dir is None or not any(Path(run_dir).glob("*.jsonl")):
        return "; it had written no records yet"
    resume = "; continue from its last checkpoint with --resume"
    return f"; records so far are in {run_dir}" + resume * bool(list_checkpoints(run_dir))


def _validate(config: TrainConfig) -> None:
    """Catch bad input once, in the launching process, before any rank starts."""
    from microbench.workload import load_workload
    from pdlsim.train.device import gpu_device
    from pdlsim.train.epoch import checked_train_samples, model_steps_per_epoch, steps_per_epoch

    problem = too_many_threads(config.procs, config.threads)
    if problem is not None:
        raise UserError(problem)
    if config.device == "gpu":
        gpu_device()
    workload = load_workload(config.model)
    if config.parallel == "model":
        from microbench.nn.sliced import check_splittable

        check_splittable(workload, config.procs)
    samples = checked_train_samples(config, workload)
    if config.parallel == "model":
        model_steps_per_epoch(config, samples)
    else:
        steps_per_epoch(config, samples)


def _train(
    config: TrainConfig,
    comm: Any,
    device: Any,
    run_dir: Path,
    log: Any = print,
    resume: Path | None = None,
) -> TrainResult:
    """The data-parallel loop, or the model-parallel one (which never resumes)."""
    if config.parallel == "model":
        from pdlsim.train.model_loop import train_model_parallel

        return train_model_parallel(config, comm, device, run_dir, log=log)
    from pdlsim.train.loop import train

    return train(config, comm, device, run_dir, log=log, resume=resume)


def _run_local(config: TrainConfig, run_dir: Path, resume: Path | None) -> int:
    from pdlsim.train.comm import LocalComm
    from pdlsim.train.device import cpu_device, gpu_device

    set_threads(config.threads)
    device = gpu_device() if config.device == "gpu" else cpu_device()
    print(_banner(config, run_dir))
    try:
        result = _train(config, LocalComm(), device, run_dir, resume=resume)
    except KeyboardInterrupt:
        print(
            f"pdlsim: interrupted{_left_behind(run_dir)}",
            file=sys.stderr,
        )
        return 130
    except Stopped as stopped:  # SIGTERM or SIGHUP (pdlsim.cli.main)
        print(
            f"pdlsim: stopped by {stopped}{_left_behind(run_dir)}",
            file=sys.stderr,
        )
        return 128 + stopped.signum
    finish_run(result)
    return 0


def _run_as_rank(args: argparse.Namespace) -> int:
    """One rank of an MPI job, started by our launcher or by the user's mpiexec/srun."""
    from pdlsim.train.comm import MPIComm
    from pdlsim.train.device import cpu_device, gpu_device

    comm = MPIComm()
    run_dir: Path | None = None
    try:
        if args.procs is not None and args.procs != comm.size:
            raise UserError(
                f"--procs {args.procs} but this MPI job has {comm.size} ranks; "
                "drop --procs or make them agree"
            )
        config = config_from_args(args, procs=comm.size)
        resume = None
        if comm.rank == 0:
            run_dir = args.out or default_run_dir(config)
            resume = resume_checkpoint(args.out, config) if args.resume else None
            if resume is None:
                check_run_dir(run_dir)
        run_dir, resume = comm.mpi_comm.bcast((run_dir, resume))
        set_threads(config.threads)
        device = gpu_device(comm.local_rank()) if config.device == "gpu" else cpu_device()
        if comm.rank == 0:
            print(_banner(config, run_dir), flush=True)
        result = _train(
            config, comm, device, run_dir, log=lambda line: print(line, flush=True), resume=resume
        )
    except UserError as exc:
        print(f"pdlsim: error: rank {comm.rank}: {exc}", file=sys.stderr, flush=True)
        comm.abort(2)
        return 2
    except KeyboardInterrupt:  # the launcher that started this rank says so itself
        if comm.rank == 0 and not os.environ.get(SUPERVISED_ENV):
            print(f"pdlsim: interrupted{_left_behind(run_dir)}", file=sys.stderr)
        return 130
    if comm.rank == 0:
        finish_run(result)
    return 0


def _banner(config: TrainConfig, run_dir: Path) -> str:
    lr = f"lr {config.effective_lr:g}" + (
        f" (scaled x{config.procs})" if config.scale_lr else " (not scaled)"
    )
    what = "inference (forward only)" if config.inference else "training"
    if config.parallel == "model":
        return (
            f"pdlsim train: {config.model}, model parallel {what}: dense layers split over "
            f"{config.procs} rank(s) x {config.threads} thread(s), {config.device}; every rank "
            f"computes the same batch of {config.batch_per_rank} = global batch "
            f"{config.global_batch}, {lr}, {_update(config)}, data {config.data}; "
            f"records in {run_dir}"
        )
    if config.inference:
        lr = what
    return (
        f"pdlsim train: {config.model}, mode {config.mode} ({config.procs} rank(s) x "
        f"{config.threads} thread(s), {config.device}), batch {config.batch_per_rank} per rank = "
        f"global batch {config.global_batch}, {lr}, {_update(config)}, "
        f"data {config.data}; records in {run_dir}"
    )
