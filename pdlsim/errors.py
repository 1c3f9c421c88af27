"""The one exception type users see.

A ``UserError`` carries a single line that says what was wrong and how to fix it; the command
line prints it and exits with status 2, never a traceback.
"""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""

    exit_status = 2
