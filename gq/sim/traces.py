"""Job traces: the Tiresias/Salus layout and gq's own CSV (what `gq history --csv` writes)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gq.errors import UserError

TIRESIAS_COLUMNS = {"job_id", "num_gpu", "submit_time", "iterations", "duration"}
GQ_COLUMNS = ["submit_time", "duration", "steps", "priority", "user", "gpus", "mem",
              "time_limit", "deadline"]


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

    @property
    def limit(self) -> float:
        """Its time limit, or its duration where the trace gives none (a perfect estimate)."""
        return self.time_limit if self.time_limit is not None else self.startup + self.duration

    @property
    def iteration_time(self) -> float:
        return self.duration / self.iterations


def load(path: Path) -> list[TraceJob]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}") from None
    if not rows:
        raise UserError(f"trace {path} has no jobs")
    columns = set(rows[0])
    try:
        if TIRESIAS_COLUMNS <= columns:
            jobs = [_tiresias(row) for row in rows]
        elif set(GQ_COLUMNS[:3]) <= columns:
            jobs = [_gq(index, row) for index, row in enumerate(rows)]
        else:
            raise UserError(f"trace {path}: unknown columns {sorted(columns)}; expected the "
                            f"Tiresias layout ({', '.join(sorted(TIRESIAS_COLUMNS))}) or gq's "
                            f"({', '.join(GQ_COLUMNS)})")
    except (KeyError, ValueError) as exc:
        raise UserError(f"trace {path}: malformed row: {exc}") from None
    for job in jobs:
        if job.duration <= 0 or job.iterations <= 0 or job.gpus < 1 or job.submit_time < 0:
            raise UserError(f"trace {path}: job {job.id} needs positive duration, iterations "
                            "and gpus, and a submit time of 0 or more")
    return jobs


def _tiresias(row: dict[str, str]) -> TraceJob:
    return TraceJob(id=int(row["job_id"]), submit_time=float(row["submit_time"]),
                    duration=float(row["duration"]), iterations=int(row["iterations"]),
                    gpus=int(row["num_gpu"]), user=row.get("user", ""))


def _gq(index: int, row: dict[str, str]) -> TraceJob:
    mem, limit, deadline = (row.get(k) or "" for k in ("mem", "time_limit", "deadline"))
    return TraceJob(id=int(row.get("id") or index), submit_time=float(row["submit_time"]),
                    duration=float(row["duration"]), iterations=int(row["steps"] or 1),
                    gpus=max(1, int(row.get("gpus") or 1)), priority=int(row.get("priority") or 0),
                    user=row.get("user", ""), mem=int(mem) if mem else None,
                    time_limit=float(limit) if limit else None,
                    deadline=float(deadline) if deadline else None)


def write_gq_csv(jobs: list[TraceJob], path_or_handle) -> None:
    handle = open(path_or_handle, "w", newline="") if isinstance(path_or_handle, (str, Path)) \
        else path_or_handle
    writer = csv.writer(handle)
    writer.writerow(["id", *GQ_COLUMNS])
    for job in jobs:
        writer.writerow([job.id, f"{job.submit_time:.3f}", f"{job.duration:.3f}", job.iterations,
                         job.priority, job.user, job.gpus, job.mem if job.mem is not None else "",
                         job.time_limit if job.time_limit is not None else "",
                         job.deadline if job.deadline is not None else ""])
    if handle is not path_or_handle:
        handle.close()
