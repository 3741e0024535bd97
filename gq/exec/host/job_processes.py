"""A device's jobs' processes, as its execution host (:mod:`gq.exec.host.loop`) runs them: each
started as its submitter (:mod:`gq.exec.host.spawn`) in its own process group and cgroup, with
its script, terminal, worker socket and lease page handed over; then watched (time limits,
sbatch's --signal before them, deadlines, --idle-timeout, hang-ups), frozen and thawed,
killed, and reaped, its exit handed to the host to report only once nothing of it is left.

The host never waits on a job's processes here: a stuck one costs only its own job.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable

from gq import defaults
from gq.errors import LaunchError
from gq.exec.cgroups import job_cgroups as cgroups
from gq.exec.cgroups.job_cgroups import JobCgroup
from gq.exec.host import messages as wire
from gq.exec.host.messages import StopWhy
from gq.exec.host.process_groups import kill_group, kill_outside_group, warn_steps
from gq.exec.host.spawn import JobProcess, start_as_submitter
from gq.exec.host.terminal import Terminals
from gq.exec.job import idleness
from gq.exec.job.rank_progress import RankProgress
from gq.exec.lane.granting import Granter
from gq.exec.lane.lease import SharedPage
from gq.exec.lane.residents import Lane, Resident
from gq.exec.protocol import FROM_WORKER, Channel
from gq.queue import spool
from gq.units import format_duration

log = logging.getLogger("gq.host")
# How long an exited job's leftovers may take to die before its exit is reported all the
# same (they are killed on after); the host never waits for them meanwhile.
_REAP_WAIT = 1.0


class JobProcesses:
    """The processes of the jobs resident on one device (the host's own dict and lanes,
    shared with its :class:`~gq.exec.lane.granting.Granter`): the host adds a started job to
    both, and :meth:`reap` takes it off once it has exited and is reported."""

    def __init__(
        self,
        device: str,
        cuda: bool,
        lanes: list[Lane],
        residents: dict[int, Resident],
        selector: selectors.BaseSelector,
        terminals: Terminals,
        granter: Granter,
        report_exit: Callable[[wire.Exited], None],
        kill_grace: float,
        cgroup_backend: cgroups.Cgroups | None = None,
        progress: RankProgress | None = None,
    ):
        self.device = device
        self.cuda = cuda
        self.lanes = lanes
        self.residents = residents
        self.selector = selector
        self.terminals = terminals
        self.granter = granter
        self.report_exit = report_exit  # the host keeps it until a daemon acknowledges it
        self.kill_grace = kill_grace
        self.cgroups = cgroup_backend
        self.progress = progress or RankProgress(None, device)
        self.lingering: list[JobCgroup] = []  # killed, not empty yet: killed again until so
        self._next_idle_check = 0.0  # interactive jobs' terminals (gq.exec.job.idleness)

    # ----- starting ---------------------------------------------------------------------
    def start(self, spec: wire.LaunchSpec) -> Resident:
        """Start the job's process as its submitter, in its own process group and cgroup,
        with its snapshot open as SCRIPT_FD and, for a Python job, its socket as WORKER_FD."""
        env = dict(spec.env)
        env.pop("GQ_PROGRESS_SOCKET", None)  # a job submitted from a job's: not that one's
        fds: dict[int, int] = {}
        script = _open_snapshot(spec)
        worker_end = host_end = page = page_fd = slave = progress = None
        try:
            if script is not None:
                fds[defaults.SCRIPT_FD] = script
            if spec.terminal:
                slave = fds[defaults.TERMINAL_FD] = self.terminals.open(spec)
            if spec.worker:
                host_end, worker_end = socket.socketpair()
                env["GQ_WORKER_FD"] = str(defaults.WORKER_FD)
                fds[defaults.WORKER_FD] = worker_end.fileno()
                page, page_fd = _lane_page(spec.id)
                if page_fd is not None:
                    env["GQ_PAGE_FD"] = str(defaults.PAGE_FD)
                    fds[defaults.PAGE_FD] = page_fd
                if spec.mem_cap is not None and self.cuda:
                    env["GQ_MEM_CAP"] = str(spec.mem_cap)
            else:
                progress = self.progress.bind(spec.id, spec.run, spec.uid, spec.gid)
                if progress is not None:
                    env["GQ_PROGRESS_SOCKET"] = progress.getsockname()
            cgroup, cgroup_cap = self._make_cgroup(spec)
            try:
                process = start_as_submitter(spec, env, fds, cgroup)
            except LaunchError:
                if cgroup is not None:
                    cgroup.remove()
                raise
        except LaunchError:
            if host_end is not None:
                host_end.close()
            if page is not None:
                page.close()
            self.terminals.discard(spec.id)
            self.progress.discard(progress)
            raise
        finally:
            if slave is not None:
                os.close(slave)  # the job's alone: its last close hangs the master up
            if worker_end is not None:
                worker_end.close()
            if page_fd is not None:
                os.close(page_fd)
            if script is not None:
                os.close(script)
        channel = None
        if host_end is not None:
            host_end.setblocking(False)
            channel = Channel(host_end, FROM_WORKER, chunk=defaults.WORKER_READ)
        lane = spec.lane
        if lane is None or not 0 <= lane < len(self.lanes):
            lane = min(self.lanes, key=lambda option: len(option.residents)).index
        return Resident(
            job_id=spec.id,
            run=spec.run,
            user=spec.user,
            priority=spec.priority,
            submit_time=spec.submit_time,
            declared_total=spec.steps_total,
            lane=lane,
            process=process,
            channel=channel,
            worker=spec.worker,
            started_at=time.monotonic(),
            started_wall=time.time(),
            cgroup=cgroup,
            time_limit=spec.time_limit,
            deadline=spec.deadline,
            interactive=spec.terminal,
            idle_timeout=spec.idle_timeout,
            warning=(spec.warn_signal, spec.warn_before, spec.warn_main)
            if spec.warn_signal is not None
            else None,
            mem_cap=spec.mem_cap,
            cgroup_cap=cgroup_cap,
            probing=spec.probe,
            page=page,
            host_mem_watched=spec.host_mem if cgroup is None or not cgroup.memory_limited else None,
            step_socket=progress,
        )

    def set_up(self, process: JobProcess) -> None:
        """A job's process has exec'd, or failed before and says why (it exits then, and
        its exit report carries the reason)."""
        if process.setup_pipe is not None:
            self.selector.unregister(process.setup_pipe)
            process.read_setup()

    def _make_cgroup(self, spec: wire.LaunchSpec) -> tuple[JobCgroup | None, int | None]:
        """The run's cgroup, limited to its host memory, CPUs and tasks, and on a device that
        is the host's own memory (cpu, emulated) to its device-memory figure too; and the
        cgroup's memory limit where it holds that figure (else the host checks it at each
        boundary)."""
        if self.cgroups is None:
            return None, None
        try:
            cgroup = self.cgroups.create(self.device, spec.id, spec.run)
        except OSError as exc:
            raise LaunchError(f"cannot make job {spec.id}'s cgroup: {exc.strerror}") from None
        caps = [
            cap for cap in (spec.host_mem, None if self.cuda else spec.mem_cap) if cap is not None
        ]
        unenforced = cgroup.limit(min(caps) if caps else None, spec.cpus, spec.max_pids)
        if unenforced:
            log.warning(
                "job %d: its cgroup cannot enforce %s here%s",
                spec.id,
                " or ".join(unenforced),
                " (its host checks its memory instead)" if "its memory limit" in unenforced else "",
            )
        # Only where the device figure is the binding limit is a kill there a device
        # shortage (at --host-mem's, the job fails as it always has).
        holds = (
            not self.cuda
            and spec.mem_cap is not None
            and min(caps) == spec.mem_cap
            and "its memory limit" not in unenforced
        )
        return cgroup, spec.mem_cap if holds else None

    # ----- exits and kills ------------------------------------------------------------
    def reap(self) -> None:
        """Collect jobs whose process has exited. Whatever a job started dies with it (its
        process group, and its cgroup, which holds what left the group) before its exit is
        reported, so that a requeued run never overlaps the last one; the host never waits
        for that (a process stuck in the kernel would hold every other job up), it looks
        again at its next turns, and after ``_REAP_WAIT`` reports all the same and keeps
        killing what is left."""
        now = time.monotonic()
        for resident in list(self.residents.values()):
            if resident.exit_status is None:
                code = resident.process.poll()
                if code is None:
                    continue
                self._collect(resident, code, now)
            if not self._emptied(resident, now):
                continue
            del self.residents[resident.job_id]
            self.report_exit(resident.exit_report())

    def _collect(self, resident: Resident, code: int, now: float) -> None:
        """Its process has exited: read what it said last, free its lane, kill its group."""
        self.set_up(resident.process)  # a failed set-up's words are in the pipe now
        if resident.channel is not None:
            # Its last messages (a final DONE, say), all of them: it sends no more. A
            # protocol error among them still ends the job as one.
            resident.channel.chunk = defaults.MAX_FRAME
            self.granter.from_worker(resident)
        if resident.channel is not None:
            self.granter.drop_channel(resident)
        self.progress.close(resident)
        resident.exit_status, resident.exited_at, resident.ended_wall = code, now, time.time()
        if self.terminals.job_ended(resident.job_id) and resident.kill_why is None:
            resident.kill_why, resident.detail = StopWhy.HANGUP, "its terminal was closed"
        if (
            code != 0
            and resident.shortage is None
            and resident.cgroup_cap is not None
            and resident.kill_why is None
            and resident.cgroup is not None
            and resident.cgroup.oom_kills()
        ):
            # The kernel killed it at its cgroup's limit: it held that much, and wanted more.
            resident.shortage = wire.Shortage(held=resident.cgroup_cap)
        self.granter.leave_lane(resident)
        kill_group(resident.process.pid, signal.SIGKILL)

    def _emptied(self, resident: Resident, now: float) -> bool:
        """Whether nothing of an exited job is left (killing what is, without waiting)."""
        cgroup = resident.cgroup
        if cgroup is None:
            return True
        if cgroup.kill(0.0):
            cgroup.remove()
            return True
        if now - resident.exited_at < _REAP_WAIT:
            return False
        log.warning(
            "job %d: processes left in %s after SIGKILL; killing them again",
            resident.job_id,
            cgroup.name,
        )
        self.lingering.append(cgroup)
        return True

    def kill_lingering(self) -> None:
        for cgroup in list(self.lingering):
            if cgroup.kill(0.0):
                cgroup.remove()
                self.lingering.remove(cgroup)

    def kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None:
        """SIGTERM to every process of the job now, SIGKILL after the kill wait (or
        ``grace``). A job whose process has exited already is ended as it ended."""
        if resident.exit_status is not None:
            return
        if resident.kill_deadline is not None and grace is None:
            return
        if resident.kill_why is None or why is StopWhy.PROTOCOL:
            resident.kill_why = why
        if resident.frozen:  # stopped processes must go on to see their signal
            self.freeze(resident, False)
        if self.terminals.has(resident.job_id):  # a terminal's job ends as a hang-up ends it
            self._signal_job(resident, signal.SIGHUP)  # (an interactive shell ignores TERM)
        self._signal_job(resident, signal.SIGTERM)
        resident.kill_deadline = time.monotonic() + (self.kill_grace if grace is None else grace)
        if grace == 0.0:
            self._signal_job(resident, signal.SIGKILL)

    def _signal_job(self, resident: Resident, signum: int) -> None:
        """Every process of the job gets the signal once: its process group at once, then
        what of its cgroup has left the group (SIGKILL: the whole cgroup, atomically where
        the kernel can; a process killed twice notices nothing)."""
        kill_group(resident.process.pid, signum)
        if resident.cgroup is None:
            return
        if signum == signal.SIGKILL:
            resident.cgroup.kill(0.0)
            return
        kill_outside_group(resident.cgroup.pids(), resident.process.pid, signum)

    def freeze(self, resident: Resident, frozen: bool) -> None:
        """Freeze (or thaw) the job: its cgroup's freezer, else SIGSTOP (SIGCONT)."""
        resident.frozen = frozen
        if resident.cgroup is None or not resident.cgroup.freeze(frozen):
            self._signal_job(resident, signal.SIGSTOP if frozen else signal.SIGCONT)

    def enforce_kills(self) -> None:
        now = time.monotonic()
        for resident in self.residents.values():
            if (
                resident.kill_deadline is not None
                and now >= resident.kill_deadline
                and resident.exit_status is None
            ):
                self._signal_job(resident, signal.SIGKILL)

    def hang_up_untaken(self) -> None:
        for terminal in self.terminals.untaken(time.monotonic()):
            self.hang_up(
                terminal.job,
                terminal.run,
                f"no gq took its terminal within {self.terminals.wait:g} s",
            )

    def hang_up(self, job: int, run: int, detail: str) -> None:
        """The run's terminal is gone: the kernel has sent its session SIGHUP, which ends a
        shell or a REPL as it ends a login shell; what is left is killed after the kill
        wait."""
        resident = self.residents.get(job)
        if (
            resident is None
            or resident.run != run
            or resident.exit_status is not None
            or resident.kill_why is not None
        ):
            return
        log.info("job %d: hung up (%s)", job, detail)
        resident.kill_why, resident.detail = StopWhy.HANGUP, detail
        if resident.frozen:
            self.freeze(resident, False)
        resident.kill_deadline = time.monotonic() + self.kill_grace

    # ----- limits -----------------------------------------------------------------------
    def enforce_time_limits(self) -> None:
        now, wall = time.monotonic(), time.time()
        for resident in list(self.residents.values()):
            if resident.kill_deadline is not None or resident.exit_status is not None:
                continue
            if resident.suspended:
                continue  # its time limit does not run meanwhile
            ran = now - resident.started_at - resident.paused
            if resident.time_limit is not None and ran >= resident.time_limit:
                self.kill(resident, StopWhy.TIMEOUT)
            elif (
                resident.warning is not None
                and resident.time_limit is not None
                and ran >= resident.time_limit - resident.warning[1]
            ):
                self._warn(resident, *resident.warning)
                resident.warning = None  # once, as sbatch's
            elif resident.deadline is not None and wall >= resident.deadline:
                self.kill(resident, StopWhy.DEADLINE)

    def _warn(self, resident: Resident, signum: int, _before: int, batch_only: bool) -> None:
        """sbatch's --signal, to the job's steps (process_groups.warn_steps)."""
        members = set(resident.cgroup.pids()) if resident.cgroup is not None else set()
        tasks = warn_steps(resident.process.pid, members, signum, batch_only)
        log.info(
            "job %d: signal %d before its time limit to %s",
            resident.job_id,
            signum,
            f"{tasks} srun task(s)" if tasks else "its main process",
        )

    def watch_idle(self) -> None:
        """Interactive jobs' last activity (gq.exec.job.idleness), reported as it moves on; one
        idle for its --idle-timeout is ended, as Jupyter's culler ends an idle kernel. A
        suspended job's idle time does not run meanwhile, as its time limit does not."""
        now, wall = time.monotonic(), time.time()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + idleness.CHECK_EVERY
        for resident in list(self.residents.values()):
            if (
                not resident.interactive
                or resident.kill_deadline is not None
                or resident.exit_status is not None
            ):
                continue
            seen = (
                wall
                if resident.suspended
                else idleness.last_active(
                    resident.active_at,
                    self.terminals.last_used(resident.job_id),
                    resident.in_iteration,
                    wall,
                    resident.started_wall,
                )
            )
            if seen is not None and (resident.active_at is None or seen > resident.active_at):
                resident.active_at = seen
                if idleness.worth_reporting(resident.active_told, seen):
                    resident.active_told, resident.dirty = seen, True
            idle = idleness.idle_for(resident.active_at, resident.started_wall, wall)
            if resident.idle_timeout is not None and idle >= resident.idle_timeout:
                resident.detail = f"no activity for {format_duration(idle)}"
                log.info(
                    "job %d: idle for %.0f s, its --idle-timeout; ending it", resident.job_id, idle
                )
                self.kill(resident, StopWhy.IDLE)

    def close(self) -> None:
        """The host exits: what is left of ended jobs is killed, the device's cgroups go."""
        for cgroup in self.lingering:
            cgroup.kill(defaults.CGROUP_KILL_TIMEOUT)
            cgroup.remove()
        if self.cgroups is not None:
            self.cgroups.remove_device(self.device)


def _lane_page(job_id: int) -> tuple[SharedPage | None, int | None]:
    """A new page to share with the job's worker; without one (out of memory or
    descriptors) the job runs as well, with a READY/GO exchange at every boundary."""
    try:
        return SharedPage.create()
    except OSError as exc:
        log.warning(
            "job %d: no page to share with its worker (%s); it runs without leases", job_id, exc
        )
        return None, None


def _open_snapshot(spec: wire.LaunchSpec) -> int | None:
    """The job's snapshot, opened by the host: the job's user cannot reach the spool."""
    if spec.snapshot is None:
        return None
    try:
        return spool.open_regular(spec.snapshot)
    except OSError as exc:
        raise LaunchError(
            f"cannot open job {spec.id}'s script snapshot: {exc.strerror}; submit the script again"
        ) from None
