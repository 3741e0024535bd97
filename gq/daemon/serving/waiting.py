"""gq wait: clients that wait for jobs to end, each on its one connection, answered when
the last of its jobs has ended. The client polls nothing; the daemon reads, once per
scheduling pass, the job events since the last pass that end a job, and takes those jobs
off every waiter's list: a pass costs what ended since the last, however many wait."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from gq import defaults, messages
from gq.errors import UserError
from gq.queue.engine import Database
from gq.queue.models import Job, JobEvent
from gq.queue.queries import among, chunks
from gq.queue.states import TERMINAL

if TYPE_CHECKING:
    from gq.daemon.serving.server import Connection, Server

log = logging.getLogger("gq.daemon")
_ENDED = [state.value for state in TERMINAL]


@dataclass
class Waiting:
    """What a wait handler returns when the jobs have not all ended: the server keeps the
    connection open, and :class:`Waiters` answers it later."""

    job_ids: list[int]
    unfinished: set[int] = field(default_factory=set)
    uid: int | None = None  # whose wait: what one user may wait for is bounded


def ended(session, job_ids: list[int]) -> messages.WaitOver:
    """How each job ended (a light read: a few columns, however many jobs)."""
    rows = []
    for part in chunks(sorted(job_ids)):
        rows += session.execute(
            select(Job.id, Job.array_job_id, Job.array_task_id, Job.state, Job.exit_code).where(
                among(Job.id, part)
            )
        ).all()
    return messages.WaitOver(
        [
            messages.EndedJob(str(job_id) if array is None else f"{array}_{task}", state, code)
            for job_id, array, task, state, code in rows
        ]
    )


class Waiters:
    def __init__(self, db: Database):
        self.db = db
        self.waiting: dict[Connection, Waiting] = {}
        self.last_event: int | None = None  # the last job event looked at

    def check_room(self, uid: int | None, count: int) -> None:
        """Refuse a wait that would take one user past ``defaults.MAX_WAITED`` jobs waited
        for at once, over all their connections."""
        held = sum(len(w.unfinished) for w in self.waiting.values() if w.uid == uid)
        if held + count > defaults.MAX_WAITED:
            raise UserError(
                f"uid {uid} waits for {held} jobs already; {count} more would "
                f"pass the node's limit of {defaults.MAX_WAITED}; wait for fewer"
            )

    def add(self, connection: Connection, waiting: Waiting) -> None:
        if self.last_event is None:
            with self.db.read() as session:
                self.last_event = session.scalar(select(func.max(JobEvent.id))) or 0
        self.waiting[connection] = waiting
        log.info("uid %s waits for %d job(s) to end", waiting.uid, len(waiting.unfinished))

    def answer_ended(self, server: Server) -> None:
        """Answer every client whose jobs have all ended; forget those that left."""
        if not self.waiting:
            self.last_event = None  # nobody waits: nothing to follow until someone does
            return
        for connection in [c for c in self.waiting if c not in server.connections]:
            del self.waiting[connection]  # its client went away
        with self.db.read() as session:
            rows = session.execute(
                select(JobEvent.id, JobEvent.job_id)
                .where(JobEvent.id > (self.last_event or 0), JobEvent.new_state.in_(_ENDED))
                .order_by(JobEvent.id)
            ).all()
            if rows:
                self.last_event = rows[-1][0]
            done = {job_id for _, job_id in rows}
            for connection, waiting in list(self.waiting.items()):
                waiting.unfinished -= done
                if not waiting.unfinished:
                    del self.waiting[connection]
                    server.reply(connection, messages.encode(ended(session, waiting.job_ids)))
