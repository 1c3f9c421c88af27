"""The subcommands of ``python -m microbench``, one module each.

A subcommand module has ``add_parser(subparsers) -> argparse.ArgumentParser``, which adds its
parser (and must not initialise MPI: ``--help`` and bad arguments are handled before MPI is up),
and ``run(args) -> int``, which runs it and returns the exit status. It is listed in
``microbench.__main__.COMMANDS``. Errors: raise :class:`microbench.cli.UsageError` (exit 2) or
:class:`microbench.cli.BenchmarkError` (exit 1) on every rank alike; see :mod:`microbench.cli`.
"""
