"""The daemon's record of a job running on an execution host (:class:`Running`): where it
runs, what it holds, what its host last said of it; and what a job asks for when it starts
(its footprint, whether it is probed), which admission counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gq import defaults
from gq.daemon.devices import Device
from gq.daemon.scheduling import admission
from gq.daemon.scheduling.fair_share import Charged
from gq.exec.host.messages import JobProgress, StopWhy


@dataclass
class Running:
    job_id: int
    run: int  # the job's run_count for this run: host reports name it
    started: float  # wall clock: with the time limit, when its devices are free at the latest
    devices: list[Device]
    lane: int
    host: str
    time_limit: int | None
    requeue: bool
    footprint: admission.Footprint
    exclusive: bool
    priority: int
    host_mem: int | None = None  # what it holds of the node's RAM and CPUs (admission counts)
    cpus: int | None = None
    suspended: bool | None = None  # as its host was last told (None: not told since attach)
    # From the job's own memory reports, as far as the host vouches for them (probes.py).
    measured: admission.Footprint | None = None
    pid: int | None = None  # its process, once its host has started it
    holds_lane: bool = False  # as its host last reported
    kill_why: StopWhy | None = None
    # It declared no memory: its lane is its own until its first figures are known.
    probing: bool = False
    iterating_since: float | None = None  # wall clock: its first iteration began (probes)
    over: bool = False  # claimed over its figure (MEM!), logged once
    claimed_peak: int = 0  # the peak its worker last claimed to hold
    seen_peak: int | None = None  # the most its processes were seen to hold (probes)
    interactive: bool = False  # its terminal is its submitter's: never moved elsewhere
    # Its host's last report, and when it came (wall clock): fresher than its row, which is
    # flushed about once a second; a forecast goes on from it.
    latest: JobProgress | None = None
    latest_at: float = 0.0
    user: str = ""
    charged: Charged = field(default_factory=Charged)  # to its owner's fair-share usage
    worker: bool = True  # a Python script under gq's worker (else a plain process)
    # When it last used its lane (wall clock: at least defaults.ACTIVE_SHARE of the time
    # since it last did), and its attained time then: a resident idle since, for
    # --idle-resident, may give its slot back (gq.daemon.scheduling.residency).
    active_at: float = field(default_factory=time.time)
    active_attained: float = 0.0
    yielded: float | None = None  # seconds it was idle when it gave its slot back
    # Resumed while its memory is in host memory, it waits for room on its device: what it
    # needs is kept from other jobs meanwhile, so that it comes back once theirs end.
    wants_back: bool = False

    def note_use(self, attained: float, now: float) -> None:
        """Its host says it has attained so much: it is active where that is at least
        ACTIVE_SHARE of the time since it was last (an empty iteration now and then is not)."""
        if attained - self.active_attained >= defaults.ACTIVE_SHARE * (now - self.active_at):
            self.active_at, self.active_attained = now, attained

    def may_give_back(self, now: float) -> bool:
        """Whether its run may be requeued to give its slot back: a batch job of gq's worker,
        not being ended, that asked to be requeued (--requeue) or has done next to nothing
        in all its run (less than ACTIVE_SHARE of it on its lane), so loses nothing much."""
        attained = self.latest.attained if self.latest is not None else 0.0
        return (
            self.worker
            and not self.interactive
            and not self.exclusive
            and self.kill_why is None
            and len(self.devices) == 1
            and (self.requeue or attained < defaults.ACTIVE_SHARE * (now - self.started))
        )

    @property
    def memory_moved_out(self) -> bool:
        """Its memory is in host memory, as its host last said (a suspended job's)."""
        memory = self.latest.memory if self.latest is not None else None
        return memory is not None and memory.place == "host"

    @property
    def away(self) -> bool:
        """It holds nothing of its device (no memory, no context, no resident slot): its
        memory is in host memory, and it is not waiting to come back."""
        return self.memory_moved_out and not self.wants_back

    @property
    def checkpoint_bytes(self) -> int:
        """The node's host memory its moved-out device memory takes from what no job has
        reserved: none for a job with --host-mem (its checkpoint is held under it, by its
        cgroup), all of it for one without, until it is back on the device."""
        memory = self.latest.memory if self.latest is not None else None
        if memory is None or memory.place == "device" or self.host_mem:
            return 0
        return memory.moved

    def footprint_now(self) -> admission.Footprint:
        """What the job asked for (--gpu-mem), or what it was measured to use, if more."""
        if self.measured is None:
            return self.footprint
        return max(self.footprint, self.measured, key=lambda f: f.persistent + f.ephemeral)


def footprint(job) -> admission.Footprint:
    """What a job (a row, or anything with its ``mem``) asked for, or was measured or
    raised to (see :mod:`gq.daemon.supervision.memory_figures`)."""
    return admission.Footprint(persistent=job.mem or 0, ephemeral=0)


def probed(job) -> bool:
    """Whether a job is probed: it declared no memory and runs under gq's worker, which
    reports its figures (a plain process counts as what it is measured to hold)."""
    return job.mem is None and job.interpreter is not None


def running_run(job, devices: list[Device], lane: int, host: str) -> Running:
    """The daemon's record of a run of ``job`` (a row, or anything with its columns) on
    ``devices``."""
    return Running(
        job_id=job.id,
        run=job.run_count,
        started=job.start_time or time.time(),
        devices=devices,
        lane=lane,
        host=host,
        time_limit=job.time_limit,
        requeue=job.requeue,
        footprint=footprint(job),
        exclusive=admission.has_devices_alone(
            job.exclusive, job.interpreter is not None, job.gpus, any(d.whole for d in devices)
        ),
        priority=job.priority,
        pid=job.pid,
        host_mem=job.host_mem,
        cpus=job.cpus,
        probing=probed(job),
        interactive=bool(job.interactive),
        user=job.user,
        worker=job.interpreter is not None,
        active_at=job.start_time or time.time(),
    )


def unreserved_memory(node_memory: int, jobs: Iterable[Running], beside: Running) -> int:
    """The node's host memory that no running job but ``beside`` has reserved (--host-mem)
    and no checkpoint of theirs holds (bytes; less than none where reservations exceed the
    node): what ``beside``'s checkpoint may take."""
    others = [job for job in jobs if job is not beside]
    return (
        node_memory
        - sum(job.host_mem or 0 for job in others)
        - sum(job.checkpoint_bytes for job in others)
    )
