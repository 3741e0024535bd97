"""What every command shares: the queue, the job lookup, the error style."""

from __future__ import annotations

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


def parse_job_id(text: str) -> int:
    if not text.isdigit():
        raise UserError(f"invalid job id {text!r}: expected a number such as 17")
    return int(text)


def require_job(session, job_id: int) -> Job:
    from gq.queue import queries

    job = queries.job(session, job_id)
    if job is None:
        raise UserError(f"no job {job_id} (see 'gq status --all' for the ids in the queue)")
    return job
