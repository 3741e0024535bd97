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
import time

import pytest

from gq import defaults, policies
from gq.codec import MessageError
from gq.exec import lanes, runtime
from gq.exec.handover import WorkerHandOvers
from gq.exec.host import Host, Resident
from gq.exec.lease import SharedPage
from gq.exec.protocol import (FROM_WORKER, Channel, Go, HandOver, Standby, WorkerChannel,
                              encode)
from gq.exec.worker import WorkerSession
from gq.policies.base import JobView


# ----- the lane rule ahead (pure) ----------------------------------------------------
def _ahead(policy, holder: JobView, others: list[JobView], granted_at=10.0, now=10.1):
    return lanes.hand_over(policies.make(policy), others, others, [], holder, granted_at, now)


def test_under_fair_the_lane_goes_to_the_other_job_once_the_holder_has_used_more():
    """Gaps this short keep the lane for the holder while fair prefers it: the hand-over
    waits until the holder has used more than the other job (0.5 s more here)."""
    holder = JobView(1, "u", attained=1.0, mean_iteration=0.4, mean_gap=0.0001)
    other = JobView(2, "u", attained=1.5)
    ahead = _ahead("fair", holder, [other])
    assert ahead is not None and ahead.job.id == 2
    assert abs(ahead.after - 0.5) < 0.01, ahead.after
    # Without a measured gap, nothing keeps the lane for the holder: at once.
    assert _ahead("fair", dataclasses.replace(holder, mean_gap=None), [other]).after == 0.0


def test_no_hand_over_where_the_lane_stays_the_holders():
    """A high-priority holder with short gaps keeps the lane (its gaps are anticipated);
    under fair, a holder far behind the other job keeps it for many iterations."""
    high = JobView(1, "u", priority=9, mean_iteration=0.01, mean_gap=0.0001)
    assert _ahead("priority", high, [JobView(2, "u", priority=0)]) is None
    behind = JobView(1, "u", attained=0.0, mean_iteration=0.01, mean_gap=0.0001)
    assert _ahead("fair", behind, [JobView(2, "u", attained=50.0)]) is None
    low = JobView(1, "u", priority=0, mean_iteration=0.01, mean_gap=0.0001)
    ahead = _ahead("priority", low, [JobView(2, "u", priority=9)])
    assert ahead is not None and ahead.job.id == 2 and ahead.after == 0.0


@pytest.mark.parametrize("policy", ["fifo", "fair", "srtf", "priority", "rr", "deadline"])
def test_the_hand_over_agrees_with_the_free_lanes_decision(policy):
    """For any lane: from the length it names on, the free lane's decision at the
    holder's release grants the job it names; just before it, it does not."""
    rng = random.Random(policy)
    rule = policies.make(policy)
    for _ in range(300):
        views = [JobView(i, rng.choice("ab"), submit_time=rng.random(),
                         priority=rng.randrange(3), steps_done=rng.randrange(50),
                         steps_total=rng.choice([None, 100]),
                         attained=rng.random(), mean_iteration=rng.choice([None, 0.01, 0.1]),
                         mean_gap=rng.choice([None, 0.0001, 0.5]),
                         deadline=rng.choice([None, 20.0 + rng.random()]))
                 for i in range(1, rng.randrange(2, 5) + 1)]
        holder, others = views[0], views[1:]
        granted_at, now = 10.0, 10.0 + rng.random() * 0.2
        ahead = lanes.hand_over(rule, others, others, [], holder, granted_at, now)

        def decided(length: float):
            release = granted_at + length
            released = dataclasses.replace(holder, attained=holder.attained + length,
                                           released_at=release)
            waits = [a] if (a := lanes.awaited(released, release, holder.mean_gap)) else []
            return lanes.next_step(rule, others, [*others, released], waits, release)

        if ahead is None:
            continue
        elapsed = now - granted_at
        for length in (max(ahead.after, elapsed), max(ahead.after, elapsed) + 0.0001):
            decision = decided(length)
            assert isinstance(decision, lanes.Grant) and decision.job.id == ahead.job.id
        if ahead.after > elapsed:
            decision = decided(ahead.after - 0.01)
            assert not (isinstance(decision, lanes.Grant) and decision.job.id == ahead.job.id)


# ----- the wire ------------------------------------------------------------------------
def test_a_pipe_end_comes_with_its_message_and_closes_on_exec():
    host_end, worker_end = socket.socketpair()
    read_end, write_end = os.pipe()
    sender, receiver = Channel(host_end, FROM_WORKER), WorkerChannel(worker_end)
    assert sender.send_with_descriptor(Standby(7), read_end)
    assert sender.send_with_descriptor(HandOver(8), write_end)
    assert sender.send(Go())
    got = []
    while len(got) < 3:  # a read stops after a message with a descriptor
        receiver.fill()
        while (received := receiver.next_buffered()) is not None:
            got.append(received)
    assert [type(m) for m, _fd in got] == [Standby, HandOver, Go] and got[2][1] is None
    for _message, fd in got[:2]:
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    os.write(got[1][1], b"x")
    assert os.read(got[0][1], 1) == b"x"  # the two ends of the host's pipe
    for fd in (read_end, write_end, got[0][1], got[1][1]):
        os.close(fd)


def test_a_message_that_should_bring_a_descriptor_but_does_not_is_refused():
    host_end, worker_end = socket.socketpair()
    host_end.sendall(encode(Standby(3)))
    receiver = WorkerChannel(worker_end)
    receiver.fill()
    with pytest.raises(MessageError, match="standby message without its descriptor"):
        receiver.next_buffered()


# ----- a real host and workers, driven by hand -----------------------------------------
class HandLane:
    """A host on the cpu with one lane, and forked workers that run ``iterations``
    iterations each when told to: each says ``<job> granted`` as an iteration begins and
    releases the lane when the test writes to its pipe."""

    def __init__(self, policy: str):
        self.host = Host("cpu", False, 1, socket.socket(socket.AF_UNIX), 1.0)
        self.host.policy = policies.make(policy)
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

    def tell(self, job_id: int) -> None:
        os.write(self.release_pipes[job_id], b"x")

    def serve(self, until, only: Resident | None = None) -> None:
        """Let the host read its workers (or only one of them) until ``until()``."""
        deadline = time.monotonic() + 10
        while not until() and time.monotonic() < deadline:
            socks = [s for s, r in self.sockets.items()
                     if r.channel is not None and (only is None or r is only)]
            for sock in select.select(socks, [], [], 0.05)[0]:
                self.host._from_worker(self.sockets[sock])
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

    def make(policy: str) -> HandLane:
        made.append(HandLane(policy))
        return made[-1]

    yield make
    for lane in made:
        lane.close()


def _armed_for(lane: HandLane, resident: Resident):
    return lambda: (resident.state == "ready" and lane.host.lanes[0].armed is not None
                    and lane.host.lanes[0].armed.successor == resident.job_id)


def _holds(lane: HandLane, resident: Resident):
    return lambda: lane.host.lanes[0].holder is resident and resident.state == "running"


def test_the_holder_wakes_its_successor_without_the_host(hand_lane):
    """The successor's iteration begins while the host reads nothing at all: one wake-up.
    The host hears both jobs afterwards and counts each iteration once."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted"
    lane.tell(2)
    lane.serve(_armed_for(lane, two))
    lane.tell(1)  # job 1 releases; the host is not running
    assert lane.said() == "2 granted"
    assert lane.host.lanes[0].holder is one  # it has heard of nothing yet
    lane.serve(lambda: _holds(lane, two)() and one.iterations == 1)
    assert one.state == "idle" and one.steps_done == 1 and lane.host.lanes[0].armed is None
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1 and lane.host.lanes[0].holder is None)
    assert lane.host.lanes[0].switches == 1


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
            for write_end in handovers.write_ends.values():
                os.write(write_end, b"x")
            honest()

        handovers.hand_over = hand_over

    lane = hand_lane("priority")
    one = lane.add(1, 1, priority=0, hostile=write_everywhere)
    two, three = lane.add(2, 1, priority=1), lane.add(3, 1, priority=5)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted"
    lane.tell(2)
    lane.serve(_armed_for(lane, two))
    lane.tell(3)
    lane.serve(_armed_for(lane, three))
    lane.tell(1)
    assert lane.said() == "3 granted"
    lane.serve(lambda: _holds(lane, three)() and one.iterations == 1)
    assert two.state == "ready"
    lane.tell(3)
    assert lane.said() == "2 granted"  # after job 3's release, not before
    lane.serve(lambda: _holds(lane, two)() and three.iterations == 1)


def test_a_holder_that_never_hands_over_costs_its_successor_only_the_hosts_round(hand_lane):
    """A holder that ignores its page: the host, hearing its DONE, wakes the successor."""

    def never(session: WorkerSession) -> None:
        session.handovers.hand_over = lambda: None

    lane = hand_lane("fair")
    one, two = lane.add(1, 1, hostile=never), lane.add(2, 1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    assert lane.said() == "1 granted"
    lane.tell(2)
    lane.serve(_armed_for(lane, two))
    lane.tell(1)
    lane.serve(lambda: _holds(lane, two)() and one.iterations == 1)
    assert lane.said() == "2 granted"


def test_a_successor_that_dies_while_armed_leaves_nothing_armed(hand_lane):
    """Its pipes are closed, its holder's page names nothing, and the holder's release
    frees the lane."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    lane.tell(2)
    lane.serve(_armed_for(lane, two))
    assert lane.host.lanes[0].pipes  # the pipe for the turn after, sent ahead
    os.kill(lane.children[2], signal.SIGKILL)
    lane.serve(lambda: two.channel is None)
    assert lane.host.lanes[0].armed is None and not lane.host.lanes[0].pipes
    assert one.page.armed()[0] == 0
    lane.tell(1)
    lane.serve(lambda: one.iterations == 1 and lane.host.lanes[0].holder is None)


def test_the_successors_done_read_before_the_holders_counts_both_iterations(hand_lane):
    """The host may read the successor's DONE first: the lane was handed over already,
    and the holder's DONE, read later, still counts its iteration. Not knowing when the
    holder released the lane, the host counts the time until then as the holder's."""
    lane = hand_lane("fair")
    one, two = lane.add(1, 1), lane.add(2, 1)
    lane.tell(1)
    lane.serve(_holds(lane, one))
    lane.tell(2)
    lane.serve(_armed_for(lane, two))
    began = one.granted_at
    lane.tell(1)
    assert lane.said() == "1 granted" and lane.said() == "2 granted"
    lane.tell(2)
    lane.serve(lambda: two.iterations == 1, only=two)
    ended = time.monotonic()
    assert one.iterations == 0 and one.handed_off
    lane.serve(lambda: one.iterations == 1, only=one)
    assert not one.handed_off and lane.host.lanes[0].holder is None
    assert one.steps_done == two.steps_done == 1
    assert 0 < one.attained + two.attained <= ended - began


def test_a_pipe_whose_writers_are_gone_does_not_wake_its_job_into_a_grant():
    """A job waits on the pipes of several possible predecessors; one of them exits (an
    end of file on its pipe) while the job's grant is posted for another's hand-over: the
    job does not take it, and runs when granted."""
    page, fd = SharedPage.create()
    host_end, worker_end = socket.socketpair()
    host = Channel(host_end, FROM_WORKER)
    waiting = WorkerHandOvers(WorkerChannel(worker_end), SharedPage.attach(fd))
    gone_read, gone_write = os.pipe()
    armed_read, armed_write = os.pipe()
    assert host.send_with_descriptor(Standby(1), gone_read)
    assert host.send_with_descriptor(Standby(2), armed_read)
    page.post_grant(2)  # armed through pipe 2; its holder is still inside its iteration
    os.close(gone_write)  # pipe 1's holder is gone
    assert host.send(Go(empty_cache=True))  # ... and the host grants the lane itself
    grant = waiting.await_grant()
    assert isinstance(grant, Go) and grant.empty_cache  # the host's Go, not a hand-over's
    assert page.take_grant()  # still posted: taken back by the host, not by the job
    for descriptor in (gone_read, armed_read, armed_write):
        os.close(descriptor)


def test_a_forked_child_keeps_no_pipe_end():
    """A DataLoader worker forked from a job must not hold a copy of the job's read end:
    the host would write there in vain, taking a closed pipe for an open one."""
    host_end, worker_end = socket.socketpair()
    host = Channel(host_end, FROM_WORKER)
    handovers = WorkerHandOvers(WorkerChannel(worker_end), None)
    read_end, write_end = os.pipe()
    assert host.send_with_descriptor(Standby(1), read_end)
    os.close(read_end)
    handovers._read_sent()
    assert list(handovers.standbys) == [1]
    hold_read, hold_write = os.pipe()
    running_read, running_write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(running_write, b"x")  # its fork handlers have run
        os.read(hold_read, 1)  # alive until the parent has tried
        os._exit(0)
    os.read(running_read, 1)
    os.close(handovers.standbys.pop(1)[1])  # the job closes its own: no reader is left
    try:
        with pytest.raises(BrokenPipeError):
            os.write(write_end, b"x")
    finally:
        os.write(hold_write, b"x")
        os.waitpid(child, 0)
    for descriptor in (write_end, hold_read, hold_write, running_read, running_write):
        os.close(descriptor)


def test_a_wake_through_another_pipe_than_the_armed_one_takes_no_grant():
    """A job may follow several lane-mates, and holds a pipe from each. Armed to follow one
    of them, it is woken down another's pipe (that lane-mate is hostile, and writes there
    whenever it likes): it does not take the grant, and runs when its turn comes."""
    page, fd = SharedPage.create()
    host_end, worker_end = socket.socketpair()
    host = Channel(host_end, FROM_WORKER)
    waiting = WorkerHandOvers(WorkerChannel(worker_end), SharedPage.attach(fd))
    hostile_read, hostile_write = os.pipe()
    armed_read, armed_write = os.pipe()
    assert host.send_with_descriptor(Standby(1), hostile_read)
    assert host.send_with_descriptor(Standby(2, empty_cache=True), armed_read)
    page.post_grant(2)
    os.write(hostile_write, b"x")  # out of turn: read first, it must not take the grant
    os.write(armed_write, b"x")  # its turn
    grant = waiting.await_grant()
    assert isinstance(grant, Go) and grant.empty_cache  # pipe 2's hand-over, not pipe 1's
    assert list(waiting.standbys) == [] and not page.take_grant()  # taken by the job
    for descriptor in (hostile_read, hostile_write, armed_read, armed_write):
        os.close(descriptor)


def test_a_job_granted_by_the_host_while_another_waits_is_followed_ahead(hand_lane):
    """The lane kept for a high-priority job in its short gap, two low jobs wait; the gap
    outlasts its window and the host grants the first low job with a Go: the second is
    armed to follow it at once, not at the next event the host happens to see."""
    lane = hand_lane("priority")
    high = lane.add(1, 3, priority=9)
    first, second = lane.add(2, 1), lane.add(3, 1)
    lane.tell(1)
    lane.serve(_holds(lane, high))
    lane.tell(1)  # its first iteration ends, and the second begins at once: a short gap
    lane.tell(1)
    lane.serve(lambda: high.iterations == 1 and _holds(lane, high)())
    lane.tell(2)
    lane.tell(3)
    lane.serve(lambda: first.state == second.state == "ready")
    assert lane.host.lanes[0].armed is None  # the lane is kept for the high job
    lane.tell(1)
    lane.serve(lambda: high.iterations == 2 and lane.host.lanes[0].kept_until is not None)
    kept_until = lane.host.lanes[0].kept_until
    while time.monotonic() < kept_until:  # its window: the high job does not come back
        time.sleep(kept_until - time.monotonic())
    lane.host._schedule_waiting_lanes()
    assert _holds(lane, first)() and _armed_for(lane, second)()
