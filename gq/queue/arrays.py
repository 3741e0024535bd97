"""Job array specs (sbatch --array): ``0-99%8``, ``1,3,5``, ``0-20:5``; folding task ids
back into squeue's ``[5-99%8]`` spelling; and the job ids people type, ``17`` or ``17_3``
(pure: the client checks them before asking, the daemon again before acting)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gq.errors import UserError

MAX_TASK_ID = 4_000_000  # Slurm's largest MaxArraySize is 4000001: ids up to one less
_PART = re.compile(r"^(\d{1,10})(?:-(\d{1,10})(?::(\d{1,10}))?)?$")


@dataclass(frozen=True)
class ArraySpec:
    ranges: tuple[range, ...]
    max_running: int | None

    @property
    def size(self) -> int:
        """How many tasks the spec names at most (overlapping parts count twice): known
        without listing them, so a limit is checked before anything is expanded."""
        return sum(len(part) for part in self.ranges)

    def tasks(self) -> tuple[int, ...]:
        return tuple(sorted(set().union(*self.ranges)))


def parse(text: str) -> ArraySpec:
    spec, _, limit = text.strip().partition("%")
    max_running = None
    if limit:
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_TASK_ID:
            raise UserError(
                f"invalid --array {text!r}: the %limit must be a number from 1 to {MAX_TASK_ID}"
            )
        max_running = int(limit)
    ranges = []
    for part in spec.split(","):
        match = _PART.match(part.strip())
        if not match:
            raise UserError(
                f"invalid --array {text!r}: use ranges, lists and steps such as "
                "0-99%8, 1,3,5 or 0-20:5"
            )
        first, last, step = match.groups()
        last = first if last is None else last
        if int(last) < int(first) or (step is not None and int(step) < 1):
            raise UserError(f"invalid --array {text!r}: {part!r} is an empty range")
        if int(last) > MAX_TASK_ID:
            raise UserError(f"invalid --array {text!r}: task ids go from 0 to {MAX_TASK_ID}")
        ranges.append(range(int(first), int(last) + 1, int(step or 1)))
    return ArraySpec(tuple(ranges), max_running)


def fold(tasks: list[int], max_running: int | None = None) -> str:
    """``[0-3,7,9-10%2]`` from task ids."""
    return bracketed(ranges(tasks), max_running)


def bracketed(task_ranges: str, max_running: int | None = None) -> str:
    """``[0-3,7,9-10%2]`` from ``0-3,7,9-10`` (:func:`ranges`) and the array's limit."""
    limit = f"%{max_running}" if max_running else ""
    return f"[{task_ranges}{limit}]"


def ranges(tasks: list[int]) -> str:
    """``0-3,7,9-10`` from task ids: runs of consecutive ids as first-last."""
    ordered = sorted(set(tasks))
    runs = []
    start = previous = ordered[0]
    for task in ordered[1:] + [None]:
        if task is not None and task == previous + 1:
            previous = task
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if task is not None:
            start = previous = task
    return ",".join(runs)


_LABEL = re.compile(r"^(\d{1,19})(?:_(\d{1,10}))?$")
_MAX_ID = (1 << 63) - 1


def parse_label(text: str) -> str:
    """A job id as typed: ``17`` (a job, or a whole array), ``17_3`` (task 3 of array 17)."""
    match = _LABEL.match(text)
    if not match or int(match.group(1)) > _MAX_ID or int(match.group(2) or 0) > MAX_TASK_ID:
        raise UserError(
            f"invalid job id {text[:40]!r}: expected a number such as 17, or 17_3 "
            "for task 3 of array 17"
        )
    return text
