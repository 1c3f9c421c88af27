"""A setting the configuration would ignore is refused in one line, whichever way it comes:
a flag, a ``sweep --vary`` value or a Python API argument (they all pass the config check,
:func:`pdlsim.prediction.checks.check_applicable`); inter-node settings where there is one
node change nothing and are said to, on stderr; integers are read by ``int()``, so a digit
``int()`` cannot read is a usage error naming it, not argparse's "invalid ... value"."""

from __future__ import annotations

import pytest

import pdlsim
from microbench.errors import UserError
from pdlsim.cli.main import main

QUICK = ["--samples", "2", "--iterations", "2"]


def _refused(capsys, argv: list[str]) -> str:
    try:
        status = main(argv)
    except SystemExit as usage:  # argparse's own errors
        status = usage.code
    assert status == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["predict", "--nodes", "2", "--gpu-watts", "70,700"],
         "--gpu-watts describes GPU ranks, and this configuration has none"),
        (["predict", "--nodes", "2", "--balance", "proportional"],
         "--balance proportional splits the batch by rank speed, and every rank runs at one"),
        (["sweep", "--nodes", "2", "--vary", "prefetch=on,off", "--out", "unused"],
         "--vary prefetch=on: --prefetch describes GPU ranks"),
        (["sweep", "--nodes", "2", "--parallel", "model", "--vary", "overlap=on,off", "--out",
          "unused"], "--vary overlap=off: --no-overlap is for data-parallel training"),
        (["sweep", "--nodes", "2", "--vary", "balance=static,proportional", "--out", "unused"],
         "--vary balance=proportional: --balance proportional splits the batch"),
        (["sweep", "--nodes", "2", "--vary", "nodes=\u00b2", "--out", "unused"],
         "nodes=\u00b2: expected a positive integer, got '\u00b2'"),
        (["predict", "--nodes", "2", "--cpu-sockets", "\u00b2x4"],
         "expected SOCKETSxCORES per node, e.g. 2x40"),
    ],
)  # fmt: skip
def test_an_ignored_setting_is_refused_before_the_first_prediction(
    capsys, no_simulation, tmp_path, monkeypatch, argv, message
):
    monkeypatch.chdir(tmp_path)
    assert message in _refused(capsys, argv)
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpu_preset": "v100"}, "--gpu-preset describes GPU ranks"),
        ({"prefetch": True}, "--prefetch describes GPU ranks"),
        ({"pinned": False}, "--pageable describes GPU ranks"),
        ({"gpu_watts": (70, 700)}, "--gpu-watts describes GPU ranks"),
        ({"parallel": "model", "overlap": False}, "--no-overlap is for data-parallel training"),
        ({"inference": True, "overlap": False}, "--no-overlap is for data-parallel training"),
        ({"balance": "proportional"}, "every rank runs at one speed"),
    ],
)
def test_the_api_refuses_what_the_flags_refuse(no_simulation, options, message):
    with pytest.raises(UserError, match=message):
        pdlsim.predict("mlp", pdlsim.Cluster.cpus(2), **options)
    with pytest.raises(UserError, match=message):
        pdlsim.sweep("mlp", nodes=[2], **options)


def test_the_api_keeps_what_a_setting_does_use(no_simulation):
    """A slow rank makes a proportional balance meaningful; GPU ranks take GPU settings: the
    check lets them through (to the simulation, stubbed out here)."""
    with pytest.raises(AssertionError, match="simulated"):
        pdlsim.predict("mlp", pdlsim.Cluster.cpus(2), balance="proportional", slow_ranks=1,
                       slow_factor=2.0)  # fmt: skip
    with pytest.raises(AssertionError, match="simulated"):
        pdlsim.predict("mlp", pdlsim.Cluster.gpus(1, 2), prefetch=True, gpu_watts=(70, 700))


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--nodes", "1", "--network", "eth-10g", *QUICK],
        ["predict", "--nodes", "1", "--procs-per-node", "2", "--network-scale", "0.1", *QUICK],
        ["collective", "allreduce", "--nodes", "1", "--network", "eth-10g", "--size", "1M"],
    ],
)
def test_a_network_on_one_node_is_said_to_change_nothing(capsys, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert "describes the network between nodes, and one node has none: it changes nothing" in err
    assert out  # the answer still comes: a scaling study's first node count


def test_a_sweep_that_reaches_two_nodes_uses_its_network_silently(capsys, tmp_path):
    argv = ["sweep", "--nodes", "1,2", "--network", "eth-10g", *QUICK, "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_api_warns_of_a_network_on_one_node():
    with pytest.warns(UserWarning, match="--network describes the network between nodes"):
        pdlsim.predict("mlp", pdlsim.Cluster.cpus(1), network="eth-10g", samples=2,
                       iterations=2)  # fmt: skip
