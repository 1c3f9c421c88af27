"""The Python API (:mod:`pdlsim.api`), probed with settings the configuration would ignore and
with nonsense: each is a one-line :class:`~microbench.errors.UserError` (an
``ArgumentTypeError`` for a wrong type) before anything is simulated, never an exception from
the internals.

Found by a fault probe, before its fix: ``pdlsim.sweep(..., gpus=True, threads=4)`` priced the
GPU ranks and dropped ``threads`` silently, where ``pdlsim sweep --gpus 4 --threads 4`` refuses
the flag.
"""

from __future__ import annotations

import math

import pytest

from microbench.argtypes import ArgumentTypeError
from microbench.errors import UserError
from pdlsim import api


@pytest.mark.usefixtures("no_simulation")
def test_threads_on_gpu_ranks_are_refused_as_the_command_line_refuses_them():
    with pytest.raises(UserError, match="threads=4 is for CPU ranks") as info:
        api.sweep("mlp", nodes=[1, 2], per_node=[4], gpus=True, threads=4, samples=2)
    assert "\n" not in str(info.value) and "drop threads" in str(info.value)


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: api.sweep("mlp", nodes=[]), ArgumentTypeError, "nodes must be a non-empty"),
        (lambda: api.sweep("mlp", nodes=[0, 1]), UserError, "positive integers, got 0"),
        (lambda: api.sweep("mlp", batches=[32, 32]), UserError, "batches lists 32 twice"),
        (lambda: api.sweep("mlp", per_node=[math.nan]), ArgumentTypeError, r"per_node\[0\]"),
        (lambda: api.sweep("mlp", threads=0), UserError, "at least 1 thread"),
        (lambda: api.sweep("mlp", batch=32), ArgumentTypeError, "unknown option"),
        (lambda: api.predict("mlp", batch=math.inf), ArgumentTypeError, "batch must be"),
        (lambda: api.predict("mlp", bucket_mb=math.nan), UserError, "--bucket-mb must be"),
        (lambda: api.predict("mlp", samples=0), UserError, "--samples must be positive"),
        (lambda: api.predict("mlp", profile={}), ArgumentTypeError, "profile must be"),
        (lambda: api.predict("mlp", api.Cluster.cpus(2), network_scale=0), UserError,
         "--network-scale must be"),
        (lambda: api.predict({"name": "x", "input_shape": [4], "layers": [{"kind": "lstm"}]}),
         UserError, "unknown kind 'lstm'"),
        (lambda: api.collective("allreduce", []), ArgumentTypeError, "sizes must be"),
        (lambda: api.collective("allreduce", 0), UserError, "at least 1 byte"),
        (lambda: api.collective("alltoall"), UserError, "unknown collective 'alltoall'"),
        (lambda: api.load_profile(None), ArgumentTypeError, "profile must be"),
        (lambda: api.Workload.load(5), UserError, "a workload is a preset name"),
    ],
)  # fmt: skip
def test_nonsense_is_one_line_of_a_documented_type(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)


def test_the_module_docstring_calls_the_public_names():
    """Its example called pdlsim.prediction.core and pdlsim.cli.sweep, which are modules."""
    assert "pdlsim.predict(cnn" in api.__doc__ and "pdlsim.sweep(" in api.__doc__
    assert "pdlsim.prediction.core(" not in api.__doc__
