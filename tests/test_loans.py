"""Loans: two jobs whose iterations fit in each other's gaps are lent their lane and take it
from each other without asking the host (gq.exec.lease), until a third job asks or one of
them breaks the rules."""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import gq_ok, job, submit, wait_for, wait_state, write_script
from test_hardening import host_process
from test_lease import OTHER
from test_monitoring import free_port, scrape, value

from gq import defaults, policies
from gq.exec import lease as lease_module
from gq.exec.host import Host
from gq.exec.lanes import lendable
from gq.exec.lease import LoanPage, SharedPage, WorkerLease
from gq.exec.protocol import (FROM_WORKER, Channel, Done, Go, Lent, Ready, Suspend,
                              WorkerChannel, encode)
from gq.exec.residents import LaneState, Resident
from gq.policies.base import JobView


# ----- the rule ----------------------------------------------------------------------
def _job(job_id: int, iteration: float | None, gap: float | None) -> JobView:
    return JobView(id=job_id, mean_iteration=iteration, mean_gap=gap, released_at=0.0)


@pytest.mark.parametrize("first, second, fair, others", [
    ((0.003, 0.0025), (0.003, 0.0025), True, True),  # gaps too long to keep the lane for
    ((0.0004, 0.001), (0.0004, 0.001), True, False),  # short gaps each iteration fits in
    ((0.001, 0.001), (0.001, 0.0015), True, False),  # srtf would keep the lane for one
    ((0.001, 0.003), (0.0005, 0.001), True, False),  # one gap kept, the other not
    ((0.0015, 0.001), (0.0004, 0.001), False, False),  # the first does not fit in a kept gap
    ((0.0004, 0.0001), (0.0004, 0.001), False, False),  # a tight loop: the lane is kept for it
    ((None, 0.01), (0.001, 0.01), False, False),  # not measured yet
    ((0.001, None), (0.001, 0.01), False, False),
])
def test_two_jobs_are_lent_their_lane_only_where_no_choice_of_the_policy_is_met(
        first, second, fair, others):
    """Where no gap is short enough to keep the lane for, every lending policy's choice is
    whoever asks; where one is, only fair (whose shares even out a job asking late in the
    other's gap) is lent it, and only where each iteration fits in the other's gap."""
    a, b = _job(1, *first), _job(2, *second)
    for name in ("fair", "srtf", "rr", "deadline"):
        expected = fair if name == "fair" else others
        assert lendable(policies.make(name), a, b) is expected, name
        assert lendable(policies.make(name), b, a) is expected, name


def test_fifo_and_priority_never_lend_a_lane():
    """fifo runs only the first resident; priority fills a high job's gap only with what
    fits in it, wherever the low job asks."""
    a, b = _job(1, 0.001, 0.01), _job(2, 0.001, 0.01)
    assert not lendable(policies.make("fifo"), a, b)
    for fill in ("gapfit", "always", "never"):
        assert not lendable(policies.make("priority", fill), a, b)


# ----- the worker's side, in one process ---------------------------------------------
def _pages() -> list[tuple[SharedPage, WorkerLease]]:
    """Two jobs' pages, as the host makes them, and each job's worker side."""
    made = []
    for _ in range(2):
        page, fd = SharedPage.create()
        made.append((page, WorkerLease(SharedPage.attach(fd))))
    return made


def _lend(number: int, holder, mate, send_to_mate: bool = True) -> LoanPage:
    """What the granter's _lend does: the loan's page sent to both, their pages made ready."""
    loan, fd = LoanPage.create()
    for (page, worker), inside in ((holder, True), (mate, False)):
        if inside or send_to_mate:
            worker.lent(number, os.dup(fd))
        page.drain()
        page.lend(number)
        page.want(False)
        if not inside:
            page.give()
    os.close(fd)
    return loan


def test_a_lent_lane_passes_from_job_to_job_by_its_token_alone():
    (page_a, a), (page_b, b) = mine = _pages()
    b.released_unleased(time.monotonic_ns())  # its last iteration ended with a Done
    loan = _lend(1, *mine)
    a.granted(True, 0)  # the Go that starts the loan: a holds the token
    assert a.loan == 1 and loan.count() == 0
    took = []
    waiter = threading.Thread(target=lambda: took.append((b.take(1), time.monotonic())))
    waiter.start()  # b takes up its offer and waits for a's iteration to end
    time.sleep(0.05)
    assert not took and waiter.is_alive()
    released = time.monotonic()
    assert a.release(1, None, None)  # still lent: no Done
    waiter.join(2)
    assert took and took[0][0] and b.loan == 1 and took[0][1] >= released
    assert page_b.count() == 0 and loan.count() == 0  # b inside its iteration
    assert page_a.count() == 1  # a in its gap: the host would take its semaphore
    assert b.release(2, None, None) and loan.count() == 1
    assert a.take(2) and page_b.read().iterations == 1
    figures = page_b.read()
    assert figures.gaps == 1 and figures.gap_ns < 0.04e9  # its wait is no gap of its own


def test_a_job_waiting_for_the_token_stops_when_the_host_wants_the_lane_back():
    (page_a, a), (page_b, b) = mine = _pages()
    loan = _lend(1, *mine)
    a.granted(True, 0)
    took = []
    waiter = threading.Thread(target=lambda: took.append(b.take(1)))
    waiter.start()
    time.sleep(0.02)
    page_b.want(True)  # a third job asks: the host ends the loan
    assert page_b.try_take()  # b is not inside an iteration
    waiter.join(10 * defaults.LOAN_WAIT_SLICE + 1)
    assert took == [False] and not b.active and b.spent == 1 and not b.loans
    assert loan.count() == 0  # it took nothing
    page_a.want(True)
    assert not page_a.try_take()  # a is inside: it gives the lane back with a Done
    assert not a.release(1, None, None) and not a.active
    assert loan.count() == 1
    page_b.give()  # the host's take above; b's page still names loan 1, and wants nothing
    page_b.want(False)
    assert not b.take(2) and not b.active  # the loan it left is never taken up again
    second = _lend(2, (page_b, b), (page_a, a))  # a new loan, the other way round
    b.granted(True, 2)
    assert b.loan == 2 and second.count() == 0 and loan.count() == 1  # a page of its own
    assert b.release(3, None, None) and second.count() == 1
    assert a.take(3) and a.loan == 2 and second.count() == 0  # a takes up the new offer


def test_a_job_whose_loan_ended_in_its_gap_unseen_takes_the_next_loan_s_token():
    """The host ends a loan while a job is in its gap (it takes the job's semaphore; the job
    reads nothing) and then lends the lane again: the job's next acquire is under the new
    loan, whose token the other job holds, not the old one's."""
    (page_a, a), (page_b, b) = mine = _pages()
    b.released_unleased(time.monotonic_ns())
    first = _lend(1, *mine)
    a.granted(True, 0)
    assert a.release(1, None, None)
    assert b.take(1) and b.release(1, None, None) and b.active and b.loan == 1
    for page in (page_a, page_b):  # the recall: both in their gaps
        page.want(True)
        assert page.try_take()
    second = _lend(2, (page_a, a), (page_b, b))
    a.granted(True, 2)  # a holds the new loan's token
    took = []
    waiter = threading.Thread(target=lambda: took.append(b.take(2)))
    waiter.start()
    time.sleep(0.05)
    assert not took, "it took the lane on the ended loan's token"
    assert first.count() == 1 and second.count() == 0
    assert a.release(2, None, None)
    waiter.join(2)
    assert took == [True] and b.loan == 2 and b.spent == 1 and second.count() == 0


def test_a_job_waiting_on_an_ended_loan_s_token_moves_to_the_next_loan():
    """The host ends the loan and lends the lane anew while a job waits for the token (one
    holding the old token in its gap, then asking, does exactly that): the waiting job
    takes the new loan's token, not the old one's, which is never given back."""
    (page_a, a), (page_b, b) = mine = _pages()
    b.released_unleased(time.monotonic_ns())
    _lend(1, *mine)
    a.granted(True, 0)  # holds token 1 and never gives it
    took = []
    waiter = threading.Thread(target=lambda: took.append(b.take(1)))
    waiter.start()
    time.sleep(0.02)
    page_b.want(True)  # the recall (b in its gap: its semaphore taken) ...
    assert page_b.try_take()
    second = _lend(2, *mine)  # ... and a new loan within one wait, b its mate again
    time.sleep(0.02)
    assert not took  # it waits for the new token now, which a holds
    lease_module._sem_post(second.token)  # a's release under the new loan
    waiter.join(2)
    assert took == [True] and b.loan == 2 and b.spent == 1 and second.count() == 0


def test_steps_counted_between_iterations_under_a_loan_go_in_a_message():
    """Its own semaphore taken outside an iteration would tell the host it is inside one."""
    (page_a, a), (page_b, b) = mine = _pages()
    _lend(1, *mine)
    a.granted(True, 0)
    assert a.release(1, None, None) and page_a.count() == 1
    assert not a.note_steps(5) and a.active and page_a.count() == 1


def test_a_job_that_read_its_page_before_a_recall_and_a_new_loan_takes_the_new_token():
    """A job reads its page (nothing wanted, loan 1), then is held up before it takes its
    semaphore; meanwhile the host ends loan 1 and lends the lane anew (loan 2, whose token
    the other job holds), giving its semaphore back for loan 2. It finds that out once it
    holds its semaphore, and waits for loan 2's token instead of running on loan 1's."""
    (page_a, a), (page_b, b) = mine = _pages()
    b.released_unleased(time.monotonic_ns())
    first = _lend(1, *mine)
    a.granted(True, 0)
    assert a.release(1, None, None) and b.take(1) and b.release(1, None, None)
    assert a.take(2) and a.release(2, None, None)  # token 1 free, both in their gaps
    host_turn = []
    real_take = b.page.try_take

    def held_up() -> bool:
        if not host_turn:  # what the host does while this job is held up
            for page in (page_a, page_b):
                page.want(True)
                assert page.try_take()
            host_turn.append(_lend(2, *mine))
            a.granted(True, 3)  # a holds loan 2's token
        return real_take()

    b.page.try_take = held_up
    took = []
    waiter = threading.Thread(target=lambda: took.append(b.take(2)))
    waiter.start()
    time.sleep(0.05)
    assert not took and page_b.count() == 1, "it ran on the ended loan's token"
    assert first.count() == 1  # given back
    assert a.release(3, None, None)
    waiter.join(2)
    assert took == [True] and b.loan == 2 and host_turn[0].count() == 0


def test_a_loan_page_sent_again_under_its_number_leaves_the_one_kept():
    """Its token may be the one the job holds or waits on: unmapped, its next post would
    write into whatever is mapped there then."""
    (_, a), _ = _pages()
    _, old_fd = LoanPage.create()
    a.lent(7, old_fd)
    kept = a.loans[7]
    a.page.lend(7)
    a.granted(True, 0)  # under loan 7, holding its token
    _, new_fd = LoanPage.create()
    a.lent(7, new_fd)
    assert a.loans[7] is kept and not kept.map.closed and a.token is kept.token


def test_a_release_asked_back_writes_nothing_on_its_page_after_giving_the_lane():
    """The host that takes the semaphore a release gives reads the page as final: a write
    after it (a half-written page, read then) would end an honest job."""
    from gq.exec.worker import WorkerSession

    page, fd = SharedPage.create()
    worker_end, host_end = socket.socketpair()
    session = WorkerSession(WorkerChannel(worker_end), None, SharedPage.attach(fd))
    session.lease.granted(True, 0)
    session.held = True
    given = []
    worker_page = session.lease.page
    real_give = worker_page.give
    worker_page.give = lambda: (real_give(), given.append(worker_page.sequence()))
    page.want(True)  # another job is ready: the host asks for the lane back
    session.release()
    assert given and page.sequence() == given[0], "written after the lane was given"
    assert host_end.recv(4096)  # its Done
    host_end.close()


def test_a_loan_whose_page_never_came_is_not_taken_up():
    (page_a, a), (page_b, b) = mine = _pages()
    _lend(1, *mine, send_to_mate=False)
    fetched = []
    b.fetch = lambda: fetched.append(True)  # it reads its socket for the page: none there
    assert not b.take(1) and not b.active and fetched  # it asks with READY instead
    a.granted(True, 0)
    a.lent(2, os.dup(LoanPage.create()[1]))
    assert set(a.loans) == {1, 2}  # the one it is under is kept
    a.lent(3, os.dup(LoanPage.create()[1]))
    assert set(a.loans) == {1, 3}  # an older one it is not under is dropped


def test_a_lease_offered_in_a_gap_begins_with_a_gap_which_is_plausible():
    from gq.exec.lease import Figures, implausible

    base = Figures(iterations=4, gaps=4)
    now = Figures(iterations=4, gaps=5, since_ns=1)
    assert implausible(base, now, base, lease_ns=10 ** 9, now_ns=10) is None
    assert "gaps after" in implausible(base, Figures(iterations=4, gaps=6), base,
                                       lease_ns=10 ** 9, now_ns=10)


# ----- a real host, workers driven by hand ----------------------------------------------
class _Lane:
    """A Host on the cpu with one lane under fair, and jobs whose workers the test drives:
    each a Resident with a page and a socket pair, and its worker's lease and channel."""

    def __init__(self):
        self.host = Host("cpu", False, 1, socket.socket(socket.AF_UNIX), 1.0)
        self.host.granter.policy = policies.make("fair")
        self.host.freeze = lambda job, stop: setattr(job, "frozen", stop)
        self.killed: list[tuple[int, object]] = []  # no processes here: kills are noted
        self.host.kill = lambda job, why, grace=0.0: self.killed.append((job.job_id, why))
        self.lane = self.host.lanes[0]
        self.workers: dict[int, tuple[WorkerLease, WorkerChannel]] = {}

    def job(self, job_id: int) -> Resident:
        page, fd = SharedPage.create()
        lease = WorkerLease(SharedPage.attach(fd))
        host_end, worker_end = socket.socketpair()
        host_end.setblocking(False)
        worker_end.setblocking(False)
        resident = Resident(job_id=job_id, run=1, user=f"u{job_id}", priority=0,
                            submit_time=job_id, declared_total=None, lane=0, process=None,
                            channel=Channel(host_end, FROM_WORKER, chunk=defaults.WORKER_READ),
                            started_at=time.monotonic(), started_wall=time.time(), page=page)
        # Measured: 1 ms iterations between 10 ms gaps (too long to keep the lane for).
        resident.iterations, resident.attained, resident.first_iteration = 3, 0.003, 0.001
        resident.gaps, resident.gap_total = 2, 0.02
        resident.released_at = time.monotonic()
        lease.released_unleased(time.monotonic_ns())
        channel = WorkerChannel(worker_end)
        lease.fetch = lambda: self.received(job_id)
        self.host.residents[job_id] = resident
        self.lane.residents.append(resident)
        self.workers[job_id] = (lease, channel)
        return resident

    def say(self, resident: Resident, message) -> None:
        self.workers[resident.job_id][1].sock.sendall(encode(message))
        select.select([resident.channel.sock], [], [], 1)
        self.host.granter.from_worker(resident)

    def received(self, job_id: int) -> list:
        """What the host sent the job's worker (a loan's page goes to its lease)."""
        lease, channel = self.workers[job_id]
        got = []
        while True:
            try:
                channel.fill(socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            message = channel.next_buffered()
            if message is None:
                return got
            if isinstance(message[0], Lent):
                lease.lent(message[0].number, message[1][0])
            else:
                got.append(message[0])


def test_a_loan_whose_token_was_given_twice_frees_the_lane_only_when_both_are_out():
    """A job that gave the token back more often than it took it lets both jobs inside an
    iteration at once: a third job that asks then waits until both have ended theirs, and
    a suspend of the one that is not the lane's holder neither stalls it nor the lane."""
    lane = _Lane()
    first, second = lane.job(1), lane.job(2)
    a, b = lane.workers[1][0], lane.workers[2][0]
    lane.say(first, Ready())
    go = lane.received(1)[-1]
    a.granted(go.lease, 0)
    assert lane.lane.loan is not None and a.loan == lane.lane.loan.number
    lease_module._sem_post(a.token)  # the misdeed: the token given without being taken
    assert b.take(0)  # both inside an iteration now
    third = lane.job(3)
    third.iterations = third.gaps = 0
    lane.say(third, Ready())  # the loan ends: both are found inside
    assert lane.lane.loan is None and first.closing and second.closing
    assert lane.lane.holder is first and third.state is LaneState.READY
    lane.host._on_suspend(Suspend(job=2, suspended=True))  # the one not holding the lane
    assert second.state is LaneState.READY and second.thaw_on_grant
    assert not a.release(1, None, None)  # it sees the host wants the lane back
    lane.say(first, Done(1))
    assert lane.lane.holder is third and third.state is LaneState.RUNNING  # granted now, with a Go
    assert any(isinstance(m, Go) for m in lane.received(3))
    lane.say(third, Done(1))
    lane.host._on_suspend(Suspend(job=2, suspended=False))  # resumed inside its iteration:
    assert lane.lane.holder is second and not second.frozen  # it goes on with the lane
    assert not b.release(1, None, None)
    lane.say(second, Done(1))
    assert lane.lane.holder is None and second.state is LaneState.IDLE and second.iterations == 4


def test_a_job_offered_a_loan_after_its_done_was_read_late_keeps_its_job():
    """Its lease's first gap runs from its release as its page says, not from when the
    host read the Done that said so."""
    lane = _Lane()
    first, second = lane.job(1), lane.job(2)
    a, b = lane.workers[1][0], lane.workers[2][0]
    b.released_unleased(time.monotonic_ns())
    time.sleep(0.12)
    second.released_at = time.monotonic()  # the host read its Done 120 ms late
    lane.say(first, Ready())
    a.granted(lane.received(1)[-1].lease, 0)
    assert lane.lane.loan is not None
    assert a.release(1, None, None) and b.take(1)
    lane.host.granter.schedule(lane.lane)  # the host reads both pages
    assert not lane.killed and lane.lane.loan is not None


def test_a_loan_number_is_never_used_twice():
    """A loan whose page could not be sent to both is not made, and its number is not made
    again: the job that got its page keeps it, and must not take its token later."""
    lane = _Lane()
    first, second = lane.job(1), lane.job(2)
    a = lane.workers[1][0]
    lane.workers[2][1].sock.close()  # its worker is gone: the page cannot reach it
    lane.say(first, Ready())
    assert lane.lane.loan is None and lane.lane.holder is first
    lane.received(1)
    assert set(a.loans) == {1}
    a.granted(False, 0)
    lane.host.granter.drop_channel(second)
    third = lane.job(3)
    lane.say(first, Done(1))
    lane.say(first, Ready())
    a.granted(lane.received(1)[-1].lease, 1)
    assert lane.lane.loan is not None and lane.lane.loan.number == 2 == a.loan
    assert third.leased


@pytest.mark.parametrize("ending", ["a member asks", "the figures change"])
def test_a_token_given_twice_is_seen_however_the_loan_ends(ending, caplog):
    """A job gives the token back more often than it took it, and the loan ends before the
    host looked at the token for it (a member asks with READY, or its figures stop fitting:
    the very overlap a doubled token allows can shift them): the host sees the misdeed as it
    ends the loan, says so once, and lends those two nothing more."""
    lane = _Lane()
    first, second = lane.job(1), lane.job(2)
    a = lane.workers[1][0]
    lane.say(first, Ready())
    a.granted(lane.received(1)[-1].lease, 0)
    assert lane.lane.loan is not None
    assert a.release(1, None, None)
    lease_module._sem_post(a.token)  # the misdeed: given once more than taken
    if ending == "a member asks":
        lane.say(second, Ready())
    else:
        second.gap_total = 0.0  # its gaps now too short for the other's iteration
        lane.host.granter.schedule(lane.lane)
    assert lane.lane.loan is None and lane.lane.unlendable == {1, 2}
    assert caplog.text.count("its token was given back more often than taken") == 1


def test_a_semaphore_written_over_ends_the_loan():
    """A count no sem_post could make (a job wrote over the token, or over its own
    semaphore to hide that it holds the token) breaks the loan's rules."""
    for target in ("token", "own"):
        lane = _Lane()
        first = lane.job(1)
        lane.job(2)
        a = lane.workers[1][0]
        lane.say(first, Ready())
        a.granted(lane.received(1)[-1].lease, 0)
        assert lane.lane.loan is not None
        written = a.loans[a.loan].map if target == "token" else a.page.map
        written[0:4] = b"\xff\xff\xff\xff"
        lane.host.granter.schedule(lane.lane)
        assert lane.lane.loan is None and lane.lane.unlendable == {1, 2}, target


def test_a_third_job_waits_while_both_of_a_loan_s_jobs_are_inside_an_iteration():
    lane = _Lane()
    first, second = lane.job(1), lane.job(2)
    a, b = lane.workers[1][0], lane.workers[2][0]
    lane.say(first, Ready())
    a.granted(lane.received(1)[-1].lease, 0)
    lease_module._sem_post(a.token)
    assert b.take(0)
    third = lane.job(3)
    third.iterations = third.gaps = 0
    lane.say(third, Ready())
    assert not a.release(1, None, None)
    lane.say(first, Done(1))
    assert third.state is LaneState.READY and lane.lane.holder is None  # the second is still inside
    assert not any(isinstance(m, Go) for m in lane.received(3))
    assert not b.release(1, None, None)
    lane.say(second, Done(1))
    assert third.state is LaneState.RUNNING and lane.lane.holder is third


# ----- with a daemon, a host and workers ----------------------------------------------
PAIR = '''
import json, os, sys, time
import gq
from gq.exec import lease as lease_module
from gq.exec import runtime

name, steps = sys.argv[1], int(sys.argv[2])
gap, body = float(sys.argv[3]) / 1000, float(sys.argv[4]) / 1000
misdeed = sys.argv[5] if len(sys.argv) > 5 else ""
lease = runtime.active.lease
log = open(f"{name}.jsonl", "a", buffering=1)
open(f"{name}.ready", "w").close()
while not os.path.exists("go"):
    time.sleep(0.01)
done_misdeed = False


def items():
    global done_misdeed
    for i in range(steps):
        if misdeed == "hold" and lease.loan and not done_misdeed and i > 30:
            done_misdeed = True
            token = lease.token  # held in its gap, outside any iteration, for 3 s
            while lease_module._sem_trywait(token) != 0:
                time.sleep(0.0005)
            log.write(json.dumps({"held": time.monotonic()}) + "\\n")
            time.sleep(3)
            lease_module._sem_post(token)
        time.sleep(gap)
        yield i


def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


for i in gq.steps(items()):
    begin = time.monotonic()
    spin(body)
    if misdeed == "forge" and lease.loan and not done_misdeed:
        done_misdeed = True
        for _ in range(3):
            lease_module._sem_post(lease.token)
    log.write(json.dumps({"i": i, "begin": begin, "end": time.monotonic(),
                          "loan": lease.loan}) + "\\n")
'''

def _iterations(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [line for line in map(json.loads, text.splitlines()) if "i" in line]


def _start_pair(tmp_path: Path, steps: int, *misdeeds: str) -> tuple[int, int]:
    """Two PAIR jobs on the one lane of the cpu device, started together: 2 ms iterations
    between 6 ms gaps (too long to keep the lane for)."""
    script = str(write_script(tmp_path / "pair.py", PAIR))
    # Declared: each joins the lane at once, not after the other's first figures.
    ids = tuple(submit("--gpu-mem", "256M", script, name, str(steps), "6", "2", misdeed)
                for name, misdeed in zip("ab", (*misdeeds, "", "")))
    wait_for(lambda: all((tmp_path / f"{name}.ready").exists() for name in "ab"), 60,
             what="both jobs to be resident")
    (tmp_path / "go").touch()
    return ids


def _never_at_once(*logs: list[dict]) -> None:
    spans = sorted((line["begin"], line["end"]) for log in logs for line in log)
    for (_, end), (begin, _) in zip(spans, spans[1:]):
        assert begin >= end, "two iterations held the lane at once"


def test_two_jobs_that_fit_in_each_others_gaps_share_a_lent_lane(home, tmp_path):
    port = free_port()
    gq_ok("daemon", "start", "--kill-wait", "1", "--metrics", f"127.0.0.1:{port}")
    gq_ok("policy", "set", "fair")
    first, second = _start_pair(tmp_path, 300)
    for job_id in (first, second):
        info = wait_state(job_id, "COMPLETED", timeout=120)
        assert info["steps_done"] == 300
        assert 300 * 0.002 * 0.9 <= info["attained"] < 30  # the pages' figures, taken in
    a, b = _iterations(tmp_path / "a.jsonl"), _iterations(tmp_path / "b.jsonl")
    lent = [sum(1 for line in log if line["loan"]) for log in (a, b)]
    assert min(lent) >= 150, lent  # most of them: after the first few, measured
    _never_at_once(a, b)  # the token held the lane as the host would
    # Switches under a loan are counted from the two jobs' iterations (they alternate).
    wait_for(lambda: (value(scrape(port).get("gq_lane_switches", []), "gq_lane_switches_total",
                            device="cpu") or 0) >= 100, 15, what="the loan's switches counted")


def test_a_third_job_that_asks_ends_the_loan_and_the_two_are_lent_the_lane_again_after(
        daemon, tmp_path):
    gq_ok("policy", "set", "fair")
    _start_pair(tmp_path, 700)
    wait_for(lambda: all(any(line["loan"] for line in _iterations(tmp_path / f"{n}.jsonl"))
                         for n in "ab"), 60, what="the lane lent to both jobs")
    third = submit(str(write_script(tmp_path / "c.py", OTHER)))  # marks b.started, b.ended
    assert wait_state(third, "COMPLETED", timeout=60)["steps_done"] == 30
    started = json.loads((tmp_path / "b.started").read_text())
    ended = json.loads((tmp_path / "b.ended").read_text())
    wait_for(lambda: all(any(line["begin"] > ended and line["loan"]
                             for line in _iterations(tmp_path / f"{n}.jsonl")) for n in "ab"),
             60, what="the lane lent to the two again")
    a, b = _iterations(tmp_path / "a.jsonl"), _iterations(tmp_path / "b.jsonl")
    meanwhile = [line for line in a + b if started < line["begin"] < ended]
    assert meanwhile and not any(line["loan"] for line in meanwhile), meanwhile
    before = max(line["loan"] for line in a + b if line["begin"] < started)
    after = min(line["loan"] for line in a + b if line["begin"] > ended and line["loan"])
    assert after > before  # a new loan, with a token of its own
    _never_at_once(a, b)


LOOKS = '''
import os
import gq

found = [line for line in open("/proc/self/maps") if "gq-loan" in line]
for fd in os.listdir("/proc/self/fd"):
    try:
        if "gq-loan" in os.readlink(f"/proc/self/fd/{fd}"):
            found.append(fd)
    except OSError:
        pass
with open(sys.argv[1], "w") as out:
    out.write(repr(found))
'''


def test_a_job_placed_on_a_lent_lane_is_sent_nothing_of_the_loan(daemon, tmp_path):
    """Only the two jobs a loan is made for get its page: a job that comes to the lane
    meanwhile (and asks for nothing) has no way to its token. Each look must find nothing;
    at least one must have been made while a loan stood from before the job came until
    after it looked (on a busy machine a loan may end meanwhile: its figures stop fitting,
    say; the look is then made again)."""
    gq_ok("policy", "set", "fair")
    _start_pair(tmp_path, 3000)
    wait_for(lambda: all(any(line["loan"] for line in _iterations(tmp_path / f"{n}.jsonl"))
                         for n in "ab"), 60, what="the lane lent to both jobs")
    script = str(write_script(tmp_path / "c.py", "import sys\n" + LOOKS))
    for attempt in range(3):
        loan = _iterations(tmp_path / "a.jsonl")[-1]["loan"]
        out = tmp_path / f"looked-{attempt}"
        third = submit("--gpu-mem", "256M", script, out.name)
        assert wait_state(third, "COMPLETED", timeout=60)["exit_code"] == 0
        assert out.read_text() == "[]"
        looked = os.stat(out).st_mtime_ns / 1e9 - time.time() + time.monotonic()

        def spanned() -> bool:
            """The loan from before it came, still on after it looked (a number is never
            made twice), so there to find; False once the pair has moved past it."""
            lines = _iterations(tmp_path / "a.jsonl")
            return loan != 0 and any(line["loan"] == loan and line["begin"] > looked
                                     for line in lines)

        try:
            wait_for(lambda: spanned() or _iterations(tmp_path / "a.jsonl")[-1]["loan"]
                     not in (0, loan), 30, what="the pair's next loan, or the same one on")
        except AssertionError:
            continue
        if spanned():
            return
    pytest.fail("no look was made while one loan stood throughout")


@pytest.mark.parametrize("misdeed, problem", [
    ("forge", "given back more often than taken"),
    ("hold", "held outside any iteration"),
])
def test_a_job_that_breaks_a_loan_s_rules_costs_the_other_a_moment_and_loses_its_loans(
        daemon, tmp_path, misdeed, problem):
    """A job that gives the token back more than it took it, or holds it in its gap: the
    host sees it on the token, ends the loan, and lends these two nothing more; the other
    job runs on (through the host), and the host never goes down."""
    gq_ok("policy", "set", "fair")
    host = host_process(daemon.pid())
    hostile, honest = _start_pair(tmp_path, 600, misdeed)
    assert wait_state(honest, "COMPLETED", timeout=120)["steps_done"] == 600
    assert wait_state(hostile, "COMPLETED", timeout=120)["steps_done"] == 600
    log = (daemon.root / "hosts" / "cpu.log").read_text()
    first, second = sorted((hostile, honest))
    assert f"its token was {problem}; jobs {first} and {second} take turns through the " \
           f"host" in log, log[-2000:]
    b = _iterations(tmp_path / "b.jsonl")
    assert any(line["loan"] for line in b)  # it was lent the lane
    assert not any(line["loan"] for line in b[-100:])  # and, once broken, never again
    if misdeed == "hold":
        begins = [line["begin"] for line in b]
        longest = max(later - earlier for earlier, later in zip(begins, begins[1:]))
        # The hostile job held the token for 3 s; the other waited a moment of it only.
        assert longest < defaults.LOAN_SILENT_LIMIT + 1.5, longest
    assert host_process(daemon.pid()).pid == host.pid
    assert not job(honest).get("reason"), job(honest)
