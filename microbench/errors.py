"""The one exception type users see, in every package.

A ``UserError`` carries a single line that says what was wrong and how to fix it; each command
line (``pdlsim``, ``python -m microbench``) prints it and exits with status 2, never a
traceback. It lives in microbench, the package every other one may import.
"""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""

    exit_status = 2
