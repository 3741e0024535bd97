"""Leases: a job alone on its lane crosses iteration boundaries on the page it shares with its
host, without a message (gq.exec.lease), and gives the lane back as soon as another job is
ready for it."""

from __future__ import annotations

import json
import os
import select
import selectors
import socket
import time

import pytest
from conftest import all_jobs, gq_ok, job, submit, wait_for, wait_state, write_script
from test_hardening import host_process

from gq import defaults
from gq.exec import runtime
from gq.exec.host import Host
from gq.exec.residents import LaneState, Resident
from gq.exec.lease import Figures, SharedPage, WorkerLease, implausible
from gq.exec.protocol import (FROM_WORKER, TO_WORKER, Channel, Done, Ready, Suspend,
                              WorkerChannel, encode)
from gq.exec.worker import WorkerSession


def _page() -> SharedPage:
    page, fd = SharedPage.create()
    os.close(fd)
    return page


def test_a_fresh_page_says_nothing_was_measured():
    """Its zeros would read as a job measured to hold no memory (a probe's figure of 0)."""
    page = _page()
    figures = page.read()
    assert figures == Figures() and figures.mem_peak == -1 and not page.wanted()
    page.close()


def test_a_leased_worker_counts_its_iterations_and_gaps_on_the_page():
    page = _page()
    lease = WorkerLease(page)
    lease.granted(True, steps=0)  # the Go handed the lane over: the host took nothing
    assert not page.try_take()
    for step in range(1, 4):
        time.sleep(0.002)
        assert lease.release(step, persistent=100, peak=200 + step)
        assert lease.take(step)
    time.sleep(0.002)
    assert lease.release(4, persistent=100, peak=300)
    figures = page.read()
    assert (figures.iterations, figures.gaps, figures.steps) == (4, 3, 4)
    assert figures.attained_ns >= 4 * 2_000_000 and 0 < figures.first_ns <= figures.attained_ns
    assert (figures.mem_persistent, figures.mem_peak) == (100, 300)
    assert not figures.in_iteration
    page.close()


def test_the_host_takes_the_lane_in_a_gap_and_waits_for_an_iteration_s_end():
    page = _page()
    lease = WorkerLease(page)
    lease.granted(True, steps=0)
    page.want(True)  # another job is ready: inside an iteration, the host cannot take it
    assert not page.try_take()
    assert not lease.release(1, None, None)  # ... and at its end the worker gives it back
    assert not lease.active and page.try_take()
    page.want(False)
    lease.granted(True, steps=1)
    assert lease.release(2, None, None) and lease.active
    page.want(True)  # in its gap: the host takes the lane at once
    assert page.try_take()
    assert not lease.take(2) and not lease.active  # the worker asks with READY next time
    page.close()


def test_the_lane_semaphore_holds_between_processes_of_different_users():
    page = _page()
    page.give()
    child = os.fork()
    if child == 0:  # the job's side, as another user: takes the lane, keeps it a while
        os.setgid(65534)
        os.setuid(65534)
        os._exit(0 if page.try_take() else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert not page.try_take()  # the other user's process holds it
    page.give()
    assert page.try_take()
    page.close()


def test_a_page_cannot_be_shrunk_under_the_host():
    page, fd = SharedPage.create()
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    os.close(fd)
    page.close()


@pytest.mark.parametrize("change, fragment", [
    (dict(iterations=1), "iterations went from 5 to 1"),
    (dict(attained_ns=10 ** 12), "s of iterations and gaps in a lease of"),
    (dict(iterations=10 ** 15), "iterations in a lease of"),
    (dict(gaps=50), "gaps after 5 iterations"),
    (dict(since_ns=10 ** 18), "an iteration that begins in the future"),
    (dict(mem_peak=-7), "a negative figure"),
    (dict(first_ns=10 ** 9), "a first iteration longer than all of them"),
])
def test_impossible_figures_are_named(change, fragment):
    seen = Figures(steps=5, iterations=5, attained_ns=50_000_000, gaps=4, gap_ns=1_000_000,
                   since_ns=1_000)
    now = Figures(**{**seen.__dict__, **change})
    problem = implausible(seen, now, Figures(), lease_ns=1_000_000_000, now_ns=2_000)
    assert problem is not None and fragment in problem, problem
    assert implausible(seen, seen, Figures(), lease_ns=1_000_000_000, now_ns=2_000) is None


def test_a_leased_jobs_figures_are_taken_in_as_the_host_measures_them():
    resident = Resident(job_id=1, run=1, user="u", priority=0, submit_time=0.0,
                        declared_total=10, lane=0, process=None, channel=None, started_at=0.0,
                        started_wall=0.0)
    resident.take_figures(now=100.0, figures=Figures(steps=4, iterations=4, attained_ns=700_000_000,
                                  first_ns=400_000_000, gaps=3, gap_ns=30_000_000,
                                  mem_persistent=5, mem_peak=9, steps_at_take=3))
    assert resident.iterations == 4 and resident.steps_done == 4
    assert resident.mean_iteration == pytest.approx(0.1)  # the first one's warm-up left out
    assert resident.mean_gap == pytest.approx(0.01)
    assert (resident.mem_persistent, resident.mem_peak) == (5, 9) and not resident.past_total
    resident.take_figures(now=100.0, figures=Figures(
        steps=10, iterations=6, attained_ns=900_000_000, first_ns=400_000_000, gaps=5,
        gap_ns=50_000_000, steps_at_take=10))
    assert resident.past_total  # it began an iteration with all its steps done
    assert resident.mem_peak == 9  # a page without a new sample keeps the last one
    resident.take_figures(now=100.0, figures=Figures(
        steps=10, iterations=6, attained_ns=900_000_000, first_ns=400_000_000, gaps=5,
        gap_ns=50_000_000, in_iteration=True, since_ns=200 * 10 ** 9))
    assert resident.granted_at == 100.0  # an iteration said to begin later began by now
    assert resident.progress().attained >= 0


def test_a_report_with_a_figure_past_the_wires_bounds_goes_without_its_figures():
    """Sent as it was, the daemon would drop the host's whole connection (and an exit
    report it can never take would be kept for ever)."""
    resident = Resident(job_id=3, run=1, user="u", priority=0, submit_time=0.0,
                        declared_total=None, lane=0, process=None, channel=None,
                        started_at=0.0, started_wall=0.0, attained=1e30, iterations=4)
    report = resident.progress()
    assert report.attained == 0.0 and report.mean_iteration is None and report.job == 3
    resident.attained = 2.0
    assert resident.progress().attained == 2.0


# ----- a real host and worker, driven by hand ----------------------------------------
def _spin(seconds: float) -> None:
    begin = time.monotonic()
    while time.monotonic() - begin < seconds:
        pass


def _lane_with_worker(worker) -> tuple[Host, Resident, int, socket.socket]:
    """A Host with one resident whose worker (a forked child running ``worker(session)``)
    talks to it over a socket pair and a page, as a job's does."""
    page, page_fd = SharedPage.create()
    host_end, worker_end = socket.socketpair()
    child = os.fork()
    if child == 0:
        host_end.close()
        session = WorkerSession(WorkerChannel(worker_end), None,
                                SharedPage.attach(page_fd))
        runtime.active = session
        try:
            worker(session)
        finally:
            os._exit(0)
    worker_end.close()
    os.close(page_fd)
    return (*_host_with_resident(page, host_end), child, host_end)


def _host_with_resident(page: SharedPage, host_end: socket.socket) -> tuple[Host, Resident]:
    """A Host on the cpu with one lane and one resident, job 1, whose worker speaks on
    ``host_end`` and shares ``page``."""
    host = Host("cpu", False, 1, socket.socket(socket.AF_UNIX), 1.0)
    host_end.setblocking(False)
    resident = Resident(job_id=1, run=1, user="u", priority=0, submit_time=0.0,
                        declared_total=None, lane=0, process=None,
                        channel=Channel(host_end, FROM_WORKER, chunk=defaults.WORKER_READ),
                        started_at=time.monotonic(), started_wall=time.time(), page=page)
    host.residents[1] = resident
    host.lanes[0].residents.append(resident)
    host.selector.register(host_end, selectors.EVENT_READ, resident)
    return host, resident


def _serve(host: Host, resident: Resident, sock: socket.socket, until) -> None:
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            host.granter.from_worker(resident)
    assert until(), "the host never got there"


def _one_iteration_then_ask_again(session) -> None:
    session.acquire()  # READY, then a Go with a lease
    _spin(0.1)  # the host ends the lease meanwhile
    session.count_step(runtime.EXPLICIT)
    session.release()
    _spin(0.3)
    session.acquire()  # READY: asked for the lane back, it asks for it
    os._exit(0)


def _granted_again(host: Host, resident: Resident):
    return lambda: (resident.iterations >= 1 and resident.state is LaneState.RUNNING
                    and host.lanes[0].holder is resident and not resident.closing)


def test_an_iteration_a_lease_ended_in_is_counted_once():
    host, resident, child, sock = _lane_with_worker(_one_iteration_then_ask_again)
    _serve(host, resident, sock, lambda: resident.leased)
    time.sleep(0.03)
    host.granter._end_lease(resident)  # inside its iteration: it keeps the lane until its end
    assert resident.closing and host.lanes[0].holder is resident
    _serve(host, resident, sock, _granted_again(host, resident))
    os.waitpid(child, 0)
    assert resident.iterations == 1 and resident.steps_done == 1
    assert 0.09 <= resident.attained < 0.15, resident.attained  # once, not twice
    assert host.lanes[0].holder is resident  # granted again (without a lease: it asked)


def test_a_worker_that_misses_the_request_to_give_the_lane_back_does_not_stall_it():
    """The host's request and its failed take may become visible to the worker only after
    the worker has given the lane and read the request (store-load reordering; emulated
    here by delaying the store): the worker then asks with READY, not Done, and the host
    takes that as the iteration's end instead of waiting for a Done that never comes."""
    host, resident, child, sock = _lane_with_worker(_one_iteration_then_ask_again)
    _serve(host, resident, sock, lambda: resident.leased)
    time.sleep(0.03)
    page = resident.page
    delayed = []
    real_want, real_take = page.want, page.try_take

    def late_take() -> bool:
        taken = real_take()
        time.sleep(0.15)  # the worker gives the lane and reads no request meanwhile
        real_want(delayed.pop())
        return taken

    page.want, page.try_take = delayed.append, late_take
    host.granter._end_lease(resident)
    page.want, page.try_take = real_want, real_take
    _serve(host, resident, sock, _granted_again(host, resident))
    os.waitpid(child, 0)
    assert resident.iterations == 1 and not resident.closing
    assert host.lanes[0].holder is resident  # its iteration counted, and the lane its again


def test_a_suspend_while_an_asked_back_iteration_ends_neither_stalls_nor_counts_it_twice():
    """The daemon's suspend is handled between the worker's end of that iteration and its
    Done: the Done is the suspended iteration's end, and after the resume the worker's
    READY gets a Go."""
    page, fd = SharedPage.create()
    worker = WorkerLease(SharedPage.attach(fd))
    host_end, worker_end = socket.socketpair()
    host, resident = _host_with_resident(page, host_end)
    host.freeze = lambda job, stop: setattr(job, "frozen", stop)  # no process here
    to_worker = Channel(worker_end, TO_WORKER)

    def say(message) -> None:
        worker_end.sendall(encode(message))
        select.select([host_end], [], [], 2)
        host.granter.from_worker(resident)

    say(Ready())
    worker.granted(to_worker.receive_one().lease, 0)
    assert resident.leased
    _spin(0.05)
    host.granter._end_lease(resident)  # another job is ready: the worker is inside its iteration
    _spin(0.05)
    assert not worker.release(1, None, None)  # it sees the request as it ends the iteration
    host._on_suspend(Suspend(job=1, suspended=True))
    say(Done(1))
    assert resident.iterations == 1 and 0.09 <= resident.attained < 0.2, resident.attained
    host._on_suspend(Suspend(job=1, suspended=False))
    assert not worker.take(1)  # asked back: it asks with READY
    say(Ready())
    assert select.select([worker_end], [], [], 2)[0], "no Go for the resumed job"
    assert resident.state is LaneState.RUNNING and host.lanes[0].holder is resident


# ----- with a daemon, a host and workers ----------------------------------------------
LEASED = '''
import json, os, sys, time
import gq
from gq.exec import runtime

log = open("a.jsonl", "a", buffering=1)
lease = runtime.active.lease


def items():
    for i in range(int(sys.argv[1])):
        if i == 20:  # a long gap: another job may take the lane meanwhile
            log.write(json.dumps({"gap": time.monotonic()}) + "\\n")
            waited = time.monotonic()
            while not os.path.exists("b.started") and time.monotonic() - waited < 30:
                time.sleep(0.01)
        yield i


for i in gq.steps(items()):
    log.write(json.dumps({"i": i, "at": time.monotonic(), "leased": lease.active,
                          "loan": lease.loan}) + "\\n")
    begin = time.monotonic()
    while time.monotonic() - begin < 0.01:
        pass
'''

OTHER = '''
import json, time
import gq

for i in gq.steps(range(30)):
    if i == 0:
        with open("b.started", "w") as mark:
            mark.write(json.dumps(time.monotonic()))
    time.sleep(0.01)
    if i == 29:
        with open("b.ended", "w") as mark:
            mark.write(json.dumps(time.monotonic()))
'''


def test_a_job_alone_keeps_its_lane_and_hands_it_over_in_its_gap(daemon, tmp_path):
    """Alone on its lane a job iterates under a lease: its worker sends nothing at its
    boundaries, and its figures still reach gq status. A job that becomes ready meanwhile
    gets the lane in the first job's gap (not at its next iteration's end), and once it
    has gone the first one has a lease again."""
    gq_ok("policy", "set", "rr")
    first = submit(str(write_script(tmp_path / "a.py", LEASED)), "120")
    wait_for(lambda: '"gap"' in _text(tmp_path / "a.jsonl"), 60, what="the first job's gap")
    second = submit(str(write_script(tmp_path / "b.py", OTHER)))
    assert wait_state(first, "COMPLETED", timeout=90)["steps_done"] == 120
    assert wait_state(second, "COMPLETED", timeout=30)["steps_done"] == 30
    lines = [json.loads(line) for line in _text(tmp_path / "a.jsonl").splitlines()]
    gap = next(line["gap"] for line in lines if "gap" in line)
    iterations = [line for line in lines if "i" in line]
    started = json.loads((tmp_path / "b.started").read_text())
    assert iterations[20]["at"] > started > gap  # the second job ran in the first one's gap
    probed = defaults.PROBE_ITERATIONS  # it declared no memory: measured first, with Go
    assert not any(line["leased"] for line in iterations[:probed])
    assert all(line["leased"] for line in iterations[probed:20])
    assert iterations[-1]["leased"]  # alone again
    # No lease of its own while the second job is resident: they take turns (rr gives each
    # about 100 ms), or, where a busy machine stretched both jobs' gaps past what a lane is
    # kept for, are lent the lane together (a lease each, under a loan). Which of the first
    # job's iterations fall in that time depends on how soon each asks again, which a busy
    # machine delays: read it from the second job's own marks.
    ended = json.loads((tmp_path / "b.ended").read_text())
    meanwhile = [(line["leased"], line["loan"]) for line in iterations
                 if started < line["at"] < ended]
    assert not any(leased and not loan for leased, loan in meanwhile), meanwhile
    info = job(first)
    assert 0.9 * 120 * 0.01 <= info["attained"] < 30  # the page's figures, taken in
    assert 0.008 <= info["mean_iteration"] <= 0.1


def _text(path) -> str:
    return path.read_text() if path.exists() else ""


HOSTILE = '''
import os, sys, time
import gq
from gq.exec import runtime

lease = runtime.active.lease
kind = int(sys.argv[1])


def items():
    for i in range(100000):
        if lease.active and i >= 3:
            values = lease.values
            if kind == 0:
                values[1] = -1  # fewer iterations than before
            elif kind == 1:
                values[2] += 10 ** 15  # more time inside iterations than has passed
            elif kind == 2:
                values[9] = time.monotonic_ns() + 10 ** 12  # an iteration in the future
            else:
                values[7] = -9  # a negative peak
            lease._write()
            if not lease.page.wanted():  # the host reads it from now on
                time.sleep(120)
        yield i


for i in gq.steps(items()):
    time.sleep(0.005)
'''


def test_a_worker_that_writes_impossible_figures_loses_its_job_and_nothing_else(daemon,
                                                                                tmp_path):
    host = host_process(daemon.pid())
    script = write_script(tmp_path / "hostile.py", HOSTILE)
    fragments = ["iterations went from", "of iterations and gaps in a lease of",
                 "an iteration that begins in the future", "a negative figure"]
    for kind, fragment in enumerate(fragments):
        info = wait_state(submit(str(script), str(kind)), "FAILED", timeout=60)
        assert info["reason"].startswith("protocol error: its worker wrote impossible "
                                         "figures on its page"), info["reason"]
        assert fragment in info["reason"], (fragment, info["reason"])
    assert host_process(daemon.pid()).pid == host.pid  # the host never went down
    after = submit(str(write_script(tmp_path / "ok.py", OTHER)))
    assert wait_state(after, "COMPLETED", timeout=60)["steps_done"] == 30
    assert len(all_jobs()) == len(fragments) + 1


SHRINK = '''
import os
import gq

for line in open("/proc/self/maps"):
    if "gq-lane" in line:
        span = line.split()[0]
        break
page = os.open(f"/proc/self/map_files/{span}", os.O_RDWR)
try:
    os.ftruncate(page, 0)
    print("shrunk")
except PermissionError:
    print("sealed")
for _ in gq.steps(range(20)):
    pass
'''


def test_a_job_that_tries_to_shrink_its_page_cannot(daemon, tmp_path):
    """A shrunk page would make the host's next read of it a SIGBUS: every job on the
    device would lose its host."""
    host = host_process(daemon.pid())
    info = wait_state(submit(str(write_script(tmp_path / "s.py", SHRINK))), "COMPLETED",
                      "FAILED", timeout=60)
    out = (tmp_path / f"gq-{info['id']}.out").read_text()
    assert out.splitlines()[0] == "sealed", out
    assert info["state"] == "COMPLETED" and info["steps_done"] == 20
    assert host_process(daemon.pid()).pid == host.pid
