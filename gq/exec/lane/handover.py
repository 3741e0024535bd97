"""Gapless hand-over within a lane: the next holder's device waits for the last one's tail.

A release through the host used to wait for the device before its Done (gq.exec.lane.device_sync),
so at every contended boundary the device idled while the holder's thread woke, the host
picked and granted, and the successor queued its first kernel. Where the host allows it
(its Go's ``hand_over``), the holder instead records an interprocess CUDA event after the
iteration's work and sends the Done at once with the event's handle; the host passes the
handle in the successor's Go (``after``), and the successor's stream waits on it before its
first kernel. The successor queues its work while the holder's tail runs, the device runs
one after the other with no gap between, and no kernels of the two overlap. The holder's
worker also says Drained once its device has run the tail.

Who may wait on whose event. A CUDA IPC handle lets any process on the device open the
event, so the host passes one only between processes of one user: it allows a hand-over
only where every other job on the lane is the holder's owner's (``allowed``), and forwards
a handle only to a successor of the holder's owner (``for_grant``), whatever was allowed.
Processes of one uid could ptrace each other anyway; a job that lies in its event harms only
its owner's jobs. A successor of another user (one that came to the lane during the hold) is
granted only once the holder says Drained, or ``bound`` seconds after its Done (a worker
that never says it keeps no one waiting for long). A handle is checked on decode (64 bytes
in hex, gq.fields.EventHandle): an invalid one fails its sender's job and reaches no one.

A lease hands over too. Asked back at a slice's end (gq.exec.lane.rule.sliced), its worker
sees the request at its iteration's end (or at its next acquire, its last iteration's work
still on the device) and, where its Go allowed a hand-over, sends the Done that ends the
lease at once with an event, keeping the lane's lock (gq.exec.lane.lease) until its device
has run the tail: the host, which takes the lane back on the lock alone
where no Done has come, never finds it free before the device is done. The lease is billed
until its Done, and the tail, as lease time, once it drains.

Nothing can hang on a holder that dies: its event was recorded before its Done was sent, so
the successor waits only on work already queued, which ends with the holder's context.
Billing stays the host's: a job handed over is billed from its Go to the Drained its tail
ends with (from when the lane's previous tail drained, if later: the device ran that one
first), not to its Done, which now comes before the device has run the iteration. A job
that says Drained early moves its tail's time onto the next holder, its owner's own job; one
that never says it is billed until its next READY or its end.
"""

from __future__ import annotations

from dataclasses import dataclass

from gq.exec.lane.residents import Lane, Resident


def allowed(lane: Lane, holder: Resident) -> bool:
    """Whether ``holder``'s next release may hand the lane over without waiting for its
    device: every other job on the lane is its owner's. Pure."""
    return all(other.user == holder.user for other in lane.residents if other is not holder)


@dataclass
class Tail:
    """A holder's work still on the device after its Done, as its event says."""

    holder: Resident
    lane: int
    handle: str
    granted: float  # monotonic: its Go
    since: float  # its Done
    steps: int  # what its Done said
    blocking: bool = False  # a job of another user waits for it to drain
    leased: bool = False  # a lease's last iteration: counted on its page, billed as a lease


class HandOvers:
    """Each lane's last tail not yet ordered before a successor (by lane index), the tails
    whose iterations are billed once they drain (by job id), and the jobs whose grant
    allowed one."""

    def __init__(self) -> None:
        self.tails: dict[int, Tail] = {}
        self.unbilled: dict[int, Tail] = {}
        self.drained_at: dict[int, float] = {}  # lane: when its device last ran dry, as heard
        self.offered: set[int] = set()  # job ids: granted with hand_over

    def offer(self, lane: Lane, chosen: Resident) -> bool:
        """The Go's ``hand_over`` for ``chosen``, remembered until its Done (a lease's too:
        the Done that ends it, asked back at a slice's end, hands over as well)."""
        if allowed(lane, chosen):
            self.offered.add(chosen.job_id)
            return True
        self.offered.discard(chosen.job_id)
        return False

    def released(self, holder: Resident, handle: str | None, steps: int, now: float) -> bool:
        """A holder's Done. With an event it was allowed to send, its tail is the lane's,
        and its iteration is billed once it drains (True); without, its device was waited
        for (False: billed now, as ever)."""
        lane = holder.lane
        if handle is None or holder.job_id not in self.offered:
            self.drained_at[lane] = now
            return False
        tail = Tail(holder, lane, handle, holder.granted_at, now, steps)
        self.tails[lane] = self.unbilled[holder.job_id] = tail
        return True

    def lease_released(self, holder: Resident, handle: str | None, now: float) -> None:
        """The Done that ends a lease asked back (billed until now already). With an event
        its Go allowed, the last leased iteration's tail is the lane's, as a grant's is,
        and billed to the lease once it drains; without, the device was waited for."""
        if handle is None or holder.job_id not in self.offered:
            self.drained_at[holder.lane] = now
            return
        tail = Tail(holder, holder.lane, handle, now, now, 0, leased=True)
        self.tails[holder.lane] = self.unbilled[holder.job_id] = tail

    def for_grant(
        self, lane: int, chosen: Resident, now: float, bound: float, goes: bool = True
    ) -> tuple[bool, str | None]:
        """Whether ``chosen``'s grant must wait for the lane's tail to drain, and the handle
        its Go carries (only ever to a job of the tail's owner). ``goes``: a Go is sent (a
        job stopped inside its iteration gets none: it is thawed, and cannot wait)."""
        tail = self.tails.get(lane)
        if tail is None:
            return False, None
        if chosen is tail.holder or (goes and tail.holder.user == chosen.user):
            del self.tails[lane]  # its stream is ordered after the tail from now on
            return False, None if chosen is tail.holder else tail.handle
        if now - tail.since < bound:
            tail.blocking = True
            return True, None
        self.settle(tail.holder, now)  # it never said: billed until now
        return False, None

    def drained(self, holder: Resident, now: float) -> int | None:
        """The holder's device has run its tail: its iteration is billed, and the lane it
        held is returned where a job may be waiting for it (None: nothing changes)."""
        tail = self.unbilled.get(holder.job_id)
        if tail is None:
            return None
        self.settle(holder, now)
        return tail.lane

    def settle(self, holder: Resident, now: float) -> None:
        """Bill ``holder``'s iteration whose tail was pending, until now: its Drained, or
        what came instead (a READY, its end, a wait that ran out). From its Go, or from
        when the lane's previous tail drained if later (its device waited for that one:
        no second of the device is billed twice), to now."""
        tail = self.unbilled.pop(holder.job_id, None)
        if tail is None:
            return
        if self.tails.get(tail.lane) is tail:
            del self.tails[tail.lane]
        begin = max(tail.granted, self.drained_at.get(tail.lane, 0.0))
        if tail.leased:  # its iterations are on its page: the tail is lease time
            held = max(0.0, now - begin)
            holder.attained += held
            holder.leased += held
            holder.dirty = True
        else:
            holder.end_iteration(max(0.0, now - begin), tail.steps)
        holder.released_at = now  # its gap begins once its device is done
        self.drained_at[tail.lane] = now

    def forget(self, holder: Resident, now: float) -> None:
        """The job has gone (its context, and its tail, with it)."""
        self.offered.discard(holder.job_id)
        self.settle(holder, now)

    def due_in(self, now: float, bound: float) -> float:
        """Seconds until a tail a job waits for stops being waited for (inf: none)."""
        waits = [t.since + bound - now for t in self.tails.values() if t.blocking]
        return max(0.0, min(waits)) if waits else float("inf")
