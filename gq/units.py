"""Parsers and formatters for the sizes and durations users type (Slurm spellings)."""

from __future__ import annotations

import math

from gq import defaults
from gq.errors import UserError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (nor re): every
if TYPE_CHECKING:  # gq status imports this module
    import re


def _match(pattern: str, text: str) -> re.Match[str] | None:
    """``re.match``, importing re on the first parse: the formatters below are on every
    ``gq status``'s path, which re would cost as much as the rest of the command (re keeps
    each pattern compiled)."""
    import re

    return re.match(pattern, text)


_SIZE = r"(?i)^\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]?)(?:i?B)?\s*$"
_SIZE_FACTORS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_MAX_SIZE = 1 << 60  # an exabyte: past it a size is a typo (and no longer fits the queue)


def parse_size(text: str) -> int:
    """Bytes from ``6G``, ``512M``, ``100K``, ``1T``; a bare number is megabytes, as in sbatch."""
    match = _match(_SIZE, text)
    if not match:
        raise UserError(
            f"invalid size {text[:40]!r}: expected a number with K, M, G or T (e.g. 6G)"
        )
    number, unit = match.groups()
    size = int(float(number) * _SIZE_FACTORS[unit.upper()])
    if size <= 0:
        raise UserError(f"invalid size {text[:40]!r}: must be greater than zero")
    if size > _MAX_SIZE:
        raise UserError(f"invalid size {text[:40]!r}: more than any machine has")
    return size


def format_size_exact(size: int) -> str:
    """A size :func:`parse_size` reads back exactly: ``8M``, ``1536K``, ``100B``."""
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


def format_size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"


_TIME_FORMS = [
    r"^(?P<m>\d{1,12})$",
    r"^(?P<m>\d{1,12}):(?P<s>\d{1,12})$",
    r"^(?P<h>\d{1,12}):(?P<m>\d{1,12}):(?P<s>\d{1,12})$",
    r"^(?P<d>\d{1,12})-(?P<h>\d{1,12})$",
    r"^(?P<d>\d{1,12})-(?P<h>\d{1,12}):(?P<m>\d{1,12})$",
    r"^(?P<d>\d{1,12})-(?P<h>\d{1,12}):(?P<m>\d{1,12}):(?P<s>\d{1,12})$",
]


def parse_duration(text: str) -> int:
    """Seconds from a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    stripped = text.strip()
    for form in _TIME_FORMS:
        match = _match(form, stripped)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            seconds = (
                parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60
                + parts.get("s", 0)
            )
            if seconds <= 0:
                raise UserError(f"invalid time limit {text[:40]!r}: must be greater than zero")
            if seconds > defaults.MAX_TIME_LIMIT:
                raise UserError(
                    f"invalid time limit {text[:40]!r}: over "
                    f"{defaults.MAX_TIME_LIMIT // (365 * 86400)} years; leave -t "
                    "out for no limit"
                )
            return seconds
    raise UserError(
        f"invalid time limit {text[:40]!r}: use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 2:00:00)"
    )


def format_duration(seconds: float | None, padded: bool = False) -> str:
    """Slurm's elapsed-time spelling: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS`` (squeue's);
    ``padded``: always with two-digit hours, ``HH:MM:SS`` (scontrol's)."""
    if seconds is None:
        return "-"
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if padded:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


_RELATIVE = r"^now(?:\+(?P<n>\d{1,30})(?P<unit>[a-z]*))?$"
_UNITS = {
    "": 1,
    "ms": 0.001,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
_ABSOLUTE = r"^(?P<date>\d{4}-\d{2}-\d{2})(?:T(?P<time>\d{1,2}:\d{2}(?::\d{2})?))?$"
_CLOCK = r"^(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?$"


def parse_when(text: str, now: float, flag: str = "--deadline") -> float:
    """Seconds since the epoch from sbatch's --deadline spellings: ``YYYY-MM-DD[THH:MM[:SS]]``,
    ``HH:MM[:SS]`` (the next such time), ``now+N[units]`` (seconds, minutes, hours, days,
    weeks), ``today``, ``tomorrow``, ``midnight``, ``noon``, ``teatime`` (16:00). Local time.
    Also sbatch's --begin (``flag`` names the option in errors)."""
    from datetime import datetime, timedelta

    stripped = text.strip().lower()
    current = datetime.fromtimestamp(now)
    today = current.replace(hour=0, minute=0, second=0, microsecond=0)
    named = {
        "today": today,
        "midnight": today + timedelta(days=1),
        "tomorrow": today + timedelta(days=1),
        "noon": today.replace(hour=12),
        "teatime": today.replace(hour=16),
    }
    when = None
    if stripped in named:
        when = named[stripped]
        if stripped in ("noon", "teatime") and when <= current:
            when += timedelta(days=1)
    elif match := _match(_RELATIVE, stripped):
        unit = _UNITS.get(match.group("unit") or "")
        if unit is not None:
            return _in_range(text, now + int(match.group("n") or 0) * unit, flag)
    elif match := _match(_ABSOLUTE, text.strip()):
        try:
            when = datetime.fromisoformat(
                match.group("date") + "T" + (match.group("time") or "00:00")
            )
        except ValueError:
            when = None
    elif match := _match(_CLOCK, stripped):
        hour, minute, second = (int(match.group(k) or 0) for k in ("h", "m", "s"))
        if hour < 24 and minute < 60 and second < 60:
            when = today.replace(hour=hour, minute=minute, second=second)
            if when <= current:
                when += timedelta(days=1)
    if when is None:
        raise UserError(
            f"invalid {flag} {text[:40]!r}: use YYYY-MM-DD[THH:MM[:SS]], "
            "HH:MM[:SS], now+N[minutes|hours|days], today, tomorrow, midnight or "
            "noon"
        )
    try:
        timestamp = when.timestamp()
    except (ValueError, OverflowError, OSError):  # year 1 in a zone east of UTC, say
        timestamp = -1.0
    return _in_range(text, timestamp, flag)


def _in_range(text: str, timestamp: float, flag: str) -> float:
    if not 0 <= timestamp <= defaults.MAX_TIMESTAMP:
        raise UserError(f"invalid {flag} {text[:40]!r}: give a time between 1970 and the year 9999")
    return timestamp


def parse_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``:PORT`` is every address, ``[::1]:PORT`` IPv6)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"invalid --metrics {text!r}: use ADDR:PORT, such as 127.0.0.1:9400 or :9400"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


_PERIOD = r"^(?P<n>\d{1,9}(?:\.\d{1,6})?)\s*(?P<unit>[a-z]*)$"


def parse_period(text: str) -> float:
    """Seconds from a retention period: ``30days``, ``12hours``, ``90min``, ``2weeks`` (a
    bare number is days), or ``never`` (no end: infinity)."""
    stripped = text.strip().lower()
    if stripped in ("never", "unlimited", "infinite"):
        return math.inf
    match = _match(_PERIOD, stripped)
    unit = _UNITS.get(match.group("unit") or "d" if match else "")
    if match is None or unit is None or float(match.group("n")) <= 0:
        raise UserError(
            f"invalid period {text[:40]!r}: use N followed by seconds, minutes, "
            "hours, days or weeks (e.g. 30days), or 'never'"
        )
    return float(match.group("n")) * unit


def parse_seconds(text: str, flag: str) -> float:
    """A short wait: seconds (a bare number, 2.5 too) or 30s, 5min, 2hours."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = parse_period(text) if text.strip().lower() != "never" else -1.0
        except UserError:
            value = -1.0
    if not 0 <= value <= defaults.MAX_TIME_LIMIT:
        raise UserError(f"invalid {flag} {text[:40]}: give a time such as 30, 30s or 5min")
    return value


def parse_hold(text: str) -> float:
    """A bounded hold's length (--max-hold): seconds, 2.5 too, or 500ms, 2s, 1min, within
    the bounds gq allows."""
    try:
        value = parse_seconds(text, "--max-hold")
    except UserError:
        value = math.nan
    if not defaults.MIN_MAX_HOLD <= value <= defaults.MAX_MAX_HOLD:
        raise UserError(
            f"invalid --max-hold {text[:40]!r}: give a time from "
            f"{format_seconds(defaults.MIN_MAX_HOLD)} to {format_seconds(defaults.MAX_MAX_HOLD)}"
            " (500ms, 2s, 1min)"
        )
    return value


def format_seconds(seconds: float) -> str:
    """A short time as a person writes it, what :func:`parse_hold` reads back: ``500ms``,
    ``2s``, ``1.5s``, ``10min``, ``24h``."""
    if seconds < 1:
        return f"{seconds * 1000:.4g}ms"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def format_period(seconds: float) -> str:
    """``30days``, ``12hours``, ``90s``, ``never``: what :func:`parse_period` reads back, as
    one word, for command lines (a daemon's options, started again by ``gq daemon restart``)."""
    if math.isinf(seconds):
        return "never"
    count, unit = _largest_whole_unit(seconds)
    return f"{count}{'s' if unit.startswith('second') else unit}"


def describe_period(seconds: float) -> str:
    """A period as people write it: ``30 days``, ``1 hour``, ``90 seconds``, ``for ever``
    (for messages; :func:`parse_period` reads it back too)."""
    if math.isinf(seconds):
        return "for ever"
    count, unit = _largest_whole_unit(seconds)
    return f"{count} {unit}"


def _largest_whole_unit(seconds: float) -> tuple[str, str]:
    """The period in the largest unit it is a whole number of: ``("30", "days")``,
    ``("1", "hour")``, ``("1.5", "seconds")``."""
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return str(count), name if count == 1 else name + "s"
    return f"{seconds:.6g}", "second" if seconds == 1 else "seconds"
