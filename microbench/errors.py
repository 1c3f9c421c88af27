"""The one exception type users see, in every package.

A ``UserError`` carries a single line that says what was wrong and how to fix it; each command
line (``pdlsim``, ``python -m microbench``) prints it and exits with status 2, never a
traceback. It lives in microbench, the package every other one may import; so do the helpers
that keep the values such a line quotes short.
"""

import re
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2. A number in the line
    longer than :data:`SHOWN_MOST` characters is cut short (:func:`clip_long_numbers`), and
    an unprintable character a quoted value brought in (a name holding a newline) is spelled
    as its escape (:func:`printable`): a script reading the message of the Python API gets
    the one line the command line prints."""

    exit_status = 2

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (printable(clip_long_numbers(args[0])),)
        super().__init__(*args)


# How much of a value a message quotes: a value longer than SHOWN_MOST characters (a number
# of 400 digits, a name pasted 50 times, a list of thousands) is cut to its first SHOWN_KEEP
# and '...', so the one line stays readable and still says which value it was.
SHOWN_MOST = 40
SHOWN_KEEP = 20
_DIGITS_TOO_MANY_TO_PRINT = 4000  # Python refuses str() of an int past 4,300 digits


def shown_text(text: str) -> str:
    """``text`` (a value as a message spells it) cut to its first characters and '...' when
    it is longer than :data:`SHOWN_MOST`."""
    return text if len(text) <= SHOWN_MOST else f"{text[:SHOWN_KEEP]}..."


def printable(text: str) -> str:
    """``text`` with each unprintable character spelled as its escape (``\\n``, ``\\x1b``),
    so that a message holding it stays one line and sends no terminal escape."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def unprintable(text: str) -> str | None:
    """Why ``text`` cannot be printed in a report or a one-line error (it holds a newline, a
    terminal escape, a bidi override), naming it and its first such character; None where it
    can."""
    if text.isprintable():
        return None
    bad = next(c for c in text if not c.isprintable())
    return f"{ascii(text)[:60]} holds the unprintable character {ascii(bad)}"


def shown_value(value: object) -> str:
    """``value`` as an error message quotes it: its ``repr`` ('8', True, None, [1, 2], 2.5),
    cut short by :func:`shown_text`. A whole number too long to print at all (Python refuses
    ``str`` of one past 4,300 digits) is named by its length."""
    if isinstance(value, int) and value.bit_length() > _DIGITS_TOO_MANY_TO_PRINT * 3.32:
        return f"a whole number of about {int(value.bit_length() * 0.30103):,} digits"
    try:
        text = repr(value)
    except ValueError:  # a huge int inside a list
        text = f"<a {type(value).__name__} holding a number too long to print>"
    return shown_text(text)


def digits_past_int(text: str) -> int | None:
    """How many digits ``text`` has when it is a whole number (a sign allowed) that ``int``
    refused for its length (past the 4,300 digits Python reads), else None: call it once
    ``int(text)`` has raised, to name that mistake rather than echo the number."""
    digits = text.strip().lstrip("+-")
    return len(text.strip()) if digits.isdecimal() else None


# A run of digits (with the commas, points and underscores that group them) past
# SHOWN_MOST characters: a number nobody means, echoed from the command line or a file.
_LONG_NUMBER = re.compile(rf"[0-9][0-9,._]{{{SHOWN_MOST},}}")


def clip_long_numbers(line: str) -> str:
    """``line`` with every number longer than :data:`SHOWN_MOST` characters cut as
    :func:`shown_text` cuts it: the last guard, where a message is printed, for the checks
    that quote a value as given (``--nodes 10**400`` would else fill the screen)."""
    return _LONG_NUMBER.sub(lambda m: shown_text(m.group(0)), line)


def shown_names(names: Iterable[object], most: int = 5) -> str:
    """Names a message lists (unknown keys of a file): sorted, each cut short as
    :func:`shown_text` cuts it, at most ``most`` of them and how many there are in all."""
    listed = sorted(shown_text(str(name)) for name in names)
    if len(listed) <= most:
        return ", ".join(listed)
    return f"{', '.join(listed[:most])} and {len(listed) - most:,} more"
