"""What every command shares: the queue, the job lookup, the error style."""

from __future__ import annotations

import re
from functools import cache

from gq.errors import UserError
from gq.home import Home, home
from gq.queue.engine import Database
from gq.queue.models import Job


@cache
def the_home() -> Home:
    return home()


@cache
def database() -> Database:
    return Database(the_home())


_LABEL = re.compile(r"^\d+(_\d+)?$")


def parse_label(text: str) -> str:
    if not _LABEL.match(text):
        raise UserError(f"invalid job id {text!r}: expected a number such as 17, or 17_3 for "
                        "task 3 of array 17")
    return text


def _missing(label: str) -> UserError:
    return UserError(f"no job {label} (see 'gq status --all' for the ids in the queue)")


def resolve_jobs(session, label: str) -> list[Job]:
    """The jobs a label names (a whole array for its id); an error if none."""
    from gq.queue import queries

    jobs = queries.resolve(session, parse_label(label))
    if not jobs:
        raise _missing(label)
    return jobs


def resolve_one(session, label: str) -> Job:
    """One job: ``17_3``, or ``17`` (for an array, its first task, as scontrol shows it)."""
    from gq.queue import queries

    if "_" in parse_label(label):
        return resolve_jobs(session, label)[0]
    job = queries.job(session, int(label))
    if job is None:
        raise _missing(label)
    return job
