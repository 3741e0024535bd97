"""The messages between a job's worker (gq.exec.worker, inside the job's process) and its
host: what the worker says at its boundaries (Ready, Done, Total, StepsTaken, OutOfMemory,
Finished) and the host's one answer, a grant (Go). How they travel is
:mod:`gq.exec.protocol` (FROM_WORKER, TO_WORKER, WorkerChannel).
"""

from __future__ import annotations

from typing import ClassVar

from gq.codec import message
from gq.exec.host_messages import Shortage
from gq.fields import Count, HostMemory, Positive


@message
class Ready:
    """At an acquire: the worker blocks until Go."""

    op: ClassVar[str] = "ready"


@message
class Done:
    """At a release: one iteration over, with the worker's step count and memory."""

    op: ClassVar[str] = "done"
    steps: Count
    mem_persistent: Count | None = None
    mem_peak: Count | None = None


@message
class Total:
    op: ClassVar[str] = "total"
    steps: Positive


@message
class StepsTaken:
    """Steps counted outside a grant (a loop that runs released)."""

    # The same op as host_messages.Progress (host → daemon): they never share a table, so
    # each end reads its own; renaming either would change a wire.
    op: ClassVar[str] = "progress"
    steps: Count


@message
class OutOfMemory(Shortage):
    """The script is ending on an out-of-memory error: what it held and asked for."""

    op: ClassVar[str] = "oom"


@message
class Finished:
    """The script is over: its lane is free now, before the interpreter's teardown."""

    op: ClassVar[str] = "finished"


@message
class Go:
    op: ClassVar[str] = "go"
    empty_cache: bool = False  # give back cached device memory at its release (lanes short)
    mem_cap: HostMemory | None = None  # from now on: its probe's figure (a CUDA job's cap)
    lease: Count = 0  # nonzero: the lane is its own across boundaries until asked back
