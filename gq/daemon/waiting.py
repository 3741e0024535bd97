"""gq wait: clients that wait for jobs to end, each on its one connection, answered when
the last of its jobs has ended (the client polls nothing; the daemon looks once per
scheduling pass, at the jobs not yet seen to end)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gq import messages
from gq.queue import queries
from gq.queue.engine import Database
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.daemon.server import Connection, Server

log = logging.getLogger("gq.daemon")


@dataclass
class Waiting:
    """What a wait handler returns when the jobs have not all ended: the server keeps the
    connection open, and :class:`Waiters` answers it later."""

    job_ids: list[int]
    unfinished: set[int] = field(default_factory=set)


def ended(session, job_ids: list[int]) -> messages.WaitOver:
    return messages.WaitOver([
        messages.EndedJob(job.label, job.state, job.exit_code)
        for job in queries.jobs(session, ids=job_ids, payloads=False)])


class Waiters:
    def __init__(self, db: Database):
        self.db = db
        self.waiting: dict[Connection, Waiting] = {}

    def add(self, connection: Connection, waiting: Waiting) -> None:
        self.waiting[connection] = waiting

    def answer_ended(self, server: Server) -> None:
        """Answer every client whose jobs have all ended; forget those that left."""
        if not self.waiting:
            return
        for connection in [c for c in self.waiting if c not in server.connections]:
            del self.waiting[connection]  # its client went away
        active = [JobState.PENDING, JobState.RUNNING]
        with self.db.read() as session:
            for connection, waiting in list(self.waiting.items()):
                waiting.unfinished = {job.id for job in queries.jobs(
                    session, ids=waiting.unfinished, states=active, payloads=False)}
                if not waiting.unfinished:
                    del self.waiting[connection]
                    server.reply(connection, messages.encode(ended(session, waiting.job_ids)))
