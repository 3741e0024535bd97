"""What each job of a forecast will still do (its :class:`Work`), and how well that is known
(its :class:`Basis`): the inputs :mod:`gq.sim.forecast` simulates. Pure.

Work is known when the job gave ``--steps`` and its pace has been measured; estimated (``~``)
from its time limit, from its owner's recent jobs of the same name (:class:`Past`) or the
pace of one running now; else unknown (``?``), simulated as running for :data:`HORIZON`.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gq.policies import JobView
from gq.sim.node import MEASURED_AFTER

HORIZON = 365 * 86400.0  # seconds an unknown job is simulated to run
UNKNOWN_PACE = 1.0  # seconds an iteration of a job whose pace nothing tells


class Basis(enum.IntEnum):
    """How much a forecast knows, better first (the worst of several wins)."""

    KNOWN = 0
    ESTIMATED = 1  # shown with "~"
    UNKNOWN = 2  # shown as "?"

    @property
    def mark(self) -> str:
        return ("", "~", "?")[self]


@dataclass(frozen=True)
class Work:
    """What a job will do in all (``steps`` iterations of ``iteration`` seconds on the
    device, each followed by ``gap`` idle seconds, after ``startup`` seconds, and
    ``teardown`` seconds from its last iteration to its exit), and how well that is known."""

    steps: int
    iteration: float
    gap: float
    startup: float
    basis: Basis
    teardown: float = 0.0


@dataclass(frozen=True)
class Past:
    """The owner's recent ended jobs of the same name, as medians: seconds from start to
    end, iterations, seconds an iteration and a gap (None where they ran none); the least
    overhead (run time less device and idle time: start-up, exit, and any wait for a lane);
    and, where their hosts measured it, their start-up (launch to first acquire) and the
    least exit (the overhead less the start-up). Where none has ended, the pace and
    start-up of one running now (:func:`gq.sim.forecast.running_pace`): no run or steps in
    all then."""

    run: float | None
    steps: int | None
    iteration: float | None
    gap: float | None
    overhead: float
    startup: float | None = None
    exit: float | None = None

    @property
    def start_cost(self) -> float:
        """Seconds from a job's start to its first iteration, as well as they are known: as
        measured, else the whole overhead (where no start-up was measured, runs of a host
        from before)."""
        return self.overhead if self.startup is None else self.startup

    @property
    def exit_cost(self) -> float:
        """Seconds from its last iteration to its exit: as measured, else the overhead not
        spent starting, never more than starting took (an overhead also holds waits for a
        shared lane)."""
        if self.exit is not None:
            return self.exit
        return max(0.0, min(self.overhead - self.start_cost, self.start_cost))


@dataclass(frozen=True)
class Ended:
    """One ended job, as :func:`past` summarises them."""

    run: float
    steps: int
    attained: float
    iteration: float | None
    gap: float | None
    startup: float | None = None


def past(ended: Sequence[Ended]) -> Past | None:
    """The summary of a user's recent jobs of one name (None: there were none)."""
    if not ended:
        return None
    paces = [job.iteration for job in ended if job.iteration]
    gaps = [job.gap or 0.0 for job in ended if job.iteration]
    overheads = [max(0.0, job.run - job.attained - job.steps * (job.gap or 0.0)) for job in ended]
    startups = [
        (job.startup, overhead)
        for job, overhead in zip(ended, overheads)
        if job.startup is not None
    ]
    return Past(
        run=statistics.median(job.run for job in ended),
        steps=round(statistics.median(job.steps for job in ended)),
        iteration=statistics.median(paces) if paces else None,
        gap=statistics.median(gaps) if gaps else None,
        overhead=min(overheads),
        startup=statistics.median(s for s, _ in startups) if startups else None,
        exit=min(max(0.0, o - s) for s, o in startups) if startups else None,
    )


def work(
    view: JobView,
    time_limit: float | None,
    previous: Past | None,
    elapsed: float | None = None,
    typical: float | None = None,
) -> Work:
    """What the job will do in all, from its view (steps given and done, pace measured),
    its time limit, and its owner's recent jobs of the same name; ``elapsed``: seconds
    it has run (None: it has not started); ``typical``: the run time of the node's recent
    jobs, what a job nothing else tells of is simulated to run (its forecast is unknown all
    the same, but its neighbours' are better bounds than behind a job that never ends)."""
    # (a pace of 0 is no pace: a job that has run no time yet, or whose figures are odd)
    measured = bool(view.mean_iteration) and view.steps_done >= MEASURED_AFTER
    if measured:
        iteration, gap = view.mean_iteration, view.mean_gap or 0.0
    elif previous is not None and previous.iteration:
        iteration, gap = previous.iteration, previous.gap or 0.0
    else:
        iteration, gap = None, 0.0
    startup = previous.start_cost if previous is not None else 0.0
    teardown = previous.exit_cost if previous is not None else 0.0
    if view.steps_total is not None and iteration is not None:
        basis = Basis.KNOWN if measured else Basis.ESTIMATED
        return Work(view.steps_total, iteration, gap, startup, basis, teardown)
    if view.steps_total is not None and time_limit:
        # spread over its steps: the slowest pace that ends in time
        per_step = max(time_limit - startup, 0.0) / view.steps_total
        return Work(view.steps_total, per_step, 0.0, startup, Basis.ESTIMATED)
    if (
        view.steps_total is None
        and previous is not None
        and previous.steps is not None
        and previous.iteration
        and iteration
    ):
        steps = max(previous.steps, view.steps_done + 1)
        return Work(steps, iteration, gap, startup, Basis.ESTIMATED, teardown)
    run = previous.run if previous is not None and view.steps_total is None else None
    if time_limit is not None:
        run = min(run, time_limit) if run is not None else time_limit
    if run is not None:
        return _running_for(view, run, elapsed, iteration, gap, startup, Basis.ESTIMATED)
    if typical is not None:
        return _running_for(view, typical, elapsed, iteration, gap, startup, Basis.UNKNOWN)
    measured_pace = view.mean_iteration if measured else None
    return _running_for(view, HORIZON, elapsed, measured_pace, gap, startup, Basis.UNKNOWN)


def _running_for(
    view: JobView,
    run: float,
    elapsed: float | None,
    iteration: float | None,
    gap: float,
    startup: float,
    basis: Basis,
) -> Work:
    """A job that runs ``run`` seconds in all, iterations at its pace where one is known
    (else of :data:`UNKNOWN_PACE` after its start-up): what is left, as iterations."""
    period = (iteration + gap) if iteration else UNKNOWN_PACE
    left = max(run - (elapsed or 0.0), period)
    steps = view.steps_done + max(1, math.ceil(left / period))
    return Work(
        steps,
        iteration or UNKNOWN_PACE,
        gap if iteration else 0.0,
        0.0 if iteration else startup,
        basis,
    )
