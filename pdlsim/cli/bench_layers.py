"""``pdlsim bench --layer-times``: a workload's layers timed on a GPU with PyTorch, one file
per model, batch and precision, that ``pdlsim predict --layer-times`` prices GPU ranks from
(:mod:`microbench.layer_times`). PyTorch is optional: without it, or without a CUDA GPU for
``--device cuda``, the command says so in one line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from microbench.errors import UserError
from microbench.fileio import atomic_write_text, new_run_dir

__all__ = ["run_layer_times_command"]

_CPU_SUITE_FLAGS = ("quick", "procs", "threads")


def run_layer_times_command(args: argparse.Namespace) -> int:
    from microbench.options import given

    for dest in _CPU_SUITE_FLAGS:
        flag = given(args, dest)
        if flag:
            raise UserError(f"{flag} is for the CPU microbenchmarks; --layer-times times one "
                            f"device's layers: drop {flag}")  # fmt: skip
    if importlib.util.find_spec("torch") is None:
        raise UserError("--layer-times needs PyTorch: pip install -e '.[bench]'")
    import torch

    from microbench.layer_times import time_layers
    from microbench.machine import machine_metadata
    from microbench.workload import load_workload

    _check_device(args.device, torch)
    workloads = [load_workload(m) for m in args.model.split(",")]
    out = args.out or new_run_dir(Path("runs") / "bench")
    Path(out).mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        for batch in args.batch:
            try:
                doc = time_layers(workload, batch, args.precision, args.device, torch,
                                  optimizer=args.optimizer)  # fmt: skip
            except (torch.OutOfMemoryError, RuntimeError) as exc:  # the others are kept
                out_of_memory = isinstance(exc, torch.OutOfMemoryError)
                if not (out_of_memory or "allocate" in str(exc)):  # the CPU's allocator's
                    raise
                first = str(exc).splitlines()[0] if str(exc) else "out of memory"
                raise UserError(
                    f"{workload.name} at batch {batch} does not fit on {args.device} ({first}); "
                    f"give a smaller --batch (files so far are in {out})"
                ) from None
            doc["machine"] = machine_metadata(extra={"torch_version": torch.__version__})
            path = Path(out) / f"layer_times-{workload.name}-b{batch}-{args.precision}.json"
            atomic_write_text(path, json.dumps(doc, indent=1))
            layers_s = sum(r["forward_s"] + r["backward_s"] for r in doc["layers"])
            print(f"{workload.name} batch {batch} {args.precision} on {doc['device_name']}: "
                  f"step {doc['step_s'] * 1e3:.3f} ms (layers alone {layers_s * 1e3:.3f} ms, "
                  f"update {doc['update_s'] * 1e3:.3f} ms): {path}")  # fmt: skip
    print(f"records: {out}")
    return 0


def _check_device(device: str, torch: Any) -> None:
    """UserError unless ``device`` is ``cpu``, or ``cuda``/``cuda:N`` for a GPU PyTorch sees."""
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if match is None:
        raise UserError(f"--device {device}: expected cpu, cuda or cuda:N")
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        raise UserError(
            "--layer-times: no CUDA GPU visible to PyTorch here; run it on the GPU machine, or "
            "give --device cpu to time this machine's CPU (not what GPU ranks are priced from)"
        )
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise UserError(
            f"--device {device}: PyTorch sees {count} GPU(s), cuda:0 to cuda:{count - 1}"
        )
