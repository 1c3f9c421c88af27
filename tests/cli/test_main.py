"""The command line as a user meets it: help, the workload table, one-line errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdlsim.cli.main import build_parser, main
from tests.conftest import run_pdlsim


def _subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_help_lists_every_subcommand_and_each_has_its_own_help():
    result = run_pdlsim("--help", timeout=60)
    assert result.returncode == 0
    for name in _subcommands():
        assert name in result.stdout
        sub = run_pdlsim(name, "--help", timeout=60)
        assert sub.returncode == 0 and "usage: pdlsim " + name in sub.stdout


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_help_text_shows_a_doubled_percent_sign():
    """argparse formats help strings but prints descriptions as written: a "%%" meant as an
    escape shows up doubled in a description."""
    from microbench.__main__ import build_parser as microbench_parser

    for parser in _parsers(build_parser()) + _parsers(microbench_parser()):
        assert "%%" not in parser.format_help(), parser.prog


def test_every_option_of_every_command_says_what_it_does():
    """A flag with no help line leaves the user to guess (or to read the source)."""
    from microbench.__main__ import build_parser as microbench_parser

    bare = []
    for parser in _parsers(build_parser()) + _parsers(microbench_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            if not (action.help or "").strip():
                bare.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    assert not bare, f"{len(bare)} options without help: {', '.join(bare)}"


def test_python_dash_m_and_the_console_script_are_the_same_program(capsys):
    assert main(["workload", "show", "mlp", "--json"]) == 0
    in_process = capsys.readouterr().out
    assert run_pdlsim("workload", "show", "mlp", "--json", timeout=60).stdout == in_process


def test_workload_show_prints_the_layer_table():
    result = run_pdlsim("workload", "show", "cnn", timeout=60)
    assert result.returncode == 0
    assert "1,070,794 parameters" in result.stdout
    assert "1,048,832" in result.stdout  # the 4096 -> 256 dense layer
    rows = json.loads(run_pdlsim("workload", "show", "cnn", "--json", timeout=60).stdout)
    assert rows["layers"][-1]["params"] == 1_070_794
    assert [r["output_shape"] for r in rows["layers"][:3]] == [[32, 32, 32]] * 2 + [[32, 16, 16]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["workload", "show", "nope.json"], "no workload preset or file named 'nope.json'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["workload"], "the following arguments are required"),
        (["train", "--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
        (["train", "--prefetch"], "--prefetch copies mini-batches to a GPU: add --device gpu"),
        (["train", "--device", "gpu", "--prefetch"], "--prefetch needs --pinned"),
        (["calibrate", "--quick", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["predict", "--nodes", "2", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["predict", "--nodes", "2", "--dataset-samples", "0"], "expected a positive integer"),
        (
            ["predict", "--nodes", "2", "--bucket-mb", "-0"],
            "--bucket-mb: expected a finite number > 0",
        ),
        (
            ["sweep", "--nodes", "1,2", "--out", "/dev/null"],
            "is a character device; give a directory",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args, message):
    result = run_pdlsim(*args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


UNWRITABLE = Path("/proc/pdlsim-test")  # mkdir and file creation fail there, even for root


@pytest.mark.skipif(
    not Path("/proc").is_dir(), reason="needs Linux's /proc as a place that refuses writes"
)
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["predict", "--nodes", "2", "--trace", str(UNWRITABLE / "trace.json")], "--trace"),
        (["sweep", "--nodes", "1,2", "--out", str(UNWRITABLE / "sweep")], "--out"),
        (["train", "--model", "mlp", "--epochs", "1", "--out", str(UNWRITABLE / "run")], "--out"),
        (["calibrate", "--quick", "--out", str(UNWRITABLE / "profile.json")], "--out"),
        (["bench", "--quick", "--out", str(UNWRITABLE / "bench")], "--out"),
        (["validate", "--quick", "--out", str(UNWRITABLE / "validate")], "--out"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(args, flag):
    """Checked first: a calibration or a training run must not end in a traceback at its last
    write (calibrate, bench and validate would otherwise run for minutes here)."""
    result = run_pdlsim(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"pdlsim: error: {flag} {UNWRITABLE}")
    assert "cannot write in /proc" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""


def test_building_the_parser_does_not_load_numpy():
    """OpenBLAS reads its settings when numpy loads: main() must set them first."""
    code = (
        "import sys, pdlsim.cli.main; pdlsim.cli.main.build_parser(); print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
