"""Hand-overs: a contended lane goes from job to job with one wake-up, the holder waking its
successor itself (gq.exec.handover), as the lane rule says ahead (gq.exec.lanes.hand_over);
the host can take a grant back until the successor has taken it, and a hostile holder can
neither grant the lane nor stall it."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import select
import selectors
import signal
import socket
import struct
import time
from contextlib import contextmanager

import pytest

from gq import defaults, policies
from gq.codec import MessageError
from gq.exec import handover, lanes, runtime
from gq.exec.handover import WorkerHandOvers
from gq.exec.host import Host
from gq.exec.residents import LaneState, Resident
from gq.exec.lease import SharedPage
from gq.exec.protocol import (FROM_WORKER, Cap, Channel, Done, Go, HandOver, Standby, Suspend,
                              WorkerChannel, encode)
from gq.exec.worker import READY, WorkerSession
from gq.policies.base import JobView


# ----- the lane rule ahead (pure) ----------------------------------------------------
def _ahead(policy, holder: JobView, others: list[JobView], granted_at=10.0, now=10.1):
    return lanes.hand_over(policies.make(policy), others, others, [], holder, granted_at, now)


def test_under_fair_the_job_waiting_follows_once_the_holder_has_used_more():
    """Gaps this short keep the lane for the holder while fair prefers it: whether the lane
    goes to the other job depends on how long the holder's iteration lasts (it must use
    0.5 s more). Where its iterations last longer than that, the other job follows a
    release from then on (found to within a 32nd of an iteration), and the host decides
    an earlier one; where they are shorter, the host decides at every release. Without a
    measured gap nothing keeps the lane for the holder: the other job follows it at once,
    however long it runs."""
    holder = JobView(1, "u", attained=1.0, mean_iteration=0.8, mean_gap=0.0001)
    other = JobView(2, "u", attained=1.5)
    follows = _ahead("fair", holder, [other])
    assert follows.job.id == 2 and 10.5 < follows.after <= 10.5 + 0.8 / 32
    assert _ahead("fair", dataclasses.replace(holder, mean_iteration=0.4), [other]) is None
    at_once = _ahead("fair", dataclasses.replace(holder, mean_gap=None), [other])
    assert at_once.job.id == 2 and at_once.after == 10.0
    # Used more already: the other job follows it whatever happens.
    assert _ahead("fair", dataclasses.replace(holder, attained=1.6), [other]).after == 10.0


def test_a_point_armed_is_kept_while_it_holds():
    """Asked again as the holder's iteration goes on, the rule keeps the point armed (no
    new pipe for the same hand-over), unless the decision there has changed: the job
    waiting has used more meanwhile (another of its user's jobs, say), so the holder must
    use more too before it follows."""
    holder = JobView(1, "u", attained=1.0, mean_iteration=0.8, mean_gap=0.0001)
    other = JobView(2, "u", attained=1.5)
    first = _ahead("fair", holder, [other])
    again = lanes.hand_over(policies.make("fair"), [other], [other], [], holder, 10.0, 10.2,
                            (2, first.after))
    assert again.after == first.after
    used_more = dataclasses.replace(other, attained=1.6)
    moved = lanes.hand_over(policies.make("fair"), [used_more], [used_more], [], holder, 10.0,
                            10.2, (2, first.after))
    assert 10.6 < moved.after <= 10.6 + 0.8 / 32


def test_no_hand_over_where_a_job_may_lose_its_deadline_before_the_release():
    """Under deadline, job 2 goes first while it can still make its deadline, which it can
    no longer at 10.1 (0.4 s left, due at 10.5); job 3 can make its own until 10.1003: a
    release between them goes to job 3, which a check at every 32nd of the holder's
    iteration misses; the time job 2's deadline is lost is checked on both sides."""
    lost_at_10_1 = JobView(2, "a", submit_time=0.2, steps_done=90, steps_total=100,
                           mean_iteration=0.04, deadline=10.5)
    later = JobView(3, "b", submit_time=0.3, steps_done=90, steps_total=100,
                    mean_iteration=0.04997, deadline=10.6)
    holder = JobView(1, "h", mean_iteration=0.1)
    ready = [lost_at_10_1, later]
    assert lanes.hand_over(policies.make("deadline"), ready, ready, [], holder, 10.0,
                           10.0) is None


def test_no_hand_over_where_the_lane_stays_the_holders():
    """A high-priority holder with short gaps keeps the lane (its gaps are anticipated);
    under fair, a holder far behind the other job keeps it for many iterations."""
    high = JobView(1, "u", priority=9, mean_iteration=0.01, mean_gap=0.0001)
    assert _ahead("priority", high, [JobView(2, "u", priority=0)]) is None
    behind = JobView(1, "u", attained=0.0, mean_iteration=0.01, mean_gap=0.0001)
    assert _ahead("fair", behind, [JobView(2, "u", attained=50.0)]) is None
    low = JobView(1, "u", priority=0, mean_iteration=0.01, mean_gap=0.0001)
    assert _ahead("priority", low, [JobView(2, "u", priority=9)]).job.id == 2


@pytest.mark.parametrize("policy, fill", [
    ("fifo", "always"), ("fair", "always"), ("srtf", "always"), ("priority", "always"),
    ("priority", "gapfit"), ("priority", "never"), ("rr", "always"), ("deadline", "always")])
def test_the_hand_over_agrees_with_the_free_lanes_decision(policy, fill):
    """For any lane, lane-mates in their gaps among its jobs: where a hand-over is named,
    the free lane's decision at the holder's release grants that job for every length from
    what the iteration has lasted, or from the point the hand-over names if later, to twice
    its usual length (checked at 201 lengths; deadlines and jobs due back fall within)."""
    rng = random.Random(f"{policy}{fill}")
    rule = policies.make(policy, fill=fill)
    named = later = 0
    granted_at = 10.0
    for _ in range(1500):
        views = [JobView(i, rng.choice("ab"), submit_time=rng.random(),
                         priority=rng.randrange(3), steps_done=rng.randrange(50),
                         steps_total=rng.choice([None, 100]), attained=rng.random(),
                         mean_iteration=rng.choice([None, 0.0005, 0.001, 0.01, 0.1]),
                         mean_gap=rng.choice([None, 0.0001, 0.0005, 0.005, 0.5]),
                         deadline=rng.choice([None, 10.0 + rng.random() * 5]))
                 for i in range(1, rng.randrange(2, 6) + 1)]
        holder, others, ready, in_gaps = views[0], [], [], []
        for view in views[1:]:
            if rng.random() < 0.4 and view.mean_gap is not None:  # released just before
                view = dataclasses.replace(view, released_at=granted_at - rng.random() * 0.002)
                in_gaps.append(lanes.awaited(view, view.released_at, view.mean_gap))
            else:
                ready.append(view)
            others.append(view)
        in_gaps = [awaited for awaited in in_gaps if awaited is not None]
        if not ready:
            continue
        now = granted_at + rng.random() * rng.choice([0.002, 0.2])
        follows = lanes.hand_over(rule, ready, others, in_gaps, holder, granted_at, now)
        if follows is None:
            continue
        named += 1
        later += follows.after > now
        shortest = now - granted_at
        longest = 2 * max(shortest, holder.mean_iteration or 0.0) + 0.001
        first = max(shortest, follows.after - granted_at)
        for length in [first + (longest - first) * step / 200 for step in range(201)]:
            release = granted_at + length
            released = dataclasses.replace(holder, attained=holder.attained + length,
                                           released_at=release)
            own = lanes.awaited(released, release, holder.mean_gap)
            decision = lanes.next_step(rule, ready, [*others, released],
                                       [*in_gaps, *([own] if own else [])], release)
            assert isinstance(decision, lanes.Grant) and decision.job.id == follows.job.id
    assert named  # the check ran
    if policy == "fair":  # where the holder must use more first: from a later point
        assert later


# ----- the wire ------------------------------------------------------------------------
def test_a_hand_overs_ends_come_with_their_messages_and_close_on_exec():
    host_end, worker_end = socket.socketpair()
    first, second = socket.socketpair()
    third = socket.socket()
    sender, receiver = Channel(host_end, FROM_WORKER), WorkerChannel(worker_end)
    assert sender.send_with_descriptors(Standby(7), [first.fileno(), third.fileno()])
    assert sender.send_with_descriptors(HandOver(8), [second.fileno()])
    assert sender.send(Go())
    got = []
    while len(got) < 3:  # a read stops after a message with descriptors
        receiver.fill()
        while (received := receiver.next_buffered()) is not None:
            got.append(received)
    assert [type(m) for m, _fds in got] == [Standby, HandOver, Go]
    assert [len(fds) for _m, fds in got] == [2, 1, 0]
    descriptors = [*got[0][1], *got[1][1]]
    for descriptor in descriptors:
        assert fcntl.fcntl(descriptor, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    os.write(descriptors[2], b"x")
    assert os.read(descriptors[0], 1) == b"x"  # the two ends of the host's pair, in order
    for descriptor in descriptors:
        os.close(descriptor)
    for end in (first, second, third):
        end.close()


def test_a_message_that_should_bring_a_descriptor_but_does_not_is_refused():
    host_end, worker_end = socket.socketpair()
    host_end.sendall(encode(Standby(3)))
    receiver = WorkerChannel(worker_end)
    receiver.fill()
    with pytest.raises(MessageError, match="standby message without its descriptors"):
        receiver.next_buffered()


# ----- a real host and workers, driven by hand -----------------------------------------
class HandLane:
    """A host on the cpu with one lane, and forked workers that run ``iterations``
    iterations each when told to: each says ``<job> granted`` as an iteration begins and
    releases the lane when the test writes to its pipe."""

    def __init__(self, policy: str, cuda: bool = False):
        self.host = Host("cpu", cuda, 1, socket.socket(socket.AF_UNIX), 1.0)
        self.host.granter.policy = policies.make(policy)
        self.said_read, self.said_write = os.pipe()
        self.children: dict[int, int] = {}
        self.release_pipes: dict[int, int] = {}
        self.sockets: dict[socket.socket, Resident] = {}
        self.heard = b""

    def add(self, job_id: int, iterations: int, priority: int = 0, hostile=None) -> Resident:
        page, page_fd = SharedPage.create()
        host_end, worker_end = socket.socketpair()
        release_read, release_write = os.pipe()
        child = os.fork()
        if child == 0:
            host_end.close()
            session = WorkerSession(WorkerChannel(worker_end), None, SharedPage.attach(page_fd))
            runtime.active = session
            if hostile is not None:
                hostile(session)
            try:
                for _ in range(iterations):
                    os.read(release_read, 1)  # told to begin
                    session.acquire()
                    os.write(self.said_write, f"{job_id} granted\n".encode())
                    os.read(release_read, 1)  # told to end
                    session.count_step(runtime.EXPLICIT)
                    session.release()
                session.finish()
            finally:
                os._exit(0)
        worker_end.close()
        os.close(page_fd)
        os.close(release_read)
        host_end.setblocking(False)
        resident = Resident(job_id=job_id, run=1, user="u", priority=priority,
                            submit_time=float(job_id), declared_total=None, lane=0,
                            process=None, channel=Channel(host_end, FROM_WORKER,
                                                          chunk=defaults.WORKER_READ),
                            started_at=time.monotonic(), started_wall=time.time(), page=page)
        self.host.residents[job_id] = resident
        self.host.lanes[0].residents.append(resident)
        self.host.selector.register(host_end, selectors.EVENT_READ, resident)
        self.children[job_id] = child
        self.release_pipes[job_id] = release_write
        self.sockets[host_end] = resident
        return resident

    def hold_and_arm(self, holder: Resident, successor: Resident) -> None:
        """``holder`` is granted the lane (and says so), then ``successor`` asks for it and
        is armed to follow."""
        self.tell(holder.job_id)
        self.serve(_holds(self, holder))
        assert self.said() == f"{holder.job_id} granted"
        self.tell(successor.job_id)
        self.serve(_armed_for(self, successor))

    def tell(self, job_id: int) -> None:
        os.write(self.release_pipes[job_id], b"x")

    def serve(self, until, only: Resident | None = None) -> None:
        """Let the host read its workers (or only one of them) until ``until()``."""
        deadline = time.monotonic() + 10
        while not until() and time.monotonic() < deadline:
            socks = [s for s, r in self.sockets.items()
                     if r.channel is not None and (only is None or r is only)]
            for sock in select.select(socks, [], [], 0.05)[0]:
                if self.sockets[sock].channel is not None:  # not dropped meanwhile
                    self.host.granter.from_worker(self.sockets[sock])
        assert until(), "the host never got there"

    def said(self) -> str:
        """The next thing a worker said (while the host reads nothing)."""
        while b"\n" not in self.heard:
            assert select.select([self.said_read], [], [], 10)[0], "no worker said anything"
            self.heard += os.read(self.said_read, 4096)
        line, self.heard = self.heard.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        for child in self.children.values():
            try:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


@pytest.fixture
def hand_lane():
    made = []

    def make(policy: str, cuda: bool = False) -> HandLane:
        made.append(HandLane(policy, cuda))
        return made[-1]

    yield make
    for lane in made:
        lane.close()


def _armed_for(lane: HandLane, resident: Resident):
    return lambda: (resident.state is LaneState.READY and lane.host.lanes[0].armed is not None
                    and lane.host.lanes[0].armed.successor == resident.job_id)


def _holds(lane: HandLane, resident: Resident):
    return lambda: lane.host.lanes[0].holder is resident and resident.state is LaneState.RUNNING


def test_the_holder_wakes_its_successor_without_the_host(hand_lane):
    """The successor's iteration begins while the host reads nothing at all: one wake-up.
    The host hears both jobs afterwards and counts each iteration once."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.hold_and_arm(one, two)
    lane.tell(1)  # job 1 releases; the host is not running
    assert lane.said() == "2 granted"
    assert lane.host.lanes[0].holder is one  # it has heard of nothing yet
    lane.serve(lambda: _holds(lane, two)() and one.iterations == 1)
    assert one.state is LaneState.IDLE and one.steps_done == 1 and lane.host.lanes[0].armed is None
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1 and lane.host.lanes[0].holder is None)
    assert lane.host.lanes[0].switches == 1


def _behind_by(lane: HandLane, seconds: float, monkeypatch, hostile=None,
               hostile_successor=None, holder_iterations: int = 2,
               successor_iterations: int = 1) -> tuple[Resident, Resident]:
    """Two jobs under fair, the first of which has used ``seconds`` less than the second,
    with 2 s iterations and 1 s gaps, which the lane is kept for (for 4 s: the anticipation
    limit is raised so that no test depends on how fast the host reads)."""
    monkeypatch.setattr(defaults, "ANTICIPATION_LIMIT", 10.0)
    one = lane.add(1, holder_iterations, hostile=hostile)
    two = lane.add(2, successor_iterations, hostile=hostile_successor)
    one.iterations, one.attained, one.gaps, one.gap_total = 3, 4.0, 2, 2.0
    two.attained = 4.0 + seconds
    return one, two


def test_a_holder_hands_over_only_from_where_the_lane_would_be_its_successors(hand_lane,
                                                                            monkeypatch):
    """Under fair the job waiting follows the holder only once the holder has used more:
    released later than that, the holder wakes it without the host."""
    lane = hand_lane("fair")
    one, two = _behind_by(lane, 0.3, monkeypatch)
    lane.hold_and_arm(one, two)
    armed = lane.host.lanes[0].armed
    assert one.granted_at + 0.3 < armed.after <= one.granted_at + 0.3 + 2.0 / 32
    time.sleep(max(0.0, armed.after - time.monotonic()) + 0.01)
    lane.tell(1)
    assert lane.said() == "2 granted"  # the host has read nothing meanwhile
    assert lane.host.lanes[0].holder is one
    lane.serve(lambda: _holds(lane, two)() and one.iterations == 4)


def test_a_holder_wakes_its_successor_only_at_a_release_past_its_point():
    """The worker's side: armed with a point still to come, its release wakes nobody (the
    host decides as it reads the Done); armed with one past, it wakes its successor."""
    page, _ = _page(), None
    holder_end, successor_end = socket.socketpair()
    handovers = WorkerHandOvers(WorkerChannel(socket.socketpair()[0]), page)
    handovers.wake_ends[1] = holder_end
    page.arm(1, time.monotonic_ns() + 10**9)
    handovers.hand_over()
    assert select.select([successor_end], [], [], 0)[0] == []  # a send is done at once
    page.arm(1, time.monotonic_ns() - 1)
    handovers.hand_over()
    assert successor_end.recv(1) == b"\0"


def _ignores_the_point(session: WorkerSession) -> None:
    """Hands over at every release, whatever point its page names."""
    handovers = session.handovers

    def hand_over() -> None:
        number = handovers.page.armed()
        if number not in handovers.wake_ends:
            handovers.read_sent()
        wake = handovers.wake_ends.pop(number, None)
        if wake is not None:
            wake.send(b"\0")

    handovers.hand_over = hand_over


def test_a_hand_over_made_before_its_point_gives_the_successor_nothing(hand_lane, monkeypatch):
    """A hostile holder armed to hand over from a point on wakes its successor before it,
    and the host reads its release late: the lane was not the successor's yet, so the host
    books nothing for it (its iteration ran outside its grants, uncharged, and it is
    granted the lane as usual later), and the holder is charged until the host read its
    release, on no other job's word."""
    lane = hand_lane("fair")
    one, two = _behind_by(lane, 0.3, monkeypatch, hostile=_ignores_the_point)
    lane.hold_and_arm(one, two)
    assert lane.host.lanes[0].armed.after > time.monotonic()
    attained, granted = one.attained, one.granted_at
    lane.tell(1)
    assert lane.said() == "2 granted"
    lane.tell(2)  # the successor's iteration ends at once
    time.sleep(0.2)  # the host is late
    lane.serve(lambda: one.iterations == 4)
    assert lane.host.lanes[0].holder is None and lane.host.lanes[0].switches == 0
    assert one.attained - attained >= 0.2
    assert one.attained - attained == pytest.approx(one.released_at - granted)
    lane.serve(lambda: two.channel is None)  # it ends; nothing of that iteration booked
    assert two.iterations == 0 and two.attained == 4.3


def test_a_successor_woken_early_by_a_holder_that_ends_gets_no_go_while_it_runs(
        hand_lane, monkeypatch):
    """The hostile holder hands over before its point, and ends: the successor runs that
    iteration outside its grants; the host sends it no Go meanwhile (one would wait in its
    socket and start its next iteration ungranted) and grants it the lane once it asks
    again, booking that iteration only."""
    lane = hand_lane("fair")
    one, two = _behind_by(lane, 0.3, monkeypatch, hostile=_ignores_the_point,
                          holder_iterations=1, successor_iterations=2)
    sent = []
    send = two.channel.send
    two.channel.send = lambda message: sent.append(message) or send(message)
    lane.hold_and_arm(one, two)
    lane.tell(1)  # it wakes job 2, releases and ends
    assert lane.said() == "2 granted"
    lane.serve(lambda: one not in lane.host.lanes[0].residents)
    assert two.unbooked and two.state is LaneState.IDLE and lane.host.lanes[0].holder is None
    assert not any(isinstance(message, Go) for message in sent)
    lane.tell(2)  # its iteration ends
    lane.tell(2)  # and it asks again
    lane.serve(_holds(lane, two))
    assert lane.said() == "2 granted" and any(isinstance(m, Go) for m in sent)
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1)


def test_a_successor_woken_early_is_granted_nothing_before_it_asks_again(
        hand_lane, monkeypatch):
    """The hostile holder hands over before its point and stays, in its short gap, for
    which fair keeps the lane: the successor runs that iteration outside its grants,
    booked nothing; its Done changes nothing, and the holder, asking again within its
    window, has the lane."""
    lane = hand_lane("fair")
    one, two = _behind_by(lane, 0.3, monkeypatch, hostile=_ignores_the_point)
    lane.hold_and_arm(one, two)
    lane.tell(1)
    assert lane.said() == "2 granted"
    lane.serve(lambda: one.iterations == 4)
    assert two.state is LaneState.IDLE and two.unbooked and lane.host.lanes[0].holder is None
    lane.tell(2)  # its iteration ends (its Done), then it finishes
    lane.tell(1)  # the holder asks again, within its window
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted"
    assert two.iterations == 0 and two.attained == 4.3


def _takes_grants_early(session: WorkerSession) -> None:
    """Takes any grant the host posts for it as soon as it is there, woken or not."""
    handovers = session.handovers

    def await_grant() -> Go:
        while True:
            handovers.read_sent()
            if handovers.early:
                return handovers.early.pop(0)
            for number, (message, wake, grant) in list(handovers.standbys.items()):
                try:
                    if grant.recv(1, socket.MSG_DONTWAIT) == b"\0":
                        del handovers.standbys[number]
                        return Go(empty_cache=message.empty_cache)
                except BlockingIOError:
                    pass
            select.select([handovers.channel.sock], [], [], 0.0005)

    handovers.await_grant = await_grant


def test_a_successor_that_takes_its_grant_before_the_point_takes_no_turn(hand_lane,
                                                                          monkeypatch):
    """Fair keeps the lane for a holder that has used less, if it releases early: a hostile
    successor that takes its grant as soon as it is armed, and an honest holder that then
    releases before the point, leave the lane with the holder (its gap is short), not with
    the successor."""
    lane = hand_lane("fair")
    one, two = _behind_by(lane, 0.3, monkeypatch, hostile_successor=_takes_grants_early)
    lane.hold_and_arm(one, two)
    assert lane.said() == "2 granted"  # on its own, before the holder released at all
    lane.tell(1)  # released at once, before the point
    lane.serve(lambda: one.iterations == 4)
    lane.tell(1)  # and asks again at once, within its short gap
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted" and two.iterations == 0


def test_a_grant_taken_back_cannot_be_woken_into(hand_lane):
    """Armed for job 2, the host's pick changes to job 3 (higher priority): job 2's grant is
    taken back. A hostile holder that writes to every pipe end it was given wakes job 2
    too: it finds no grant and waits on; job 3 gets the lane, and job 2 only after it."""

    def write_everywhere(session: WorkerSession) -> None:
        handovers = session.handovers
        honest = handovers.hand_over

        def hand_over() -> None:
            try:
                handovers.channel.fill(socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            while (received := handovers.channel.next_buffered()) is not None:
                handovers._keep(*received)
            for wake in handovers.wake_ends.values():
                wake.send(b"x")
            honest()

        handovers.hand_over = hand_over

    lane = hand_lane("priority")
    one = lane.add(1, 1, priority=0, hostile=write_everywhere)
    two, three = lane.add(2, 1, priority=1), lane.add(3, 1, priority=5)
    lane.hold_and_arm(one, two)
    lane.tell(3)
    lane.serve(_armed_for(lane, three))
    lane.tell(1)
    assert lane.said() == "3 granted"
    lane.serve(lambda: _holds(lane, three)() and one.iterations == 1)
    assert two.state is LaneState.READY
    lane.tell(3)
    assert lane.said() == "2 granted"  # after job 3's release, not before
    lane.serve(lambda: _holds(lane, two)() and three.iterations == 1)


def test_a_holder_that_never_hands_over_costs_its_successor_only_the_hosts_round(hand_lane):
    """A holder that ignores its page: the host, hearing its DONE, takes the successor's
    grant back and grants it the lane with a Go."""

    def never(session: WorkerSession) -> None:
        session.handovers.hand_over = lambda: None

    lane = hand_lane("fair")
    one, two = lane.add(1, 1, hostile=never), lane.add(2, 1)
    lane.hold_and_arm(one, two)
    lane.tell(1)
    lane.serve(lambda: _holds(lane, two)() and one.iterations == 1)
    assert lane.said() == "2 granted"


def test_a_successor_that_dies_while_armed_leaves_nothing_armed(hand_lane):
    """Its pipes are closed, its holder's page names nothing, and the holder's release
    frees the lane."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.hold_and_arm(one, two)
    assert lane.host.lanes[0].pipes  # the pipe for the turn after, sent ahead
    os.kill(lane.children[2], signal.SIGKILL)
    lane.serve(lambda: two.channel is None)
    assert lane.host.lanes[0].armed is None and not lane.host.lanes[0].pipes
    assert one.page.armed() == 0
    lane.tell(1)
    lane.serve(lambda: one.iterations == 1 and lane.host.lanes[0].holder is None)


def test_the_successors_done_read_first_is_read_after_the_holders(hand_lane):
    """The host may find the successor's socket readable first: it reads the holder's DONE
    first (sent before the successor could run), so each job's iteration is its own."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.hold_and_arm(one, two)
    lane.tell(1)
    released = time.monotonic()
    assert lane.said() == "2 granted"
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1, only=two)
    assert one.iterations == 1 and one.steps_done == two.steps_done == 1
    assert lane.host.lanes[0].holder is None and lane.host.lanes[0].armed is None
    assert one.attained >= released - one.granted_at > 0 and two.attained > 0


def _pair() -> tuple[Channel, WorkerChannel]:
    host_end, worker_end = socket.socketpair()
    return Channel(host_end, FROM_WORKER), WorkerChannel(worker_end)


def test_only_a_byte_down_the_armed_pipe_takes_its_grant():
    """A job may follow several lane-mates and holds a pipe from each. An end of file (its
    writers gone) takes no grant, nor does a byte down a pipe the host has not armed (a
    hostile lane-mate writing whenever it likes): only the armed pipe's byte does."""
    to_waiting, waiting_end = _pair()
    waiting = WorkerHandOvers(waiting_end, None)
    holders = {number: _pair() for number in (1, 2, 3)}
    pipes = {number: handover.deliver(number, holders[number][0], to_waiting,
                                      empty_cache=number == 2)
             for number in (1, 3, 2)}
    for number in (1, 2):
        pipes[number].grant.send(b"\0")  # posted
    waiting.read_sent()
    for _host, holder in holders.values():
        holder.fill()
    held = {number: holders[number][1].next_buffered()[1][0] for number in (1, 2, 3)}
    os.close(held[1])  # pipe 1's writers are gone: an end of file, its grant still posted
    os.write(held[3], b"x")  # out of turn, down a pipe not armed
    os.write(held[2], b"x")  # the armed one
    grant = waiting.await_grant()
    assert isinstance(grant, Go) and grant.empty_cache  # pipe 2's hand-over
    assert pipes[1].taken.recv(1, socket.MSG_DONTWAIT) == b"\0"  # pipe 1's: not taken
    with pytest.raises(BlockingIOError):
        pipes[2].taken.recv(1, socket.MSG_DONTWAIT)  # pipe 2's: taken by the job
    for descriptor in (held[2], held[3]):
        os.close(descriptor)


def test_a_forked_child_keeps_no_end():
    """A DataLoader worker forked from a job neither waits for the lane nor hands it over:
    it closes its copies of the job's ends."""
    to_waiting, waiting_end = _pair()
    to_holder, _holder_end = _pair()
    waiting = WorkerHandOvers(waiting_end, None)
    assert handover.deliver(1, to_holder, to_waiting, empty_cache=False) is not None
    waiting.read_sent()
    [(_message, wake, grant)] = waiting.standbys.values()
    ends = [wake.fileno(), grant.fileno()]
    child = os.fork()
    if child == 0:
        closed = 0
        for descriptor in ends:
            try:
                os.fstat(descriptor)
            except OSError:
                closed += 1
        os._exit(0 if closed == len(ends) and not waiting.standbys else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert all(os.fstat(descriptor) for descriptor in ends)  # the job's own stay open


def _page() -> SharedPage:
    page, fd = SharedPage.create()
    os.close(fd)
    return page


def test_a_job_granted_by_the_host_while_another_waits_is_followed_ahead(hand_lane):
    """The lane kept for a high-priority job in its short gap, two low jobs wait; the gap
    outlasts its window and the host grants the first low job with a Go: the second is
    armed to follow it at once, not at the next event the host happens to see."""
    lane = hand_lane("priority")
    high = lane.add(1, 3, priority=9)
    first, second = lane.add(2, 1), lane.add(3, 1)
    lane.tell(1)
    lane.serve(_holds(lane, high))
    high.gaps, high.gap_total = 1, 0.0001  # as measured: a gap too short to fill
    lane.tell(2)
    lane.tell(3)
    lane.serve(lambda: first.state == second.state is LaneState.READY)
    assert lane.host.lanes[0].armed is None  # the lane is kept for the high job
    lane.tell(1)
    lane.serve(lambda: high.iterations == 1 and lane.host.lanes[0].kept_until is not None)
    kept_until = lane.host.lanes[0].kept_until
    while time.monotonic() < kept_until:  # its window: the high job does not come back
        time.sleep(kept_until - time.monotonic())
    lane.host.granter.schedule_waiting_lanes()
    assert _holds(lane, first)() and _armed_for(lane, second)()


# ----- what a hostile job can and cannot do ---------------------------------------------
@contextmanager
def _host_returns_within(seconds: int):
    """Fails the test, instead of hanging it, if the host blocks."""

    def held_up(_signum, _frame):
        raise TimeoutError(f"the host was held up for {seconds} s")

    previous = signal.signal(signal.SIGALRM, held_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _reads_only_its_socket(session: WorkerSession) -> None:
    """Keeps every end the host sends it, and never reads one: it waits for a Go."""
    handovers = session.handovers

    def await_grant() -> Go:
        while True:
            received = handovers.channel.next_buffered()
            if received is None:
                handovers.channel.fill()
            elif isinstance(received[0], Go):
                return received[0]
            else:
                handovers._keep(*received)

    handovers.await_grant = await_grant


def _takes_its_grant_early(session: WorkerSession) -> None:
    """Asks, takes its grant as soon as the host arms it, and says it is done."""
    handovers = session.handovers

    def acquire() -> None:
        session.channel.sock.sendall(READY)
        while not handovers.standbys:
            handovers.read_sent()
            select.select([handovers.channel.sock], [], [], 1)
        [(_message, _wake, grant)] = handovers.standbys.values()
        assert select.select([grant], [], [], 10)[0] and grant.recv(1) == b"\0"
        session.channel.send(Done(0))
        session.held = False

    session.acquire = acquire


def test_a_successor_that_takes_its_grant_early_waits_for_its_holders_release(hand_lane):
    """A hostile job armed to follow takes its grant at once and speaks: the host reads no
    more of it until the holder has released the lane, grants nobody else meanwhile, and
    counts the holder's whole iteration as the holder's."""
    lane = hand_lane("priority")
    one = lane.add(1, 1, priority=0)
    two = lane.add(2, 1, priority=5, hostile=_takes_its_grant_early)
    three = lane.add(3, 1, priority=1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted"
    lane.tell(3)
    lane.serve(lambda: three.state is LaneState.READY)
    lane.tell(2)
    lane.serve(lambda: lane.host.lanes[0].armed is not None and lane.host.lanes[0].armed.deferred)
    assert lane.said() == "2 granted"  # it runs, on its own word
    assert _holds(lane, one)() and two.iterations == 0 and three.state is LaneState.READY
    lane.tell(1)
    released = time.monotonic()
    lane.serve(_holds(lane, three))
    assert lane.said() == "3 granted"
    assert one.iterations == 1 and one.attained >= released - one.granted_at
    assert two.iterations == 1


def test_two_jobs_in_league_cannot_hold_the_host_up(hand_lane):
    """A holder that fills its wake channel and clears its non-blocking flag (which its
    end shares with the host's copy), and a successor that never reads it: the host's own
    wake at the holder's release does not block."""

    def fills_its_wake_channel(session: WorkerSession) -> None:
        handovers = session.handovers

        def hand_over() -> None:
            number = handovers.page.armed()
            handovers.read_sent()
            wake = handovers.wake_ends[number]
            wake.setblocking(False)
            try:
                while True:
                    wake.send(b"\0" * 4096)
            except BlockingIOError:
                pass
            wake.setblocking(True)

        handovers.hand_over = hand_over

    lane = hand_lane("fair")
    one = lane.add(1, 1, hostile=fills_its_wake_channel)
    two = lane.add(2, 1, hostile=_reads_only_its_socket)
    lane.hold_and_arm(one, two)
    lane.tell(1)
    with _host_returns_within(10):
        lane.serve(lambda: one.iterations == 1 and lane.host.lanes[0].armed is None)


def test_a_holder_whose_successor_closed_its_end_is_not_killed_by_sigpipe(hand_lane):
    """A script that restores SIGPIPE's default (as command-line tools do) holds the lane;
    its successor has dropped its ends: the holder's wake at its release fails quietly, and
    the host grants the successor with a Go."""

    def default_sigpipe(_session: WorkerSession) -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    lane = hand_lane("fair")

    def drops_its_ends(session: WorkerSession) -> None:
        handovers = session.handovers
        honest = handovers.await_grant

        def await_grant() -> Go:
            handovers.read_sent()
            while not handovers.standbys:
                select.select([handovers.channel.sock], [], [], 1)
                handovers.read_sent()
            handovers._forget()
            os.write(lane.said_write, b"2 dropped its ends\n")
            return honest()

        handovers.await_grant = await_grant

    one = lane.add(1, 1, hostile=default_sigpipe)
    two = lane.add(2, 1, hostile=drops_its_ends)
    lane.hold_and_arm(one, two)
    assert lane.said() == "2 dropped its ends"
    lane.tell(1)
    lane.serve(lambda: one.iterations == 1 and _holds(lane, two)())
    assert lane.said() == "2 granted"


def test_a_job_that_scribbles_over_its_page_cannot_hold_the_host_up(hand_lane):
    """Every word of a waiting job's page set to what would make a futex call of glibc's
    wait for ever, or abort: the host never makes such a call on a job's memory."""

    def scribble(session: WorkerSession) -> None:
        page = session.handovers.page.map
        for offset in range(0, len(page), 16):
            struct.pack_into("<QiI", page, offset, 1 << 32, 129, 0)

    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1, hostile=scribble)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    with _host_returns_within(10):
        lane.tell(2)
        lane.serve(_armed_for(lane, two))
        lane.tell(1)
        lane.serve(lambda: one.iterations == 1 and _holds(lane, two)())


def test_a_waiting_job_that_asks_again_and_again_costs_the_host_nothing(hand_lane, monkeypatch):
    """READY after READY from a job that waits already: each is nothing to do, not a new
    decision for its lane."""
    decisions = []
    real = lanes.hand_over
    monkeypatch.setattr(lanes, "hand_over", lambda *a: decisions.append(1) or real(*a))

    def asks_again(session: WorkerSession) -> None:
        honest = session.handovers.await_grant

        def await_grant() -> Go:
            session.channel.sock.sendall(READY * 200)
            return honest()

        session.handovers.await_grant = await_grant

    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1, hostile=asks_again)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    lane.tell(2)
    sock = two.channel.sock
    lane.serve(lambda: two.state is LaneState.READY and not two.channel._buffer
               and not select.select([sock], [], [], 0)[0])
    assert len(decisions) <= 2, len(decisions)


def test_a_cap_that_comes_while_a_hand_over_is_armed_comes_with_a_go(hand_lane):
    """A probed job's cap reaches its worker with its next grant: armed to follow, that
    grant is taken back, and comes from the host."""
    lane = hand_lane("fair", cuda=True)
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.hold_and_arm(one, two)
    lane.host._on_cap(Cap(job=2, run=1, mem_cap=1 << 30))
    assert lane.host.lanes[0].armed is None and two.cap_unsent
    lane.tell(1)
    lane.serve(lambda: _holds(lane, two)() and not two.cap_unsent)


def test_a_successor_suspended_inside_its_handed_over_iteration_is_thawed_when_granted(
        hand_lane):
    """Suspended after it took the lane but before the host heard the holder release it,
    then resumed: the job stays stopped until the lane is its again, and is thawed then."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)

    def stop(job: Resident, stopped: bool) -> None:
        job.frozen = stopped
        os.kill(lane.children[job.job_id], signal.SIGSTOP if stopped else signal.SIGCONT)

    lane.host.freeze = stop
    lane.hold_and_arm(one, two)
    lane.tell(1)
    assert lane.said() == "2 granted"
    lane.host._on_suspend(Suspend(job=2, suspended=True))
    assert two.thaw_on_grant and two.frozen
    lane.host._on_suspend(Suspend(job=2, suspended=False))
    assert two.frozen  # inside its iteration: it goes on once the lane is its
    lane.serve(lambda: one.iterations == 1 and _holds(lane, two)(), only=one)
    assert not two.frozen and not two.thaw_on_grant
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1)


def test_a_successor_that_dies_while_its_reading_is_deferred_leaves_the_lane_going(hand_lane):
    lane = hand_lane("priority")
    one = lane.add(1, 1, priority=0)
    two, three = lane.add(2, 1, priority=5, hostile=_takes_its_grant_early), lane.add(3, 1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    lane.tell(3)
    lane.serve(lambda: three.state is LaneState.READY)
    lane.tell(2)
    lane.serve(lambda: lane.host.lanes[0].armed is not None and lane.host.lanes[0].armed.deferred)
    os.kill(lane.children[2], signal.SIGKILL)
    os.waitpid(lane.children[2], 0)
    lane.host.granter.drop_channel(two)  # as its exit is collected
    assert two.channel is None and _holds(lane, one)()
    lane.tell(1)
    lane.serve(_holds(lane, three))
    assert all(2 not in pair for pair in lane.host.lanes[0].pipes)
