"""argparse actions that remember which options the user gave, and refuse contradictions.

Both command lines register them (``pdlsim``'s parser and ``python -m microbench``'s
:class:`microbench.cli.Parser`), so a flag given twice means the same thing in either.

argparse keeps the last of two values silently (``--pinned --pageable``, ``--nodes 2 --nodes
4``) and cannot tell a value given from its default. The store actions here record every
option given (:func:`given`), so that commands can refuse a flag their mode would ignore, and
make a second, different value of the same setting a usage error (one line, exit 2). An option
given an empty text (``--network ''``) is one too: commands read a missing value as "take the
default" (``name or default``), so an empty one would be dropped without a word.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from .errors import SHOWN_MOST, clip_long_numbers, shown_text

__all__ = ["given", "register_once_actions", "usage_hint"]

# argparse's words for an option whose value is missing: also what it says when the value
# starts with '-' and does not look like a plain number ("-1ms", "-5GB/s"), read as a flag
_NO_VALUE = re.compile(r"argument (-[^\s/:]+)(?:/\S+)?: expected one argument$")

_GIVEN = "_options_given"  # namespace attribute: dest -> (option string, value)


# argparse's words for a value a type function could not read (it raised a ValueError of its
# own: int() of a plain number, or of one past the 4,300 digits Python reads), and the ones
# that say what to give instead
_INVALID_VALUE = re.compile(r"invalid (\w+) value: '(.*)'$")
_WANTED = {"int": "expected a whole number", "float": "expected a number"}
_HUGE_DIGITS = re.compile(r"[0-9]{4000,}")
_LONG_QUOTED = re.compile(rf"'([^']{{{SHOWN_MOST + 1},}})'")


def _invalid_value(found: re.Match[str]) -> str:
    kind, value = found.groups()
    huge = _HUGE_DIGITS.search(value)
    if huge is not None:
        return f"a number of {len(huge.group(0)):,} digits is past any count or size"
    return f"{_WANTED.get(kind, 'cannot read the value')}, got '{value}'"


def usage_hint(message: str) -> str:
    """argparse's ``message`` in words that say what to give, with values quoted from the
    command line cut short (a 5,000-digit ``--seed``), and with the way to give a value that
    starts with '-' where it reports a missing value: ``--step-time -1ms`` reads "-1ms" as
    another flag."""
    message = _INVALID_VALUE.sub(_invalid_value, message)
    message = _LONG_QUOTED.sub(lambda m: f"'{shown_text(m.group(1))}'", message)
    message = clip_long_numbers(message)
    found = _NO_VALUE.search(message)
    if found is None:
        return message
    return f"{message} (a value that starts with '-' is written {found.group(1)}=VALUE)"


def given(args: argparse.Namespace, dest: str) -> str | None:
    """The option string the user gave for ``dest`` (e.g. "--threads"), or None."""
    seen = getattr(args, _GIVEN, {})
    return seen[dest][0] if dest in seen else None


class _Once:
    """Mixin: record the option; refuse a second, different value of the same setting."""

    def _record(self, parser: argparse.ArgumentParser, namespace: Any, value: Any,
                option: str | None) -> None:  # fmt: skip
        if option is None:  # a positional argument: given by definition
            return
        if isinstance(value, str) and not value.strip():
            parser.error(f"{option} is given an empty value: give one, or drop {option}")
        seen = getattr(namespace, _GIVEN, None)
        if seen is None:
            seen = {}
            setattr(namespace, _GIVEN, seen)
        dest = self.dest  # type: ignore[attr-defined]
        if dest in seen and seen[dest][1] != value:
            first, before = seen[dest]
            if first == option:
                parser.error(f"{option} is given twice ({before}, then {value}): give it once")
            parser.error(f"{option} contradicts {first}: give one of them")
        seen[dest] = (option, value)


class _Store(_Once, argparse._StoreAction):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        self._record(parser, namespace, values, option_string)
        super().__call__(parser, namespace, values, option_string)


def _store_const(self: Any, parser: Any, namespace: Any, values: Any, option_string=None) -> None:
    self._record(parser, namespace, self.const, option_string)
    setattr(namespace, self.dest, self.const)


class _StoreConst(_Once, argparse._StoreConstAction):
    __call__ = _store_const


class _StoreTrue(_Once, argparse._StoreTrueAction):
    __call__ = _store_const


class _StoreFalse(_Once, argparse._StoreFalseAction):
    __call__ = _store_const


def register_once_actions(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s store actions (the default, store_const, store_true, store_false)
    the recording ones; argument groups share the parser's registry."""
    parser.register("action", None, _Store)
    parser.register("action", "store", _Store)
    parser.register("action", "store_const", _StoreConst)
    parser.register("action", "store_true", _StoreTrue)
    parser.register("action", "store_false", _StoreFalse)
