"""squeue's --format and --sort for gq status (pure): ``%i %j %u %t %M %R``, with
``%.18i`` (right-aligned, 18 wide) and ``%-10j`` (left-aligned), and sort keys such as
``-p,i`` (priority down, then id)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from gq.cli import render
from gq.errors import UserError
from gq.messages import JobInfo

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

# code -> (header, the value for a job, as squeue names them)
FIELDS: dict[str, tuple[str, Callable[[JobInfo, str, str], object]]] = {
    "i": ("JOBID", lambda job, label, reason: label),
    "A": ("JOBID", lambda job, label, reason: job.id),
    "j": ("NAME", lambda job, label, reason: job.name),
    "u": ("USER", lambda job, label, reason: job.user),
    "t": ("ST", lambda job, label, reason: render.state_label(job)),
    "T": ("STATE", lambda job, label, reason: job.state),
    "M": ("TIME", lambda job, label, reason: render.duration(render.elapsed(job, time.time()))),
    "l": (
        "TIME_LIMIT",
        lambda job, label, reason: (
            render.duration(job.time_limit) if job.time_limit else "UNLIMITED"
        ),
    ),
    "R": ("REASON", lambda job, label, reason: reason),
    "N": ("DEVICE", lambda job, label, reason: job.device or ""),
    "p": ("PRIORITY", lambda job, label, reason: job.priority),
    "Q": ("PRIORITY", lambda job, label, reason: job.priority),
    "V": ("SUBMIT_TIME", lambda job, label, reason: render.short_time(job.submit_time)),
    "S": ("START_TIME", lambda job, label, reason: render.short_time(job.start_time)),
    "e": ("END_TIME", lambda job, label, reason: render.short_time(job.end_time)),
    "b": ("TRES_PER_NODE", lambda job, label, reason: f"gpu:{job.gpus}" if job.gpus else "N/A"),
    "C": ("CPUS", lambda job, label, reason: job.cpus or 1),
    "m": (
        "MIN_MEMORY",
        lambda job, label, reason: render.size(job.host_mem) if job.host_mem else "0",
    ),
    "P": ("PARTITION", lambda job, label, reason: "gq"),
    "D": ("NODES", lambda job, label, reason: 1),
    "L": ("LANE", lambda job, label, reason: render.lane_state(job)),
    "g": ("PROGRESS", lambda job, label, reason: render.progress(job)),
}
_CODE = re.compile(r"%([.-])?(\d{1,3})?([A-Za-z%])")
# sort key -> the value jobs are ordered by
SORT_KEYS: dict[str, Callable[[JobInfo], SupportsRichComparison]] = {
    "i": lambda job: job.id,
    "j": lambda job: job.name,
    "u": lambda job: job.user,
    "t": lambda job: job.state,
    "T": lambda job: job.state,
    "p": lambda job: job.priority,
    "V": lambda job: job.submit_time,
    "S": lambda job: job.start_time or 0.0,
    "e": lambda job: job.end_time or 0.0,
    "M": lambda job: render.elapsed(job) or 0.0,
    "l": lambda job: job.time_limit or 0,
    "N": lambda job: job.device or "",
}


def table(spec: str, rows: list[tuple[str, JobInfo, str]]) -> str:
    """The rows as ``spec`` lays them out, under a header line, as squeue -o does."""
    parts = _parse(spec)
    lines = [_line(parts, lambda code: FIELDS[code][0])]
    for label, job, reason in rows:
        lines.append(_line(parts, partial(_value, job, label, reason)))
    return "\n".join(render.printable(line.rstrip()) for line in lines)


def _value(job: JobInfo, label: str, reason: str, code: str) -> object:
    return FIELDS[code][1](job, label, reason)


def _parse(spec: str) -> list[str | tuple[bool, int | None, str]]:
    parts: list[str | tuple[bool, int | None, str]] = []
    position = 0
    for match in _CODE.finditer(spec):
        parts.append(spec[position : match.start()])
        align, width, code = match.groups()
        right = align == "."
        if code == "%":
            parts.append("%")
        elif code not in FIELDS:
            raise UserError(
                f"invalid --format field %{code}: use {' '.join('%' + c for c in FIELDS)}"
            )
        else:
            parts.append((bool(right), int(width) if width else None, code))
        position = match.end()
    parts.append(spec[position:])
    if not any(isinstance(part, tuple) for part in parts):
        raise UserError(f"invalid --format {spec[:40]!r}: give fields such as '%i %j %t %R'")
    return parts


def _line(parts, value: Callable[[str], object]) -> str:
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        right, width, code = part
        text = str(value(code))
        if width is not None:
            text = text[:width].rjust(width) if right else text[:width].ljust(width)
        out.append(text)
    return "".join(out)


def sort(spec: str, jobs: list[JobInfo]) -> list[JobInfo]:
    """squeue's --sort: keys by code, ``-`` before one for descending, the first key first."""
    ordered = list(jobs)
    keys = [key.strip() for key in spec.split(",") if key.strip()]
    if not keys:
        raise UserError("invalid --sort '': give keys such as -p,i")
    for key in reversed(keys):  # stable sorts, the last key first
        descending = key.startswith("-")
        code = key.lstrip("+-")
        if code not in SORT_KEYS:
            raise UserError(
                f"invalid --sort key {key!r}: use {', '.join(SORT_KEYS)} (a "
                "leading - for descending)"
            )
        ordered.sort(key=SORT_KEYS[code], reverse=descending)
    return ordered
