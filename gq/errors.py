"""Errors that reach the user as one line on stderr and exit code 2 (bad input)."""


class UserError(Exception):
    """Bad input or a request that cannot be met; the message says what to do next."""

    exit_code = 2
