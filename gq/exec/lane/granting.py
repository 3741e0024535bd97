"""Who gets each lane's next iteration: the host's side of the lanes.

The execution host (:mod:`gq.exec.host.loop`) owns the daemon's link and, through
:mod:`gq.exec.host.job_processes`, the jobs' processes; this owns the hot path: the workers'
READY and DONE, and the grant each free lane gets as :mod:`gq.exec.lane.rule` decides (the
simulator predicts with the same rule), given the views :mod:`gq.exec.lane.views` makes of
the residents. Every move of a job between standings goes through
:func:`gq.exec.lane.standings.step`, the one table of what may follow what.

Two ways to hold a lane:

- **a grant**: the worker asked with READY, the host sent a Go; the iteration is the job's
  until its Done, billed from the Go to the Done as the host saw them. The worker sends its
  Done only once its device has run the iteration's work (gq.exec.lane.device_sync), so the next
  grant never overlaps it, and that time is device time; or, where every job on the lane is
  its owner's, at once with an event the next holder's device waits on
  (gq.exec.lane.handover).
- **a lease** (:mod:`gq.exec.lane.lease`; the host's books: :mod:`gq.exec.lane.leasing`), for
  a job alone on its lane, beside jobs none of which could take it (fifo's head), under
  fair beside those it alternates with, a slice of lane time at a time
  (gq.exec.lane.rule.sliced), or for a person's run of turns (gq.exec.lane.rule.PeopleTurns):
  granted with its Go, it crosses boundaries on its page's lock without a message until a
  job asks that could, or its slice or run is over; billed the lease's whole wall time, as
  the host saw it begin and end (and the tail a hand-over leaves).

No memory a job can write reaches a call that can fail the host (the lock is the kernel's),
nothing is shared between two jobs, and time is never billed on a job's word: a lie costs
only the liar. What the lanes need of the host (ending a job, freezing one, sending
progress early) is :class:`Processes`.
"""

from __future__ import annotations

import logging
import selectors
import time
from typing import Protocol

from gq import defaults
from gq.exec.host.messages import Shortage, StopWhy
from gq.exec.job import messages as wire
from gq.exec.lane import handover, wakeups
from gq.exec.lane import memory as lane_memory
from gq.exec.lane import rule as lane_rule
from gq.exec.lane.leasing import Leases, bill, move
from gq.exec.lane.residents import Lane, Resident, ready_to_grant
from gq.exec.lane.standings import HOLDS_LANE, Event, Standing
from gq.exec.lane.views import decide, overstays, takes_turns, undisputed, usage_beside
from gq.policies.base import Policy
from gq.validation import printable

log = logging.getLogger("gq.host")


class Processes(Protocol):
    """What the lanes ask of their host: the jobs' processes are its own."""

    def kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None:
        """SIGTERM to the job, SIGKILL after ``grace`` (the host's kill wait if None)."""

    def freeze(self, resident: Resident, frozen: bool) -> None:
        """Stop (or let go on) every process of the job."""

    def report_soon(self) -> None:
        """Send the daemon the jobs' progress at the host's next turn, not a period on."""


class Granter:
    """The lanes of one device and the jobs resident on them (the host's own list and
    dict: the host adds a launched job to both, and this takes it off its lane)."""

    def __init__(
        self,
        lanes: list[Lane],
        residents: dict[int, Resident],
        selector: selectors.BaseSelector,
        host: Processes,
        cuda: bool,
        policy: Policy,
        lane_memory: int | None = None,
    ):
        self.lanes = lanes
        self.residents = residents
        self.selector = selector
        self.host = host
        self.cuda = cuda
        self.policy = policy
        self.max_hold = defaults.MAX_HOLD  # seconds a hold others wait for goes on at most
        self.lane_memory = lane_memory  # bytes of device memory a lane has, where known
        self.leases = Leases(lanes, cuda, self.end_for_protocol)
        self.handovers = handover.HandOvers()  # tails handed over gaplessly
        # Each user's recent interactive use of this device's lanes: what the lane rule's
        # people-first turns allow them (gq.exec.lane.rule), across all their interactive jobs.
        self.bursts: dict[str, lane_rule.Burst] = {}
        # Each user's fair-share usage beside their jobs resident here, as the daemon last
        # said (gq.daemon.scheduling.fair_share): what fair adds their residents' attained time to.
        self.shares: dict[str, float] = {}

    def due_in(self, now: float) -> float:
        """How soon the lanes must be looked at again with no event (gq.exec.lane.wakeups)."""
        return min(
            wakeups.due_in(self.lanes, now, self.max_hold),
            self.handovers.due_in(now, self.max_hold),
        )

    def set_policy(self, policy: Policy, max_hold: float = defaults.MAX_HOLD) -> None:
        self.policy, self.max_hold = policy, max_hold
        for lane in self.lanes:
            self.schedule(lane)

    def set_shares(self, shares: dict[str, float]) -> None:
        self.shares = shares

    def _usage(self, lane: Lane) -> dict[str, float]:
        return usage_beside(self.lanes, lane, self.shares)

    def cap(self, resident: Resident, mem_cap: int) -> None:
        """Its allocator is held to ``mem_cap`` from its next Go (a lease is asked back)."""
        resident.mem_cap = mem_cap
        resident.cap_unsent = resident.channel is not None
        if resident.standing is Standing.LEASED:
            self.leases.recall(resident)
            self.schedule(self.lanes[resident.lane])

    def suspend(self, resident: Resident, suspended: bool, freeze: bool = True) -> None:
        """Suspend the job (frozen, the lane to others; one inside an iteration goes on once
        granted again; not ``freeze``: granted nothing, frozen later), or resume it."""
        now = time.monotonic()
        lane = self.lanes[resident.lane]
        if resident.standing is Standing.LEASED:  # inside an iteration or not decides
            self.leases.recall(resident)
        if suspended:
            resident.suspended, resident.suspended_at = True, now
            if freeze and resident.standing in (Standing.HOLDING, Standing.RECALLED):
                self.stop_inside(resident, now)
            if freeze and not resident.frozen and resident.kill_deadline is None:  # (its
                self.host.freeze(resident, True)  # page may have ended it, read as it stopped)
            log.info("job %d suspended", resident.job_id)
        else:
            resident.suspended = False
            resident.paused += now - (resident.suspended_at or now)
            resident.suspended_at = None
            if resident.standing is not Standing.STOPPED:
                self.host.freeze(resident, False)
            log.info("job %d resumed", resident.job_id)
        resident.dirty = True
        self.schedule(lane)

    # ----- worker messages: the hot path ----------------------------------------------
    def from_worker(self, resident: Resident) -> None:
        channel = resident.channel
        assert channel is not None
        for message in channel.receive():
            now = time.monotonic()
            kind = type(message)
            if kind is wire.Ready:
                self._on_ready(resident, now)
            elif kind is wire.Done:
                self._on_done(resident, message, now)
            elif kind is wire.Drained:
                if (drained := self.handovers.drained(resident, now)) is not None:
                    self.schedule(self.lanes[drained])
            elif kind is wire.Total:
                resident.declare_total(message.steps)
            elif kind is wire.StepsTaken:
                resident.record_steps(message.steps)
            elif kind is wire.OutOfMemory:
                resident.shortage = Shortage(message.held, message.wanted)
            elif kind is wire.Finished:
                self.leave_lane(resident)
            if resident.channel is not channel:
                return  # dropped meanwhile (its grant could not be sent, say)
        if channel.error:
            self.end_for_protocol(resident, f"its worker sent {channel.error}")
        elif channel.closed:
            self.drop_channel(resident)

    def end_for_protocol(self, resident: Resident, detail: str) -> None:
        """A worker that breaks the protocol loses its job, at once, and nothing else."""
        log.warning("job %d: %s; ending it", resident.job_id, detail)
        resident.detail = printable(detail)[: defaults.MAX_TEXT]
        self.drop_channel(resident)
        self.host.kill(resident, StopWhy.PROTOCOL, grace=0.0)

    def _on_ready(self, resident: Resident, now: float) -> None:
        """The job is between iterations and wants the lane: where the host thinks it holds
        it (a lease not taken up, a grant never said Done to), its hold ends, billed, untimed
        (an iteration handed over whose Drained never came: billed until now)."""
        self.handovers.settle(resident, now)
        if resident.standing is Standing.LEASED:
            self.leases.recall(resident, between=True)
        elif resident.standing is Standing.RECALLED:  # asked back: it let the lock go first
            self.leases.take_back(resident, between=True)
        if resident.standing is Standing.HOLDING and resident.channel is not None:
            resident.end_iteration(max(0.0, now - resident.granted_at))
            move(resident, Event.RELEASE)
            self.lanes[resident.lane].holder = None
            resident.released_at = now
        if resident.channel is None:
            return  # ended meanwhile (its page, read as the lease ended, was impossible)
        if resident.startup is None:  # its first acquire: its start-up is over
            resident.startup = max(0.0, now - resident.started_at - resident.paused)
            resident.dirty = True
        lane = self.lanes[resident.lane]
        if resident.standing is Standing.STOPPED:  # its iteration ended as it was stopped
            resident.end_iteration(0.0)  # (billed when it was)
            move(resident, Event.ASK)
            self.schedule(lane)
            return
        if resident.standing is not Standing.IDLE:
            move(resident, Event.ASK)  # nothing changes: it asked already, or is
            return  # recalled inside an iteration while saying it is not (its own loss)
        if resident not in lane.residents:  # a thread of a script said to be finished
            lane.residents.append(resident)
        if resident.released_at is not None:
            resident.gaps.add(now - resident.released_at)
        resident.asks_for_iteration()
        move(resident, Event.ASK)
        self.schedule(lane)

    def _on_done(self, resident: Resident, message: wire.Done, now: float) -> None:
        lane = self.lanes[resident.lane]
        standing = resident.standing
        if standing in (Standing.RECALLED, Standing.LEASED):  # it gave the lane back
            self.leases.end(resident, now, Event.RELEASE)
            self.handovers.lease_released(resident, message.event, now)
            resident.record_steps(message.steps)
            self.schedule(lane)
            return
        if standing is Standing.STOPPED:  # its iteration ended as it was being stopped
            move(resident, Event.RELEASE)
            resident.end_iteration(0.0, message.steps)  # (billed when it was)
            resident.released_at = now
            if not resident.suspended:
                self.host.freeze(resident, False)
            return
        if standing is not Standing.HOLDING:
            move(resident, Event.RELEASE)  # a Done already counted, or never owed
            return
        if not self.handovers.released(resident, message.event, message.steps, now):
            resident.end_iteration(max(0.0, now - resident.granted_at), message.steps)
            resident.released_at = now
        resident.mem_persistent = message.mem_persistent
        resident.mem_peak = message.mem_peak
        resident.dirty = True
        move(resident, Event.RELEASE)
        lane.holder = None
        self._check_memory(resident)
        self.schedule(lane)

    def _check_memory(self, resident: Resident) -> None:
        """After an iteration: a job over its memory cap where no cgroup holds it has run
        out of memory, and is ended before its neighbours pay for it; a probed job's first
        figures go to the daemon at once."""
        if lane_memory.over_cap(resident, self.cuda):
            log.warning(
                "job %d: holds %d bytes, over its cap of %d; ending it",
                resident.job_id,
                resident.mem_peak,
                resident.mem_cap,
            )
            resident.shortage = Shortage(held=resident.mem_peak or 0)
            self.host.kill(resident, StopWhy.MEMORY, grace=0.0)
        elif resident.probing and resident.iterations >= defaults.PROBE_ITERATIONS:
            resident.probing = False
            self.host.report_soon()

    def schedule(self, lane: Lane) -> None:
        """Grant a free lane's next iteration, or keep it free, as :mod:`gq.exec.lane.rule`
        decides; a lease is asked back as soon as another job is ready that could take it."""
        lane.kept_until = None
        ready = ready_to_grant(lane)
        holder = lane.holder
        if holder is not None:
            if ready and holder.standing is Standing.LEASED and not self._may_lease(holder):
                self.leases.recall(holder)
            elif holder.standing is Standing.LEASED:
                self.leases.pace(lane, holder, takes_turns(self.policy, lane, time.monotonic()))
            if lane.holder is not None and not self._bound_hold(lane, lane.holder, ready):
                return
            ready = ready_to_grant(lane)  # the job whose lane was taken among them
        lane.turns.free(time.monotonic())
        if not ready:
            return
        decision = decide(
            self.policy, lane, ready, self.bursts, self._usage(lane), time.monotonic()
        )
        if isinstance(decision, lane_rule.KeepFor):
            lane.kept_until = decision.until
            return
        if decision is None:
            return
        chosen = self.residents[decision.job.id]
        if chosen.channel is None:
            return
        lease = 0
        now = time.monotonic()  # before the Go: the job may use the lane from its send on
        wait, after = self.handovers.for_grant(
            lane.index, chosen, now, self.max_hold, chosen.standing is not Standing.STOPPED
        )
        if wait:
            return  # another user's job: once the last holder's tail has drained
        if chosen.frozen:  # stopped inside its iteration (or just after): goes on
            self.host.freeze(chosen, False)
        lane.turns.granted(decision.turn, now, self.max_hold, chosen.mean_iteration)
        if chosen.standing is not Standing.STOPPED:
            run = lane.turns.left(now)  # (a person's run of turns: leased for that long)
            lease = self.leases.offer(
                lane,
                chosen,
                lambda gaps: self._may_lease(chosen, True, gaps),
                takes_turns(self.policy, lane, now),
                now + run if run else None,
            )
            if chosen.channel.send(
                wire.Go(
                    empty_cache=lane_memory.short_of_memory(lane, self.cuda, self.lane_memory),
                    mem_cap=chosen.mem_cap if chosen.cap_unsent else None,
                    lease=lease,
                    hand_over=self.handovers.offer(lane, chosen),
                    after=after,
                )
            ):
                chosen.cap_unsent = False
            else:
                log.warning(
                    "job %d's worker hung up before its grant; the lane goes on", chosen.job_id
                )
                self.drop_channel(chosen)  # its exit is reaped and reported as usual
                return
        move(chosen, Event.LEASE if lease else Event.GRANT)
        self._hold(lane, chosen, now)
        if lease:
            chosen.lease, chosen.lease_started = lease, chosen.granted_at

    def _may_lease(self, holder: Resident, starting: bool = False, gaps: bool = False) -> bool:
        """Whether ``holder``'s lease goes on (``starting``: is offered) beside the jobs
        ready for its lane (``gaps``: and those in their gaps): none of them could take it,
        or it has a slice left of a lease they alternate with it by (rule.sliced), or time
        left to the person's run of turns it is (rule.PeopleTurns)."""
        lane, now = self.lanes[holder.lane], time.monotonic()
        left = starting or now - holder.lease_started < defaults.LEASE_SLICE
        usage, turn = self._usage(lane), lane.turns.left(now) > 0
        return undisputed(self.policy, lane, holder, self.bursts, usage, now, left, gaps, turn)

    def _hold(self, lane: Lane, chosen: Resident, now: float) -> None:
        chosen.granted_at = now
        chosen.dirty = True  # the daemon hears of the grant with the next progress
        chosen.count_steps()  # (the iteration it is granted may count)
        lane.holder, lane.contended_since = chosen, None
        if lane.last_job not in (None, chosen.job_id):
            lane.switches += 1
        lane.last_job = chosen.job_id

    # ----- bounded holds -------------------------------------------------------------
    def _bound_hold(self, lane: Lane, holder: Resident, ready: list[Resident]) -> bool:
        """Whether the lane was taken from its holder: held ``max_hold`` past the moment a job
        began to wait that the rule would grant first (frozen inside its iteration)."""
        if not ready or holder.standing not in (Standing.HOLDING, Standing.RECALLED):
            lane.contended_since = None
            return False
        now = time.monotonic()
        if not overstays(self.policy, lane, holder, ready, self.bursts, self._usage(lane), now):
            lane.contended_since = None
            return False
        if lane.contended_since is None:
            lane.contended_since = now
        held = now - lane.contended_since
        # One being ended keeps running (its SIGTERM must be seen): it loses the lane alone.
        if held < self.max_hold or not self.stop_inside(holder, now, holder.kill_deadline is None):
            return False
        holder.taken += 1
        log.info(
            "job %d held its lane %.2f s while another job waited; frozen inside its "
            "iteration, the lane to the next (taken %d times)",
            holder.job_id,
            held,
            holder.taken,
        )
        return lane.holder is None

    def stop_inside(self, resident: Resident, now: float, freeze: bool = True) -> bool:
        """Freeze a holder inside its iteration (``freeze``) and free its lane, billed until
        now; False where its page, read to close its lease, ended the job instead."""
        if resident.standing is Standing.RECALLED:
            if not self.leases.read_page(resident):  # the lease's iterations so far
                return False
            resident.sliced += max(0.0, now - resident.recalled_at)
        else:
            resident.sliced += max(0.0, now - resident.granted_at)
        bill(resident, now)
        move(resident, Event.STOP)
        resident.lease = 0
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            lane.holder, lane.contended_since = None, None
        if freeze:
            self.host.freeze(resident, True)
        resident.dirty = True
        return True

    # ----- leases (gq.exec.lane.leasing) -----------------------------------------------------
    def close_given_back(self) -> None:
        for lane in self.leases.given_back(list(self.residents.values())):
            self.schedule(self.lanes[lane])

    def read_leased_pages(self) -> None:
        self.leases.read_pages(list(self.residents.values()))

    # ----- a job leaving its lane -------------------------------------------------------
    def schedule_waiting_lanes(self) -> None:
        for lane in self.lanes:
            self.schedule(lane)

    def drop_channel(self, resident: Resident) -> None:
        if resident.channel is None:
            return
        if resident.channel.sock in self.selector.get_map():
            self.selector.unregister(resident.channel.sock)
        resident.channel.close()
        resident.channel = None
        self.handovers.forget(resident, time.monotonic())
        self._release_lane(resident)
        if resident.page is not None:
            resident.page.close()
            resident.page = None

    def leave_lane(self, resident: Resident) -> None:
        """The job will run no more iterations: policies stop counting it as resident."""
        lane = self.lanes[resident.lane]
        if resident in lane.residents:
            lane.residents.remove(resident)
            self._release_lane(resident)

    def _release_lane(self, resident: Resident) -> None:
        now = time.monotonic()
        if resident.standing in HOLDS_LANE:
            bill(resident, now)
            page = resident.page
            if resident.standing is not Standing.HOLDING and page is not None:
                page.offer(0)  # a thread of the job that runs on must not take the lane
                page.try_take()
                self.leases.read_page(resident)  # what its page says of its lease, if readable
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            lane.holder = None
        if resident.frozen and not resident.suspended:  # stopped inside its last iteration
            self.host.freeze(resident, False)
        move(resident, Event.LEAVE)
        self.schedule(lane)
