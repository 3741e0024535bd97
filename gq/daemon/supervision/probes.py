"""Memory probes and caps: a job that declared no memory is probed (its lane is its own until
its first iterations are measured, or its probe's time runs out), and its figure, its peak
and a margin, is kept in the queue and sent to its GPU's host as its cap; a job measured
over its figure is logged (MEM!).

What a job's worker reports (on its page, or with its Done) is its claim: shown as such, and
believed for admission only as far as the host sees it, up to the job's own figure where it
has one, else (a probe) up to what its processes are seen to hold at most where the host can
see that (its cgroup's memory on the cpu and emulated devices, whose memory is the host's),
else up to its lane.

:class:`Probes` is a part of :class:`gq.daemon.supervision.supervisor.Supervisor`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gq import defaults, messages
from gq.codec import MessageError, checked
from gq.daemon.scheduling import admission
from gq.daemon.supervision import memory_figures
from gq.daemon.supervision.host_handles import HostHandle, HostSettings
from gq.daemon.supervision.running import Running
from gq.exec.cgroups.job_cgroups import Cgroups, resident_bytes
from gq.exec.host import messages as wire
from gq.exec.host.messages import JobProgress
from gq.queue import job_updates
from gq.queue.engine import Database
from gq.units import format_size

log = logging.getLogger("gq.daemon")


class Probes:
    """The supervisor's memory probes, and the caps they come to."""

    # What it uses of the rest of the supervisor (see gq.daemon.supervision.supervisor)
    db: Database
    cgroups: Cgroups | None
    settings: HostSettings
    hosts: dict[str, HostHandle]
    running: dict[int, Running]
    probe_wait: float
    wake: Callable[[], None]
    send: Callable[[str, object], None]

    def _check_figure(self, job: Running, iterations: int) -> None:
        """A probed job's figure once its first iterations are measured; a job measured over
        its figure is logged (its owner sees MEM! in gq status and gq show)."""
        measured = job.measured
        assert measured is not None
        if job.probing and iterations >= defaults.PROBE_ITERATIONS:
            self.end_probe(job, measured.persistent + measured.ephemeral)
        elif (
            not job.probing
            and not job.over
            and job.footprint.persistent
            and memory_figures.over_figure(job.footprint.persistent, job.claimed_peak)
        ):
            job.over = True
            log.warning(
                "job %d claims %s of device memory, more than its figure of %s (MEM!)",
                job.job_id,
                format_size(job.claimed_peak),
                format_size(job.footprint.persistent),
            )

    def end_probes(self, now: float) -> None:
        """Probes that ran their time (jobs of fewer iterations, counted from the first, or
        of none, from their start: loading a model may take long): their figure is what
        they were measured to hold so far; where nothing was, they have none, and count as
        what they are seen to hold."""
        for job in list(self.running.values()):
            since, limit = (
                (job.iterating_since, defaults.PROBE_SECONDS)
                if job.iterating_since is not None
                else (job.started, self.probe_wait)
            )
            if job.probing and now - since >= limit:
                measured = job.measured or admission.Footprint()
                self.end_probe(job, measured.persistent + measured.ephemeral)

    def end_probe(self, job: Running, peak: int) -> None:
        """The probe is over: the job's figure is its peak and a margin (kept in the queue,
        shown by gq show; on a GPU its cap from now on), and its lane is open to others
        again."""
        if peak > 0:  # kept in the queue first: a probe whose figure was lost goes on
            figure = min(memory_figures.probed_figure(peak), self._lane_memory(job))
            with self.db.write() as session:
                job_updates.set_memory_figure(
                    session, job.job_id, figure, messages.MemoryBasis.MEASURED
                )
            job.footprint = admission.Footprint(persistent=figure)
            self._send_cap(job.host, job.job_id, job.run, figure)
            log.info("job %d: probed at %s of device memory", job.job_id, format_size(figure))
        else:
            log.info(
                "job %d: no memory measured by its probe's end; it counts as what it "
                "is seen to hold",
                job.job_id,
            )
        job.probing = False
        self.wake()

    def _send_cap(self, name: str, job_id: int, run: int, figure: int) -> None:
        """A probed job's figure as its cap, to its GPU's host (a current one: an older host
        would not know the message). On the cpu and emulated devices a probe sees the
        worker's resident memory at its boundaries, not the transient peaks and children its
        cgroup counts: its figure is not made a cap there, and growing past it is MEM!."""
        host = self.hosts.get(name)
        if host is None or not host.current or host.device.kind != "cuda":
            return
        try:
            message = checked(wire.Cap(job_id, run, figure))
        except MessageError as exc:
            log.warning("job %d: its figure of %d bytes cannot be its cap: %s", job_id, figure, exc)
            return
        self.send(name, message)

    def _plausible_footprint(self, job: Running, progress: JobProgress) -> admission.Footprint:
        """The memory a job's worker claims, as far as the host vouches for it (see the
        module's docstring): a claim past that moves nothing but the job's own MEM!."""
        job.claimed_peak = progress.mem_peak or 0
        bound = self._lane_memory(job)
        if not job.probing and job.footprint.persistent:
            bound = min(bound, job.footprint.persistent)
        else:
            seen = self._seen_holding(job)
            if seen is not None:
                job.seen_peak = max(job.seen_peak or 0, seen)
                bound = min(bound, job.seen_peak)
        persistent = min(progress.mem_persistent or 0, bound)
        peak = min(progress.mem_peak or 0, bound)
        return admission.Footprint(persistent, max(0, peak - persistent))

    def _seen_holding(self, job: Running) -> int | None:
        """What a job's processes hold as the host sees it, where that is its device memory
        (on the cpu and emulated devices; None elsewhere, or unknown): the most of its
        cgroup's charge and its worker's resident size, which is what the worker itself
        reports (it counts library pages the cgroup may not be charged for; its children's
        resident sizes are not summed: each would count the pages they share again)."""
        if self.cgroups is None or any(d.kind == "cuda" for d in job.devices):
            return None
        charged = self.cgroups.job(job.host, job.job_id, job.run).usage().memory
        own = resident_bytes([job.pid]) if job.pid is not None else 0
        if charged is None and not own:
            return None
        return max(charged or 0, own)

    def _lane_memory(self, job: Running) -> int:
        """What the job's lane offers: the least of its devices' memory, split by lanes."""
        return min(d.memory_total for d in job.devices) // self.settings.lanes
