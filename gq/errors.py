"""Every exception gq raises on purpose (as rq keeps ``rq/exceptions.py``).

Exit codes of the CLI: 0 done; 1 the daemon could not be reached or failed; 2 a refused
request (bad input, no permission, a job in the wrong state), with nothing changed.
"""


class UserError(Exception):
    """Bad input or a request that cannot be met; the message says what to do next."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class MissingExtra(UserError):
    """A command needs an optional part of gq that is not installed."""

    def __init__(self, what: str, extra: str):
        super().__init__(f"{what} needs gq's '{extra}' extra: pip install 'gq[{extra}]'")


class WaitTimedOut(UserError):
    """gq wait --timeout passed before the jobs ended (exit status 124, as timeout(1))."""

    exit_code = 124


class UnsafeStateDirectory(UserError):
    """The system daemon's state directory, or one above it, is another user's to change."""


class StateDirectoryTooDeep(UnsafeStateDirectory):
    """The state directory's path leaves no room for its sockets' names (a unix socket's
    path is at most 107 bytes)."""


class Refused(UserError):
    """The caller may not do this (not the job's owner, not an operator)."""


class AlreadyRunning(Exception):
    """Another daemon holds this state directory."""

    def __init__(self, pid: int | None):
        super().__init__(f"gq daemon is already running (pid {pid})")
        self.pid = pid


class LaunchError(Exception):
    """An execution host could not start a job's process (its reason goes to the job)."""
