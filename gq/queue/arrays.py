"""Job array specs (sbatch --array): ``0-99%8``, ``1,3,5``, ``0-20:5``; folding task ids
back into squeue's ``[5-99%8]`` spelling; and the job ids people type, ``17`` or ``17_3``
(pure: the client checks them before asking, the daemon again before acting)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gq.errors import UserError

MAX_TASKS = 10_000
_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True)
class ArraySpec:
    tasks: tuple[int, ...]
    max_running: int | None


def parse(text: str) -> ArraySpec:
    spec, _, limit = text.strip().partition("%")
    max_running = None
    if limit:
        if not limit.isdigit() or int(limit) < 1:
            raise UserError(f"invalid --array {text!r}: the %limit must be a positive number")
        max_running = int(limit)
    tasks: set[int] = set()
    for part in spec.split(","):
        match = _PART.match(part.strip())
        if not match:
            raise UserError(f"invalid --array {text!r}: use ranges, lists and steps such as "
                            "0-99%8, 1,3,5 or 0-20:5")
        first, last, step = match.groups()
        last = first if last is None else last
        if int(last) < int(first) or (step is not None and int(step) < 1):
            raise UserError(f"invalid --array {text!r}: {part!r} is an empty range")
        tasks.update(range(int(first), int(last) + 1, int(step or 1)))
        if len(tasks) > MAX_TASKS:
            raise UserError(f"invalid --array {text!r}: more than {MAX_TASKS} tasks")
    return ArraySpec(tuple(sorted(tasks)), max_running)


def fold(tasks: list[int], max_running: int | None = None) -> str:
    """``[0-3,7,9-10%2]`` from task ids."""
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
    limit = f"%{max_running}" if max_running else ""
    return f"[{','.join(runs)}{limit}]"


_LABEL = re.compile(r"^\d+(_\d+)?$")


def parse_label(text: str) -> str:
    """A job id as typed: ``17`` (a job, or a whole array), ``17_3`` (task 3 of array 17)."""
    if not _LABEL.match(text):
        raise UserError(f"invalid job id {text!r}: expected a number such as 17, or 17_3 for "
                        "task 3 of array 17")
    return text
