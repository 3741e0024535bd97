"""The messages between a job's worker (gq.exec.job.worker, inside the job's process) and its
host: what the worker says at its boundaries (Ready, Done, Drained, Total, StepsTaken,
OutOfMemory, Finished) and the host's one answer, a grant (Go). The host decodes them as
:mod:`gq.exec.protocol` says (FROM_WORKER); the worker, which may run under any Python,
writes and reads them with the standard library alone (:mod:`gq.exec.job.worker_link`).
"""

from __future__ import annotations

from gq.codec import Message
from gq.exec.host.messages import Shortage
from gq.fields import Count, EventHandle, HostMemory, Positive


class Ready(Message, tag="ready"):
    """At an acquire: the worker blocks until Go."""


class Done(Message, tag="done"):
    """At a release: one iteration over, with the worker's step count and memory."""

    steps: Count
    mem_persistent: Count | None = None
    mem_peak: Count | None = None
    # Told it may hand over (Go.hand_over): an interprocess event recorded after the
    # iteration's work, sent at once, before the device has run it; the next holder of the
    # lane, where it is the same user's, waits on it on its device (gq.exec.lane.handover).
    event: EventHandle | None = None


class Drained(Message, tag="drained"):
    """After a Done that carried an event: the device has run everything before it."""


class Total(Message, tag="total"):
    steps: Positive


class StepsTaken(Message, tag="progress"):
    """Steps counted outside a grant (a loop that runs released)."""

    # The same op as host_messages.Progress (host → daemon): they never share a table, so
    # each end reads its own; renaming either would change a wire.
    steps: Count


class OutOfMemory(Shortage, Message, tag="oom"):
    """The script is ending on an out-of-memory error: what it held and asked for."""


class Finished(Message, tag="finished"):
    """The script is over: its lane is free now, before the interpreter's teardown."""


class Go(Message, tag="go"):
    empty_cache: bool = False  # give back cached device memory at its release (lanes short)
    mem_cap: HostMemory | None = None  # from now on: its probe's figure (a CUDA job's cap)
    lease: Count = 0  # nonzero: the lane is its own across boundaries until asked back
    hand_over: bool = False  # at its release: send the Done with an event, without waiting
    after: EventHandle | None = None  # its stream waits on it before its first kernel
