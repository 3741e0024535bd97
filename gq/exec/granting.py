"""Who gets each lane's next iteration, and how it gets there: the host's side of the lanes.

The execution host (:mod:`gq.exec.host`) owns the jobs' processes and the daemon's link;
this owns what happens at iteration boundaries, the hot path: the workers' READY and DONE,
the grant each free lane gets as :mod:`gq.exec.lanes` decides (the simulator predicts with
the same rule), and the three ways a grant is made cheaper than a READY/GO exchange:

- a **hand-over** armed while a job holds the lane: the job that follows it is woken by the
  holder itself (:mod:`gq.exec.handover`);
- a **lease** for a job alone on its lane: it crosses boundaries on its page, without a
  message, until another job is ready (:mod:`gq.exec.lease`);
- a **loan** of the lane to two jobs that fit in each other's gaps: a lease each, under one
  token, until either asks or anything changes.

Every figure a worker writes on its page is checked before it is taken in; a worker whose
page or messages break the rules loses its job, and nothing else. What it needs of the host
(ending a job, freezing one, sending progress early) is :class:`Processes`.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import time
from typing import Protocol

from gq import defaults
from gq.exec import handover
from gq.exec import lanes as lane_rule
from gq.exec import protocol as wire
from gq.exec.lease import Figures, LoanPage, SharedPage, implausible
from gq.exec.protocol import StopWhy
from gq.exec.residents import Lane, LaneState, Loan, Resident, ready_to_grant
from gq.policies.base import JobView, Policy

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

    def __init__(self, lanes: list[Lane], residents: dict[int, Resident],
                 selector: selectors.BaseSelector, host: Processes, cuda: bool,
                 policy: Policy):
        self.lanes = lanes
        self.residents = residents
        self.selector = selector  # a deferred successor's socket is taken off it a while
        self.host = host
        self.cuda = cuda
        self.policy = policy
        self._handovers_armed = 0  # numbers the hand-overs' pipes
        self._loans_made = 0  # numbers the loans

    def due_in(self, now: float) -> float:
        """How soon the lanes must be looked at again with no event (math.inf: not before
        one): a free lane a ready job waits for is kept for a job in its gap until then, or
        is free because the policy picks no one now, which it is asked again soon."""
        due = math.inf
        for lane in self.lanes:
            if lane.holder is not None or not ready_to_grant(lane):
                continue
            if lane.kept_until is not None:
                due = min(due, max(0.0, lane.kept_until - now))
            else:
                due = min(due, 0.01)
        return due

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy
        for lane in self.lanes:
            self.schedule(lane)

    def cap(self, resident: Resident, mem_cap: int) -> None:
        """The job's allocator is held to ``mem_cap`` from its next grant, which a Go
        brings: not a hand-over, nor a lease."""
        resident.mem_cap = mem_cap
        resident.cap_unsent = resident.channel is not None
        if self._armed_to_follow(resident):
            self._revoke(self.lanes[resident.lane])
        if resident.leased:  # the next boundary asks for a grant
            self._end_lease(resident)
            self.schedule(self.lanes[resident.lane])

    def suspend(self, resident: Resident, suspended: bool) -> None:
        """Suspend the job (its processes frozen, the lane to others; inside an iteration,
        it goes on with it once granted the lane again), or resume it."""
        now = time.monotonic()
        lane = self.lanes[resident.lane]
        if suspended and self._armed_to_follow(resident) and not self._revoke(lane):
            # It runs on its grant before its predecessor's DONE: suspended inside an
            # iteration, it goes on with it once granted the lane again.
            resident.thaw_on_grant = True
        if resident.leased:  # whether it is inside an iteration decides what follows
            self._end_lease(resident)
        if suspended:
            resident.closing = False  # an iteration it is inside is measured by the host now
            resident.suspended, resident.suspended_at = True, now
            # Inside an iteration (the holder, or a loan's job found inside one beside it):
            # the lane goes to others.
            if lane.holder is resident or resident.state is LaneState.RUNNING:
                resident.attained += max(0.0, now - resident.granted_at)
                if lane.holder is resident:
                    lane.holder = None
                resident.state, resident.thaw_on_grant = LaneState.READY, True
            self.host.freeze(resident, True)
            log.info("job %d suspended", resident.job_id)
        else:
            resident.suspended = False
            resident.paused += now - (resident.suspended_at or now)
            resident.suspended_at = None
            if not resident.thaw_on_grant:
                self.host.freeze(resident, False)
            log.info("job %d resumed", resident.job_id)
        resident.dirty = True
        self.schedule(lane)

    # ----- worker messages: the hot path ----------------------------------------------
    def from_worker(self, resident: Resident) -> None:
        channel = resident.channel
        assert channel is not None
        if self._armed_to_follow(resident) and not self._revoke(self.lanes[resident.lane]):
            self._defer(resident)
            return
        for message in channel.receive():
            now = time.monotonic()
            kind = type(message)
            if kind is wire.Ready:
                self._on_ready(resident, now)
            elif kind is wire.Done:
                self._on_done(resident, message, now)
            elif kind is wire.Total:
                resident.declare_total(message.steps)
            elif kind is wire.StepsTaken:
                resident.record_steps(message.steps)
            elif kind is wire.OutOfMemory:
                resident.shortage = wire.Shortage(message.held, message.wanted)
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
        resident.detail = detail[:defaults.MAX_TEXT]
        self.drop_channel(resident)
        self.host.kill(resident, StopWhy.PROTOCOL, grace=0.0)

    def _on_ready(self, resident: Resident, now: float) -> None:
        resident.unbooked = False  # (its iteration outside its grants is over)
        if resident.leased:  # it saw the host wants the lane back, in its gap
            self._end_lease(resident)
        if resident.closing:  # it missed the request at its iteration's end: that end first
            self._close_iteration(resident, ended=True)
        elif (resident.state is LaneState.RUNNING and resident.page is not None
              and resident.page.wanted() and self.lanes[resident.lane].holder is resident):
            # The same, where a suspend took over the measuring of that iteration.
            self._on_done(resident, wire.Done(resident.steps_done, resident.mem_persistent,
                                              resident.mem_peak), now)
        if resident.channel is None or resident.state is not LaneState.IDLE:
            return  # ended meanwhile, holds the lane already, or asked already
        if resident.released_at is not None:
            resident.gaps += 1
            resident.gap_total += max(0.0, now - resident.released_at)
        resident.asks_for_iteration()
        resident.state = LaneState.READY
        self.schedule(self.lanes[resident.lane])

    def _on_done(self, resident: Resident, message: wire.Done, now: float) -> None:
        lane = self.lanes[resident.lane]
        if resident.leased:  # asked back, it gave the lane at its iteration's end
            self._end_lease(resident)
            if lane.holder is not resident:
                self.schedule(lane)
                return
        if resident.closing:
            self._close_iteration(resident, ended=True)
            return
        if resident.thaw_on_grant:  # its iteration ended as it was being suspended
            resident.thaw_on_grant = False
            resident.iterations += 1
            resident.record_steps(message.steps)
            resident.state, resident.released_at = LaneState.IDLE, now
            if not resident.suspended:
                self.host.freeze(resident, False)
            return
        if lane.holder is not resident:
            return
        resident.iterations += 1
        resident.attained += max(0.0, now - resident.granted_at)
        if resident.iterations == 1:
            resident.first_iteration = resident.attained
        resident.record_steps(message.steps)
        resident.mem_persistent = message.mem_persistent
        resident.mem_peak = message.mem_peak
        resident.dirty = True
        self._check_memory(resident)
        resident.state = LaneState.IDLE
        resident.released_at = now
        lane.holder = None
        self.schedule(lane)

    def _check_memory(self, resident: Resident) -> None:
        """After an iteration: a job over its memory cap where no cgroup holds it (the cpu
        and emulated devices without one) has run out of memory, and is ended before its
        neighbours pay for it; a probed job's first figures go to the daemon at once."""
        peak = resident.mem_peak
        if peak is None:
            return
        if (resident.mem_cap is not None and not self.cuda and resident.cgroup_cap is None
                and peak > resident.mem_cap):
            log.warning("job %d: holds %d bytes, over its cap of %d; ending it",
                        resident.job_id, peak, resident.mem_cap)
            resident.shortage = wire.Shortage(held=peak)
            self.host.kill(resident, StopWhy.MEMORY, grace=0.0)
        elif resident.probing and resident.iterations >= defaults.PROBE_ITERATIONS:
            resident.probing = False
            self.host.report_soon()

    def schedule(self, lane: Lane) -> None:
        """Grant a free lane's next iteration, or keep it free, as :mod:`gq.exec.lanes`
        decides (the simulator predicts with the same rule). A job alone on its lane gets
        it with a lease, ended as soon as another job is ready for it; two jobs that fit in
        each other's gaps get it lent (a lease each, under one loan), until either asks or
        anything changes. While a job holds the lane, the job it goes to next is told in
        advance (a hand-over)."""
        lane.kept_until = None
        loan = lane.loan
        if loan is not None:
            if loan.recalling:
                return
            if not self._loan_stands(lane, loan) and lane.loan is loan:
                self._recall(lane)
            if lane.loan is not None:
                return
        if lane.holder is None and any(r.closing and r.state is LaneState.RUNNING
                                       for r in lane.residents):
            return  # both of a loan's jobs were inside an iteration (its token given twice)
        holder = lane.holder
        if holder is not None and not holder.leased:
            self._prepare_handover(lane, holder)
            return
        ready = ready_to_grant(lane)
        if holder is not None and ready:
            self._end_lease(holder)
        if lane.holder is not None:
            return
        if lane.armed is not None and self._settle(lane):
            return  # the holder's successor has the lane, as armed
        if not ready:
            return
        decision = self._decide(lane, ready, time.monotonic())
        if isinstance(decision, lane_rule.KeepFor):
            lane.kept_until = decision.until
            return
        if decision is None:
            return
        chosen = self.residents[decision.job.id]
        if chosen.channel is None:
            return
        shared = self.cuda and len(lane.residents) > 1
        if chosen.thaw_on_grant:  # resumed inside its iteration: it goes on with the lane
            chosen.thaw_on_grant = False
            self.host.freeze(chosen, False)
        elif chosen.channel.send(wire.Go(
                empty_cache=shared, mem_cap=chosen.mem_cap if chosen.cap_unsent else None,
                lease=self._lease(chosen) or self._lend(lane, chosen))):
            chosen.cap_unsent = False
        else:
            log.warning("job %d's worker hung up before its grant; the lane goes on",
                        chosen.job_id)
            self.drop_channel(chosen)  # its exit is reaped and reported as usual
            return
        self._granted(lane, chosen)
        if not chosen.leased:  # another job waits: who follows it, ahead
            self._prepare_handover(lane, chosen)

    def _decide(self, lane: Lane, ready: list[Resident],
                now: float) -> lane_rule.Grant | lane_rule.KeepFor | None:
        views, in_gaps = self._lane_views(lane)
        return lane_rule.next_step(self.policy, [views[r.job_id] for r in ready],
                                   list(views.values()), in_gaps, now)

    def _lane_views(self, lane: Lane) -> tuple[dict[int, JobView], list[lane_rule.Awaited]]:
        """The residents as policies see them, each made once (a suspended job counts for
        none), and those in their gaps the lane may be kept for."""
        views = {r.job_id: r.view() for r in lane.residents if not r.suspended}
        in_gaps = [awaited for r in lane.residents
                   if r.state is LaneState.IDLE and not r.suspended and r.released_at is not None
                   and (awaited := lane_rule.awaited(views[r.job_id], r.released_at,
                                                     r.mean_gap))]
        return views, in_gaps

    def _granted(self, lane: Lane, chosen: Resident) -> None:
        chosen.state = LaneState.RUNNING
        chosen.granted_at = time.monotonic()
        chosen.handover_messages = 0
        chosen.dirty = True  # the daemon hears of the grant with the next progress
        lane.holder = None if lane.loan is not None else chosen  # lent: the token says
        if lane.last_job not in (None, chosen.job_id):
            lane.switches += 1
        lane.last_job = chosen.job_id

    # ----- hand-overs (gq.exec.handover) ----------------------------------------------
    def _prepare_handover(self, lane: Lane, holder: Resident) -> None:
        """While ``holder`` is inside an iteration: arm a hand-over to the job the lane
        goes to at its release however long the iteration lasts (from some point on: a
        release before it goes through the host), or take back one armed for a job the lane
        would no longer go to, or not from the point armed."""
        successor, after = None, 0.0
        ready = ready_to_grant(lane)
        if (ready and holder.page is not None and holder.channel is not None
                and not holder.closing and not holder.suspended):
            views, in_gaps = self._lane_views(lane)
            held = views.pop(holder.job_id)
            armed = lane.armed
            follows = lane_rule.hand_over(
                self.policy, [views[r.job_id] for r in ready], list(views.values()), in_gaps,
                held, holder.granted_at, time.monotonic(),
                None if armed is None else (armed.successor, armed.after))
            if follows is not None:
                successor, after = self.residents[follows.job.id], follows.after
        if successor is not None and (successor.page is None or successor.channel is None
                                      or successor.thaw_on_grant or successor.cap_unsent):
            successor = None  # its grant must come with a Go
        armed = lane.armed
        if armed is not None:
            if armed.successor == getattr(successor, "job_id", None) and armed.after == after:
                return  # it still holds
            if not self._revoke(lane):
                return  # too late: the lane is the successor's at the holder's release
        if successor is None:
            return
        pipe = lane.pipes.pop((holder.job_id, successor.job_id), None) \
            or self._deliver(holder, successor)
        if pipe is None:
            return
        if not handover.arm(pipe, holder.page, after):
            handover.close(pipe)
            return
        lane.armed = handover.Armed(pipe, holder.job_id, successor.job_id, after)
        # While it waits, the successor is sent the pipe for the turn after this one.
        if (successor.job_id, holder.job_id) not in lane.pipes:
            ahead = self._deliver(successor, holder)
            if ahead is not None:
                lane.pipes[successor.job_id, holder.job_id] = ahead

    def _deliver(self, holder: Resident, successor: Resident) -> handover.Pipe | None:
        """A new pipe from ``holder`` to ``successor`` (see :mod:`gq.exec.handover`), unless
        either has been sent its share of hand-over messages since its last grant."""
        if (holder.channel is None or successor.channel is None
                or max(holder.handover_messages, successor.handover_messages)
                >= defaults.HANDOVER_MESSAGES_PER_GRANT):
            return None
        holder.handover_messages += 1
        successor.handover_messages += 1
        self._handovers_armed += 1
        return handover.deliver(self._handovers_armed, holder.channel, successor.channel,
                                empty_cache=self.cuda)

    def _forget_pipes(self, lane: Lane, job_id: int) -> None:
        for pair in [pair for pair in lane.pipes if job_id in pair]:
            handover.close(lane.pipes.pop(pair))

    def _settle(self, lane: Lane) -> bool:
        """The lane's holder has released it (or gone): the armed successor has it if it
        has taken its grant already (True); else its grant is taken back and the lane is
        granted as usual (to it again, with a Go, if the policy still picks it). A grant
        taken where the holder released before the point armed from is the successor's
        only if the decision now grants it anyway: else it runs outside its grants."""
        armed = lane.armed
        assert armed is not None
        lane.armed = None
        successor = self.residents.get(armed.successor)
        usable = (successor is not None and successor.channel is not None
                  and successor in lane.residents and successor.state is LaneState.READY
                  and not successor.suspended and not successor.thaw_on_grant
                  and not successor.cap_unsent)  # else its grant comes the usual way
        kept = handover.settle(armed, self._page_of(armed.holder))
        self._undefer(armed)
        if not (kept and usable):
            return False
        holder = self.residents.get(armed.holder)
        if holder is not None and holder.released_at is not None \
                and holder.granted_at <= holder.released_at < armed.after \
                and not self._grants_now(lane, successor):
            # Its Done read before the point, and the lane is not the successor's now (one
            # of the two woke or took early): the successor runs outside its grants, booked
            # nothing, and is granted nothing before it asks again.
            log.warning("job %d's hand-over to job %d was taken before its point; the "
                        "lane is granted as usual", holder.job_id, successor.job_id)
            successor.state, successor.released_at, successor.unbooked = LaneState.IDLE, None, True
            return False
        self._granted(lane, successor)
        self._prepare_handover(lane, successor)
        return True

    def _grants_now(self, lane: Lane, job: Resident) -> bool:
        """Whether the free lane's decision now is to grant ``job``."""
        decision = self._decide(lane, ready_to_grant(lane), time.monotonic())
        return isinstance(decision, lane_rule.Grant) and decision.job.id == job.job_id

    def _revoke(self, lane: Lane) -> bool:
        """Take the armed successor's grant back (the host's pick has changed, say): True
        if taken back; False if the successor has taken it, and runs on it already (the
        lane is still its holder's until the holder's DONE, and then the successor's)."""
        armed = lane.armed
        assert armed is not None
        if not handover.take_back(armed, self._page_of(armed.holder)):
            return False
        lane.armed = None
        self._undefer(armed)
        return True

    def _armed_to_follow(self, resident: Resident) -> bool:
        armed = self.lanes[resident.lane].armed
        return armed is not None and armed.successor == resident.job_id

    def _defer(self, resident: Resident) -> None:
        """The successor runs on its grant, and speaks, before the host has heard its
        predecessor release the lane: what it says is read once the hand-over is settled
        (its predecessor's DONE, most often already sent: read that first)."""
        lane = self.lanes[resident.lane]
        holder = lane.holder
        if holder is not None and holder.channel is not None:
            self.from_worker(holder)
            if lane.armed is None or lane.armed.successor != resident.job_id:
                return  # settled: its socket polls readable again
        armed = lane.armed
        if armed is not None and not armed.deferred and resident.channel is not None:
            self.selector.unregister(resident.channel.sock)
            armed.deferred = True

    def _undefer(self, armed: handover.Armed) -> None:
        successor = self.residents.get(armed.successor)
        if armed.deferred and successor is not None and successor.channel is not None:
            self.selector.register(successor.channel.sock, selectors.EVENT_READ, successor)
        armed.deferred = False

    def _page_of(self, job_id: int) -> SharedPage | None:
        resident = self.residents.get(job_id)
        return None if resident is None else resident.page

    def _lease(self, resident: Resident) -> bool:
        """Whether the job's next grant is a lease, and if so the page made ready for it. A
        lease of its own is for a job alone on its lane: lane-mates that take turns would
        end each other's at every switch (two may be lent the lane instead: _lend)."""
        page = resident.page
        alone = all(other is resident or other.suspended or other.channel is None
                    for other in self.lanes[resident.lane].residents)
        if page is None or not alone or not self._leasable(resident):
            return False
        figures = page.read()
        if figures is None:
            return False
        self._begin_lease(resident, figures, 0, time.monotonic(), inside=True)
        return True

    @staticmethod
    def _begin_lease(resident: Resident, figures: Figures, loan: int, started: float,
                     inside: bool) -> None:
        """Make the job's page ready for a lease under ``loan`` (0: one of its own), begun
        at ``started`` with the job's page as ``figures``: its semaphore the host's (the
        grantee's, ``inside`` an iteration), or given, where the job is in its gap, once
        the loan is named (a job that takes it reads the loan after); nothing wanted."""
        page = resident.page
        assert page is not None
        page.drain()
        page.lend(loan)
        page.want(False)
        if not inside:
            page.give()
        resident.leased, resident.lease_started = True, started
        resident.lease_base = resident.page_seen = figures
        resident.lease_in_iteration, resident.page_unread = inside, None

    def _leasable(self, resident: Resident) -> bool:
        """Whether the job may cross boundaries without a message: not where the host
        checks its figures at every boundary."""
        return (resident.page is not None and not resident.probing
                and not resident.cap_unsent
                and not (resident.mem_cap is not None and not self.cuda
                         and resident.cgroup_cap is None))

    # ----- a lane lent to two jobs (gq.exec.lease) ---------------------------------------
    def _lend(self, lane: Lane, chosen: Resident) -> bool:
        """Whether the chosen job's grant starts a loan: the lane lent to it and its one
        lane-mate, in its gap, where they meet none of the policy's choices
        (:func:`gq.exec.lanes.lendable`). Both are sent the loan's page; the grantee holds
        its token, and the mate is offered its lease on its page and takes it up at its
        next acquire."""
        live = [r for r in lane.residents if not r.suspended and r.channel is not None]
        if len(live) != 2 or not any(r is chosen for r in live):
            return False
        mate = live[0] if live[1] is chosen else live[1]
        members = (chosen, mate)
        if (mate.state is not LaneState.IDLE or mate.unbooked or mate.closing or mate.leased
                or mate.thaw_on_grant
                or lane.unlendable == {chosen.job_id, mate.job_id}
                or not all(self._leasable(m) for m in members)
                # a job whose socket the host's messages fill up is sent no more
                or max(m.handover_messages for m in members)
                >= defaults.HANDOVER_MESSAGES_PER_GRANT
                or not lane_rule.lendable(self.policy, chosen.view(), mate.view())):
            return False
        figures = [m.page.read() for m in members]
        if None in figures:
            return False
        try:
            tokens, fd = LoanPage.create()
        except OSError as exc:
            log.warning("lane %d: no page for a loan (%s); its jobs take turns through the "
                        "host", lane.index, exc)
            return False
        # A number is never used twice: a job sent a loan's page it was never lent under
        # keeps it, and must not take that page's token for a later loan's.
        self._loans_made = number = self._loans_made + 1
        try:
            sent = all(m.channel.send_with_descriptors(wire.Lent(number), [fd])
                       for m in members)
        finally:
            os.close(fd)
        if not sent:
            tokens.close()
            return False
        now = time.monotonic()
        for member, seen, inside in zip(members, figures, (True, False)):
            member.handover_messages += 1
            self._begin_lease(member, seen, number,
                              now if inside else _offered_from(member, seen, now), inside)
        mate.state = LaneState.RUNNING  # its page says when it is inside an iteration
        lane.loan = Loan(number, tokens, members, (chosen.iterations, mate.iterations))
        return True

    def _loan_stands(self, lane: Lane, loan: Loan) -> bool:
        """Whether the loan goes on: no job waits for the lane, both jobs still may hold it
        (their pages read and checked now), the policy still would not choose between them,
        and the token is kept by the rules."""
        if ready_to_grant(lane):
            return False
        for member in loan.members:
            if (not member.leased or member.channel is None or member.suspended
                    or member.closing or not self._leasable(member)
                    or not any(r is member for r in lane.residents)):
                return False
            if not self._read_page(member) or lane.loan is not loan:
                return False
        self._count_switches(lane, loan)
        return (lane_rule.lendable(self.policy, *(m.view() for m in loan.members))
                and self._token_kept(lane, loan))

    def _token_kept(self, lane: Lane, loan: Loan) -> bool:
        """Whether the loan's token is as the rules keep it: given no more often than taken,
        and held only by a job inside an iteration (for a moment as it begins one, for
        LOAN_SILENT_LIMIT at most). Else one of the two broke the rules, and neither is
        lent the lane with the other again."""
        now = time.monotonic()
        count = loan.page.count()
        own = [m.page.count() for m in loan.members if m.page is not None]
        if count > 1:
            problem = "given back more often than taken"
        elif count < 0 or not all(0 <= c <= 1 for c in own):
            problem = "written over"  # a semaphore's count no sem_post could make
        elif count == 0 and own and min(own) > 0:
            if loan.silent_since is None or now - loan.silent_since < \
                    defaults.LOAN_SILENT_LIMIT:
                loan.silent_since = loan.silent_since or now
                return True
            problem = "held outside any iteration"
        else:
            loan.silent_since = None
            return True
        first, second = sorted(m.job_id for m in loan.members)
        if lane.unlendable != {first, second}:  # (seen once, said once)
            log.warning("lane %d: its token was %s; jobs %d and %d take turns through the "
                        "host from now on", lane.index, problem, first, second)
            lane.unlendable = frozenset((first, second))
        return False

    def _count_switches(self, lane: Lane, loan: Loan) -> None:
        """Switches under a loan, as many as the two jobs' iterations since last counted
        allow (exact where they alternate): no grant says who followed whom."""
        first, second = loan.members
        done = (first.iterations, second.iterations)
        lane.switches += 2 * min(done[0] - loan.counted[0], done[1] - loan.counted[1])
        loan.counted = done

    def _recall(self, lane: Lane) -> None:
        """End the loan: each job's lease ends as a lone lease would (taken back in its
        gap, or at its iteration's end, then the lane's holder until its Done)."""
        loan = lane.loan
        assert loan is not None
        loan.recalling = True
        self._token_kept(lane, loan)  # however the loan ends, a misdeed on it is seen
        try:
            for member in loan.members:
                if member.leased:
                    self._take_lease_back(member)
            self._count_switches(lane, loan)
        finally:  # whatever failed, the lane is granted again, and no lease outlives it
            for member in loan.members:
                if member.leased:
                    if member.page is not None:
                        member.page.want(True)
                    member.leased, member.closing = False, True  # its page says when it is out
            lane.loan, lane.last_job = None, None  # who iterated last under it is unknown
            loan.page.close()

    def _end_lease(self, resident: Resident) -> None:
        """The host wants the lane back: the job's lease ends, and under a loan the
        other's too."""
        loan = self.lanes[resident.lane].loan
        if loan is not None and not loan.recalling and any(m is resident
                                                              for m in loan.members):
            self._recall(self.lanes[resident.lane])
        elif resident.leased:
            self._take_lease_back(resident)

    def _take_lease_back(self, resident: Resident) -> None:
        """The lane is taken back at once where the job is in its gap (it asks with READY
        next time); inside an iteration, the job keeps it until that iteration's end, as it
        would without a lease, and gives it back with a Done."""
        page = resident.page
        assert page is not None and resident.leased
        page.want(True)
        in_gap = page.try_take()
        # Taken in its gap, the page is final: the worker writes it before it gives the lane
        # (a worker that died may have died writing it).
        if not self._read_page(resident, final=in_gap and resident.channel is not None):
            return
        resident.leased = False
        if in_gap:
            self._released_as_on_page(resident)
        else:
            # Its Done (or, where it missed the request, its READY) ends the iteration, whose
            # figures its page will have: the host measures nothing of it again.
            resident.closing = True
            if not resident.lease_in_iteration:
                resident.granted_at = time.monotonic()  # it took the lane as the host asked
            lane = self.lanes[resident.lane]
            if lane.holder is None and resident.state is LaneState.RUNNING:
                lane.holder = resident  # a loan's job: the lane is its until that Done

    def _close_iteration(self, resident: Resident, ended: bool) -> None:
        """The iteration its lease ended in is over (``ended``: the worker said so; else it
        gave the lane back unasked, or is gone): counted off its page, final where it said so
        (the worker writes it before it gives the lane back, and gives it before it says so),
        and never as less than the host saw of it: the iteration its page said it was in when
        the lease ended, from its start to now."""
        now = time.monotonic()
        least_attained = resident.attained + max(0.0, now - resident.granted_at)
        least_iterations = resident.iterations + resident.lease_in_iteration  # its page's word
        resident.closing = False
        if not self._read_page(resident, final=ended):
            return
        resident.attained = max(resident.attained, least_attained)
        if ended:
            resident.iterations = max(resident.iterations, least_iterations)
        self._released_as_on_page(resident)
        self.schedule(self.lanes[resident.lane])

    def _released_as_on_page(self, resident: Resident) -> None:
        """The lane is free again: its holder (or a job it was lent to) released it when its
        page says it did, or, where it has not iterated under its lease, when the host saw
        it release it before."""
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            lane.holder = None
        elif resident.state is not LaneState.RUNNING:
            return
        seen, base = resident.page_seen, resident.lease_base
        if (seen.iterations, seen.gaps) != (base.iterations, base.gaps) \
                or resident.released_at is None:
            resident.released_at = resident.since_on_page(time.monotonic())
        resident.state = LaneState.IDLE

    def _read_page(self, resident: Resident, final: bool = False) -> bool:
        """Take in a leased job's figures from its page. Impossible ones end the job
        (False): its lease is over, and its lane with it. A page being written is read next
        time, unless it must be ``final`` now or has been written to for too long."""
        if resident.page is None:
            return True
        figures = resident.page.read()
        now = time.monotonic()
        if figures is None:
            # Half-written: read next time, unless it must be final now or the same write
            # has been going on too long (a live writer's count moves on).
            sequence = resident.page.sequence()
            if resident.page_unread is None or resident.page_unread[0] != sequence:
                resident.page_unread = (sequence, now)
            if not final and now - resident.page_unread[1] < defaults.PAGE_UNREADABLE_SECONDS:
                return True
            problem = "its page stayed half-written"
        else:
            resident.page_unread = None
            problem = implausible(resident.page_seen, figures, resident.lease_base,
                                  int((now - resident.lease_started) * 1e9), time.monotonic_ns())
        if problem is None:
            resident.take_figures(figures, now)
            return True
        resident.leased = False
        self.end_for_protocol(resident, f"its worker wrote impossible figures on its page "
                                         f"({problem})")
        return False

    def close_given_back(self) -> None:
        """A worker that missed the host's request may give the lane back without a word
        and then run on without a boundary for long: the semaphore says it gave it."""
        for resident in list(self.residents.values()):
            if resident.closing and resident.page is not None and resident.page.try_take():
                self._close_iteration(resident, ended=False)

    def schedule_waiting_lanes(self) -> None:
        for lane in self.lanes:
            self.schedule(lane)

    def drop_channel(self, resident: Resident) -> None:
        if resident.channel is None:
            return
        if resident.channel.sock in self.selector.get_map():  # not if its reading is deferred
            self.selector.unregister(resident.channel.sock)
        resident.channel.close()
        resident.channel = None
        self._forget_pipes(self.lanes[resident.lane], resident.job_id)
        self._release_lane(resident)
        if resident.page is not None:
            resident.page.close()
            resident.page = None

    def leave_lane(self, resident: Resident) -> None:
        """The job will run no more iterations: policies stop counting it as resident."""
        lane = self.lanes[resident.lane]
        if resident in lane.residents:
            lane.residents.remove(resident)
            self._forget_pipes(lane, resident.job_id)
            self._release_lane(resident)

    def _release_lane(self, resident: Resident) -> None:
        if resident.leased:
            self._end_lease(resident)
        if resident.closing:  # what its page has of the iteration, and at least what ran
            self._close_iteration(resident, ended=False)
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            now = time.monotonic()
            resident.attained += max(0.0, now - resident.granted_at)
            lane.holder = None
        resident.state = LaneState.IDLE
        self.schedule(lane)

    def read_leased_pages(self) -> None:
        for resident in list(self.residents.values()):
            if resident.leased:
                self._read_page(resident)


def _offered_from(mate: Resident, seen: Figures, now: float) -> float:
    """When the lease a loan offers a job in its gap begins: at its release, as its page
    says (its worker wrote it before its Done, which the host may have read late), within
    LOAN_OFFER_REACH of the release the host saw."""
    host_saw = min(now, mate.released_at or now)
    return min(host_saw, max(seen.since_ns / 1e9, host_saw - defaults.LOAN_OFFER_REACH))
