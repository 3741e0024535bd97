"""What a job submission may carry, checked the same way by the client (for a clear error
before anything is sent) and by the daemon (which trusts no client). Pure; each check
raises UserError naming the value and the limit."""

from __future__ import annotations

from gq import defaults, jsonline
from gq.errors import UserError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: every gq submit
if TYPE_CHECKING:  # imports this module
    from collections.abc import Mapping, Sequence

INT64_MAX = (1 << 63) - 1  # the widest integer the wire and the queue carry


def printable(value: object) -> str:
    """Text as it may reach a log, a job's reason or someone's terminal: control characters
    (NUL, escape sequences, newlines) shown escaped, so that nothing a user chose can forge
    a line or draw on another's screen."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def text(value: str, what: str, limit: int = defaults.MAX_TEXT) -> str:
    """Text that every process and the queue can carry: UTF-8, no NUL, at most ``limit``
    characters."""
    if "\0" in value:
        raise UserError(f"{what} holds a NUL character")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(
                f"{what} is not valid UTF-8 ({value.encode('utf-8', 'replace')[:60]!r})"
            ) from None
    if len(value) > limit:
        raise UserError(f"{what} is longer than {limit} characters")
    return value


def job_name(name: str) -> str:
    """A name other users see in their tables: printable text."""
    text(name, f"job name {name[:60]!r}", defaults.MAX_NAME)
    if not name or not name.isprintable():
        raise UserError(
            f"job name {name[:60]!r} must be printable text (no control "
            "characters, tabs or newlines)"
        )
    return name


def integer(value: int, what: str, low: int, high: int) -> int:
    if not low <= value <= high:
        shown = value if abs(value) < 10**20 else f"a {len(str(abs(value)))}-digit number"
        raise UserError(f"invalid {what} {shown}: must be from {low} to {high}")
    return value


def payload(env: Mapping[str, str], args: Sequence[str]) -> None:
    """The environment and arguments a job runs with: all of it within the payload limit
    (as sent on the wire), every name and value text without NUL, names without '='."""
    size = len(jsonline.dumps(env)) + len(jsonline.dumps(list(args)))
    if size > defaults.MAX_JOB_PAYLOAD:
        raise UserError(
            f"the job's environment and arguments take {size >> 10} KiB, over "
            f"gq's limit of {defaults.MAX_JOB_PAYLOAD >> 10} KiB; unset large "
            "variables (env -u NAME gq submit ...) or pass data in files"
        )
    for key, value in env.items():
        if not key or "=" in key:
            raise UserError(f"environment variable name {key[:60]!r} is empty or holds '='")
        text(key, f"environment variable name {key[:60]!r}", defaults.MAX_NAME * 4)
        text(value, f"environment variable {key[:60]}", defaults.MAX_JOB_PAYLOAD)
    for index, arg in enumerate(args, start=1):
        text(arg, f"argument {index} ({arg[:40]!r})", defaults.MAX_JOB_PAYLOAD)


def idle_timeout(interactive: bool, given: object) -> None:
    """--idle-timeout is an interactive job's alone: a batch job has no idle time."""
    if given is not None and not interactive:
        raise UserError(
            "--idle-timeout: only an interactive job has idle time (gq run --pty, "
            "gq kernel install)"
        )
