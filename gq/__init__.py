"""gq: a Slurm-like job queue for one GPU node.

This module is also the job-side API. Inside a gq job these mark iteration boundaries so
the execution host can swap resident jobs; outside gq (plain ``python train.py``) they do
nothing, so scripts stay runnable by hand::

    import gq
    gq.set_total_steps(1000)
    for batch in gq.steps(loader, total=1000):   # body runs holding the device
        ...
    gq.step()                                     # or mark a boundary by hand
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing: every command and
if TYPE_CHECKING:  # every job imports this module
    from collections.abc import Iterable, Iterator
    from typing import TypeVar

    T = TypeVar("T")

__version__ = "0.1.0"
__all__ = ["steps", "step", "set_total_steps", "in_job"]


def _session():
    from gq.exec.job import session as job_session

    return job_session.active


def in_job() -> bool:
    """True inside a job run by gq's worker."""
    return _session() is not None


def steps(iterable: Iterable[T], total: int | None = None) -> Iterator[T]:
    """Yield items; fetching the next one happens released, the loop body acquired."""
    session = _session()
    if session is None:
        yield from iterable
        return
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if total:  # an empty loader declares nothing
        session.set_total_steps(total)
    from gq.exec.job.session import EXPLICIT

    for item in iterable:
        session.acquire()
        try:
            yield item
        finally:
            session.count_step(EXPLICIT)
            session.release()


def step() -> None:
    """An explicit boundary: end the current iteration, then wait for the next grant."""
    session = _session()
    if session is not None:
        from gq.exec.job.session import EXPLICIT

        session.count_step(EXPLICIT)
        session.release()
        session.acquire()


def set_total_steps(total: int) -> None:
    """Tell the scheduler how many iterations the job will run (used by srtf)."""
    session = _session()
    if session is not None:
        session.set_total_steps(int(total))
