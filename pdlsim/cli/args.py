"""Argument types of the ``pdlsim`` command line: each turns one string into a value or
an ``argparse.ArgumentTypeError`` that argparse prints as a one-line usage error.

Lists are checked whole here, when the flags are parsed: an empty item or a repeated one
(``1,,2``, ``cnn,cnn``) is refused before any work, not found by a stage minutes later."""

from __future__ import annotations

import argparse

from microbench.errors import digits_past_int


def _int_at_least(text: str, least: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        digits = digits_past_int(text)
        if digits is not None:
            raise argparse.ArgumentTypeError(
                f"expected {expected}, got one of {digits:,} digits"
            ) from None
        raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def seed(text: str) -> int:
    """A random seed: numpy's generators take integers >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): positive, ascending, no repeats."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers like 1,2,4, got '{text}'"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every value must be at least 1, got '{text}'")
    if list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"list values in ascending order, once each: '{text}'")
    return values


def name_list(text: str) -> str:
    """'mlp, cnn' -> 'mlp,cnn': comma-separated names (workloads, presets), none empty, each
    once; the spaces around them dropped. Kept as text: the commands split it themselves."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated names like mlp,cnn, with none empty, got '{text}'"
        )
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"'{twice}' is listed twice in '{text}'; list it once")
    return ",".join(names)


def choice_list(choices: tuple[str, ...]):
    """A type for 'a,b': comma-separated names from ``choices``, each once, as a tuple."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name_list(text).split(","))
        unknown = next((name for name in names if name not in choices), None)
        if unknown is not None:
            raise argparse.ArgumentTypeError(f"'{unknown}' is not one of {', '.join(choices)}")
        return names

    return parse
