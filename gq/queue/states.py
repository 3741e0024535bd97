"""Job states and the transitions between them (pure; `transitions.py` applies them)."""

from __future__ import annotations

from enum import Enum

from gq.queue import state_codes

# The word a running job's state history says where the daemon preempted it (Slurm's): it
# stays RUNNING, suspended, its device memory in host memory, until it is brought back.
PREEMPTED = "PREEMPTED"


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    DEADLINE = "DEADLINE"

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Accept full names and squeue's short codes, any case."""
        wanted = text.strip().upper()
        for state in cls:
            if wanted in (state.value, state.short):
                return state
        from gq.errors import UserError

        names = ", ".join(f"{s.value} ({s.short})" for s in cls)
        raise UserError(f"unknown job state {text!r}: use one of {names}")


_SHORT = {JobState(name): short for name, short in state_codes.SHORT.items()}
TERMINAL = frozenset(JobState(name) for name in state_codes.TERMINAL)
ACTIVE = frozenset(JobState(name) for name in state_codes.ACTIVE)

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.DEADLINE}),
    # RUNNING -> PENDING is a requeue (node failure of a --requeue job).
    JobState.RUNNING: frozenset(
        {
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
            JobState.DEADLINE,
            JobState.PENDING,
        }
    ),
    # A finished job leaves its end state only by an explicit requeue (same id, new run).
    JobState.COMPLETED: frozenset({JobState.PENDING}),
    JobState.FAILED: frozenset({JobState.PENDING}),
    JobState.CANCELLED: frozenset({JobState.PENDING}),
    JobState.TIMEOUT: frozenset({JobState.PENDING}),
    JobState.DEADLINE: frozenset({JobState.PENDING}),
}


def allowed(old: JobState, new: JobState) -> bool:
    return new in ALLOWED[old]
