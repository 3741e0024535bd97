"""Parsers and formatters for the sizes and durations users type (Slurm spellings)."""

from __future__ import annotations

import re

from gq.errors import UserError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``6G``, ``512M``, ``100K``, ``1T``; a bare number is megabytes, as in sbatch."""
    match = _SIZE.match(text)
    if not match:
        raise UserError(f"invalid size {text!r}: expected a number with K, M, G or T (e.g. 6G)")
    number, unit = match.groups()
    size = int(float(number) * _SIZE_FACTORS[unit.upper()])
    if size <= 0:
        raise UserError(f"invalid size {text!r}: must be greater than zero")
    return size


def format_size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"


_TIME_FORMS = [
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
]


def parse_duration(text: str) -> int:
    """Seconds from a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    stripped = text.strip()
    for form in _TIME_FORMS:
        match = form.match(stripped)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            seconds = (
                parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60 + parts.get("s", 0)
            )
            if seconds <= 0:
                raise UserError(f"invalid time limit {text!r}: must be greater than zero")
            return seconds
    raise UserError(
        f"invalid time limit {text!r}: use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 2:00:00)"
    )


def format_duration(seconds: float | None) -> str:
    """Slurm's elapsed-time spelling: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    if seconds is None:
        return "-"
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"
