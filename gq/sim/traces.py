"""Job traces: the Tiresias/Salus layout and gq's own CSV (what `gq history --csv` writes).

Both layouts may carry the optional columns ``gap`` (seconds a job is idle after each
iteration: data loading, host-side work), ``startup`` (seconds from start to the first
iteration) and ``busy`` (the share of its device a job keeps busy while it computes alone,
more than 0 and at most 1: what it leaves for jobs side by side, :mod:`gq.sim.side`)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gq.errors import UserError

TIRESIAS_COLUMNS = {"job_id", "num_gpu", "submit_time", "iterations", "duration"}
GQ_COLUMNS = [
    "submit_time",
    "duration",
    "steps",
    "priority",
    "user",
    "gpus",
    "mem",
    "time_limit",
    "deadline",
]
OPTIONAL_COLUMNS = ["gap", "startup", "busy"]
UNSET = {"gap": 0.0, "startup": 0.0, "busy": 1.0}  # what a job without the column has


@dataclass(frozen=True)
class TraceJob:
    id: int
    submit_time: float
    duration: float  # seconds of device time with its devices to itself
    iterations: int
    gpus: int = 1
    priority: int = 0
    user: str = ""
    mem: int | None = None
    startup: float = 0.0  # seconds between start and its first iteration (process start)
    time_limit: float | None = None  # seconds, as submitted with -t
    deadline: float | None = None  # seconds from the trace's start
    gap: float = 0.0  # seconds idle after each iteration, off the device
    teardown: float = 0.0  # seconds from its last iteration's end to its exit (a forecast's)
    busy: float = 1.0  # the share of its device it keeps busy while it computes alone

    @property
    def limit(self) -> float:
        """Its time limit, or its run time alone where the trace gives none (a perfect
        estimate)."""
        if self.time_limit is not None:
            return self.time_limit
        return self.startup + self.duration + self.iterations * self.gap

    @property
    def iteration_time(self) -> float:
        return self.duration / self.iterations


def load(path: Path) -> list[TraceJob]:
    """The trace's jobs; UserError naming the file and the row for anything malformed."""
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise UserError(f"trace {path} is not a CSV file: {exc}") from None
    if not rows:
        raise UserError(f"trace {path} has no jobs")
    columns = set(rows[0])
    if TIRESIAS_COLUMNS <= columns:
        parse = _tiresias
    elif set(GQ_COLUMNS[:3]) <= columns:
        parse = _gq
    else:
        raise UserError(
            f"trace {path}: unknown columns {sorted(c for c in columns if c)}; "
            f"expected the Tiresias layout ({', '.join(sorted(TIRESIAS_COLUMNS))}) "
            f"or gq's ({', '.join(GQ_COLUMNS)}), either with "
            f"{' and '.join(OPTIONAL_COLUMNS)}"
        )
    jobs = []
    for number, row in enumerate(rows, start=1):
        where = f"trace {path}, row {number}"
        if None in row or None in row.values():
            raise UserError(
                f"{where}: {len(row) - (None in row)} columns expected, a different number found"
            )
        job = parse(number, _Fields(row, where))
        if job.duration <= 0 or job.iterations <= 0 or job.gpus < 1:
            raise UserError(f"{where}: job {job.id} needs positive duration, iterations and gpus")
        if min(job.submit_time, job.gap, job.startup) < 0:
            raise UserError(f"{where}: job {job.id} has a negative submit time, gap or startup")
        if not 0 < job.busy <= 1:
            raise UserError(
                f"{where}: job {job.id} has busy {job.busy}: the share of its device it keeps "
                "busy, more than 0 and at most 1"
            )
        jobs.append(job)
    return jobs


class _Fields:
    """One row's fields, read with the file and row in every error."""

    def __init__(self, row: dict[str, str], where: str):
        self.row, self.where = row, where

    def get(self, column: str, kind: Callable, default=None):
        text = (self.row.get(column) or "").strip()
        if not text:
            if default is not None or column not in (
                "submit_time",
                "duration",
                "job_id",
                "iterations",
                "num_gpu",
            ):
                return default
            raise UserError(f"{self.where}: no {column}")
        try:
            return kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise UserError(f"{self.where}: {column} {text!r} is not {noun}") from None


def _tiresias(number: int, row: _Fields) -> TraceJob:
    return TraceJob(
        id=row.get("job_id", int),
        submit_time=row.get("submit_time", float),
        duration=row.get("duration", float),
        iterations=row.get("iterations", int),
        gpus=row.get("num_gpu", int),
        user=row.row.get("user") or "",
        gap=row.get("gap", float, 0.0),
        startup=row.get("startup", float, 0.0),
        busy=row.get("busy", float, 1.0),
    )


def _gq(number: int, row: _Fields) -> TraceJob:
    return TraceJob(
        id=row.get("id", int, number - 1),
        submit_time=row.get("submit_time", float),
        duration=row.get("duration", float),
        iterations=row.get("steps", int, 1),
        gpus=max(1, row.get("gpus", int, 1)),
        priority=row.get("priority", int, 0),
        user=row.row.get("user") or "",
        mem=row.get("mem", int),
        time_limit=row.get("time_limit", float),
        deadline=row.get("deadline", float),
        gap=row.get("gap", float, 0.0),
        startup=row.get("startup", float, 0.0),
        busy=row.get("busy", float, 1.0),
    )


def write_gq_csv(jobs: list[TraceJob], path_or_handle) -> None:
    """gq's layout; the optional columns only where some job has them."""
    handle = (
        open(path_or_handle, "w", newline="")
        if isinstance(path_or_handle, (str, Path))
        else path_or_handle
    )
    optional = [c for c in OPTIONAL_COLUMNS if any(getattr(job, c) != UNSET[c] for job in jobs)]
    writer = csv.writer(handle)
    writer.writerow(["id", *GQ_COLUMNS, *optional])
    for job in jobs:
        writer.writerow(
            [
                job.id,
                f"{job.submit_time:.3f}",
                f"{job.duration:.3f}",
                job.iterations,
                job.priority,
                job.user,
                job.gpus,
                job.mem if job.mem is not None else "",
                job.time_limit if job.time_limit is not None else "",
                job.deadline if job.deadline is not None else "",
                *(f"{getattr(job, c):.6g}" for c in optional),
            ]
        )
    if handle is not path_or_handle:
        handle.close()
