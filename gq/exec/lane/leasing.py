"""The host's books on leases (:mod:`gq.exec.lane.lease` is the page each is kept on): which
job may be offered one and its number, asking it back, ending it and billing its wall
time, and taking in the figures its worker writes on its page. The granter
(:mod:`gq.exec.lane.granting`) decides when; this does the lease's part of each move.

Also the two steps every hold of a lane takes, a grant's as a lease's, kept here once for
both: a move between standings (through :func:`gq.exec.lane.standings.step`, the one table of
what may follow what), and billing the lane time held, as the host saw it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gq import defaults
from gq.exec.lane.lease import implausible
from gq.exec.lane.residents import Lane, Resident
from gq.exec.lane.standings import WANTS_LANE, Event, Standing, step


def move(resident: Resident, event: Event) -> None:
    resident.standing = step(resident.standing, event)


def bill(resident: Resident, now: float) -> None:
    """The lane time it held since its grant (or its lease began), as the host saw it."""
    held = max(0.0, now - resident.granted_at)
    resident.attained += held
    if resident.standing in (Standing.LEASED, Standing.RECALLED):
        resident.leased += held  # (what its page's count of iterations is believed for)
    resident.granted_at = now


class Leases:
    """The leases on one device's lanes (``lanes``: the granter's own list); a job whose
    page says the impossible is ended through ``end_for_protocol``, the granter's."""

    def __init__(
        self, lanes: list[Lane], cuda: bool, end_for_protocol: Callable[[Resident, str], None]
    ):
        self.lanes = lanes
        self.cuda = cuda
        self.end_for_protocol = end_for_protocol
        self.made = 0  # numbers the leases (a page's word: never 0)

    def leasable(self, resident: Resident) -> bool:
        """Whether the job may cross boundaries without a message: not where the host
        checks its figures at every boundary, nor while a Go must bring it something."""
        return (
            resident.page is not None
            and resident.channel is not None
            and not resident.suspended
            and not resident.probing
            and not resident.cap_unsent
            and not (resident.mem_cap is not None and not self.cuda and resident.cgroup_cap is None)
        )

    def offer(
        self,
        lane: Lane,
        chosen: Resident,
        undisputed: Callable[[bool], bool],
        alternates: bool,
        until: float | None = None,
    ) -> int:
        """The number of the lease a Go to ``chosen`` brings, where it is alone on its lane
        (no other job there could ask for it), or the others all wait for the lane and none
        of them could take it, or, under a policy that ``alternates``, it takes turns with
        them a slice at a time, waiting or in their gaps (``undisputed(in_gaps)``, asked
        only then: gq.exec.lane.views.undisputed; the page says so; ``until``: the end of
        the person's run of turns it is, monotonic), its page written and the lock let go;
        else 0. (Otherwise one in its gap may ask for the lane as a job that could take it:
        the lease would be asked back at once.)"""
        page = chosen.page
        if page is None or not self.leasable(chosen):
            return 0
        others = [
            other
            for other in lane.residents
            if other is not chosen and other.channel is not None and not other.suspended
        ]
        if others:
            waiting = all(o.standing in WANTS_LANE for o in others)
            if not (waiting or alternates) or not undisputed(not waiting):
                return 0
        figures = page.read()
        if figures is None:
            return 0  # being written: no lease this time
        self.made += 1
        chosen.lease_base = chosen.page_seen = figures
        chosen.page_unread = None
        self.pace(lane, chosen, alternates)
        page.run_until(0 if until is None else int(until * 1e9))
        page.offer(self.made)  # the word first: the worker takes the lock after it
        page.give()
        return self.made

    def pace(self, lane: Lane, holder: Resident, alternates: bool) -> None:
        """Its page says whether jobs take turns with its lease (one still starting never
        asked; one that has left takes no turn): again whenever its lane changes."""
        if holder.page is not None:
            holder.page.pace(
                alternates
                and any(
                    other is not holder
                    and other.channel is not None
                    and not other.suspended
                    and other.startup is not None
                    for other in lane.residents
                )
            )

    def recall(self, resident: Resident, between: bool = False) -> None:
        """The host wants the lane back: taken at once where the job is in its gap; inside
        an iteration, the job keeps it until that iteration's end. ``between``: the job
        said it is between iterations (its READY), whatever its page says."""
        page = resident.page
        assert page is not None and resident.standing is Standing.LEASED
        page.offer(0)  # before the lock is tried: a job that lets it go after sees this
        move(resident, Event.RECALL)
        resident.recalled_at = time.monotonic()
        self.take_back(resident, between)

    def take_back(self, resident: Resident, between: bool = False) -> bool:
        """Whether the lease asked back is over: its lock taken where the page notes the
        lease taken up (else the Go was still on its way, or the worker's take failed: the
        iteration it grants is a plain one, which its Done ends; the lock stays taken)."""
        page = resident.page
        assert page is not None
        if not page.try_take():
            return False
        taken_up = page.read()
        if not between and (taken_up is None or taken_up.lease != resident.lease):
            # Never taken up: its iteration is a plain grant, which its Done ends.
            move(resident, Event.UNTAKEN)
            resident.lease = 0
            return False
        self.end(resident, time.monotonic(), Event.TAKEN_BACK)
        return True

    def given_back(self, residents: list[Resident]) -> list[int]:
        """The lanes of the leases asked back inside an iteration that are over, their locks
        come free, Done or not (a job that wrote its lease's word back would otherwise keep
        the lane): the granter's to grant again."""
        return [
            resident.lane
            for resident in residents
            if resident.standing is Standing.RECALLED
            and resident.page is not None
            and self.take_back(resident)
        ]

    def read_pages(self, residents: list[Resident]) -> None:
        for resident in residents:
            if resident.standing in (Standing.LEASED, Standing.RECALLED):
                self.read_page(resident)

    def end(self, resident: Resident, now: float, event: Event) -> None:
        """The lease is over, the job out of its iterations (``event``: the host took its
        lock, or it said so with a Done): billed the lease's wall time, its final page taken
        in (the worker writes it before it lets the lock go), the lock the host's again."""
        page = resident.page
        if event is Event.RELEASE and page is not None:
            # (a Done given back unasked, a statement's end, leaves the word standing: the
            # worker's next take must find it cleared)
            page.offer(0)
            page.try_take()  # (a worker that holds it still harms only its next lease)
        bill(resident, now)
        move(resident, event)
        resident.released_at, resident.lease = now, 0
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            lane.holder = None
        self.read_page(resident, final=True)

    def read_page(self, resident: Resident, final: bool = False) -> bool:
        """Take in a leased job's counts from its page. Impossible ones end the job
        (False). A page being written is read next time, unless it must be ``final`` now
        or has been written to for too long."""
        page = resident.page
        if page is None:
            return True
        figures = page.read()
        now = time.monotonic()
        if figures is None:
            # Half-written: read next time, unless it must be final now or the same write
            # has been going on too long (a live writer's count moves on).
            sequence = page.sequence()
            if resident.page_unread is None or resident.page_unread[0] != sequence:
                resident.page_unread = (sequence, now)
            if not final and now - resident.page_unread[1] < defaults.PAGE_UNREADABLE_SECONDS:
                return True
            problem: str | None = "its page stayed half-written"
        else:
            resident.page_unread = None
            problem = implausible(
                resident.page_seen,
                figures,
                resident.lease_base,
                int((now - resident.lease_started) * 1e9),
            )
        if problem is None and figures is not None:  # (figures None: a problem named)
            resident.take_figures(figures)
            return True
        self.end_for_protocol(
            resident, f"its worker wrote impossible figures on its page ({problem})"
        )
        return False
