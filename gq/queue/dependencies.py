"""Job dependencies in sbatch syntax (pure): ``afterok:3:4,afterany:5`` (all must hold) or
``afterok:3?afternotok:4`` (any may), with ``after``, ``afterany``, ``afterok`` and
``afternotok``. ``--after ID`` is the short form of ``afterok:ID``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from gq.errors import UserError
from gq.queue.states import JobState

KINDS = ("after", "afterany", "afterok", "afternotok")
_CLAUSE = re.compile(r"^(after|afterany|afterok|afternotok):(\d{1,30}(?::\d{1,30})*)$")
MAX_JOB_ID = (1 << 63) - 1


class Outcome(Enum):
    SATISFIED = "satisfied"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True)
class Clause:
    kind: str
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class Dependency:
    clauses: tuple[Clause, ...]
    any_of: bool  # '?' between clauses: one satisfied clause is enough

    def __str__(self) -> str:
        """sbatch's spelling, without the blanks a user may have typed: afterok:3:4,after:5."""
        return ("?" if self.any_of else ",").join(
            f"{c.kind}:{':'.join(map(str, c.job_ids))}" for c in self.clauses
        )

    @property
    def job_ids(self) -> set[int]:
        return {job_id for clause in self.clauses for job_id in clause.job_ids}


def parse(text: str) -> Dependency:
    stripped = text.strip()
    if "," in stripped and "?" in stripped:
        raise UserError(f"invalid dependency {text!r}: use ',' (all) or '?' (any), not both")
    any_of = "?" in stripped
    clauses = []
    for part in stripped.split("?" if any_of else ","):
        match = _CLAUSE.match(part.strip())
        if not match:
            raise UserError(
                f"invalid dependency {part[:60]!r}: expected TYPE:ID[:ID...] with TYPE "
                f"one of {', '.join(KINDS)} (e.g. afterok:17)"
            )
        ids = tuple(int(i) for i in match.group(2).split(":"))
        if any(not 1 <= job_id <= MAX_JOB_ID for job_id in ids):
            raise UserError(f"invalid dependency {part[:60]!r}: job ids go from 1 to {MAX_JOB_ID}")
        clauses.append(Clause(match.group(1), ids))
    return Dependency(tuple(clauses), any_of)


def _one(kind: str, state: JobState, started: bool) -> Outcome:
    if kind == "after":
        return Outcome.SATISFIED if started or state.terminal else Outcome.WAITING
    if not state.terminal:
        return Outcome.WAITING
    if kind == "afterany":
        return Outcome.SATISFIED
    succeeded = state is JobState.COMPLETED
    if kind == "afterok":
        return Outcome.SATISFIED if succeeded else Outcome.NEVER
    return Outcome.NEVER if succeeded else Outcome.SATISFIED  # afternotok


def _combine(outcomes: list[Outcome], any_of: bool) -> Outcome:
    if any_of:
        if Outcome.SATISFIED in outcomes:
            return Outcome.SATISFIED
        return Outcome.WAITING if Outcome.WAITING in outcomes else Outcome.NEVER
    if Outcome.NEVER in outcomes:
        return Outcome.NEVER
    return Outcome.WAITING if Outcome.WAITING in outcomes else Outcome.SATISFIED


def evaluate(dependency: Dependency, jobs: dict[int, list[tuple[JobState, bool]]]) -> Outcome:
    """``jobs`` maps each named id to its runs: one (state, started) pair, or one per task
    when the id names a job array (a clause on an array holds when it holds for every task).
    A missing id can never be satisfied."""
    clause_outcomes = []
    for clause in dependency.clauses:
        per_job = []
        for job_id in clause.job_ids:
            runs = jobs.get(job_id)
            if not runs:
                per_job.append(Outcome.NEVER)
                continue
            per_job.append(
                _combine([_one(clause.kind, s, started) for s, started in runs], any_of=False)
            )
        clause_outcomes.append(_combine(per_job, any_of=False))
    return _combine(clause_outcomes, dependency.any_of)
