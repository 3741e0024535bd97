"""Leases: a job alone on its lane crosses iteration boundaries on its page's lock, without a
message (gq.exec.lane.lease), gives the lane back as soon as another job is ready for it, and is
billed the lease's wall time, on no word of its own."""

from __future__ import annotations

import itertools
import json
import os
import selectors
import socket
import statistics
import time

import pytest
from test_reliability import host_process

from gq import defaults, policies
from gq.exec.host.loop import Host
from gq.exec.job import session as job_session
from gq.exec.job.messages import Ready
from gq.exec.job.worker import WorkerSession
from gq.exec.job.worker_link import WorkerChannel
from gq.exec.lane.lease import Figures, SharedPage, WorkerLease, implausible
from gq.exec.lane.residents import Resident
from gq.exec.lane.standings import Standing
from gq.exec.protocol import FROM_WORKER, Channel, encode

from conftest import all_jobs, gq_ok, job, submit, wait_for, wait_state, write_script


def _pair() -> tuple[SharedPage, SharedPage]:
    """The host's page (its lock held) and the worker's mapping of it."""
    page, fd = SharedPage.create()
    return page, SharedPage.attach(fd)


def _leased() -> tuple[SharedPage, SharedPage, WorkerLease]:
    """A page whose lease (number 1) the worker has taken up, inside its first iteration."""
    host, worker = _pair()
    lease = WorkerLease(worker)
    host.offer(1)
    host.give()
    lease.granted(1, 0)
    return host, worker, lease


def test_a_worker_whose_count_moves_to_a_better_place_never_writes_fewer_steps():
    """A worker counts steps at the best place it has seen (module calls until the first
    optimizer step, then optimizer steps): the switch takes its count from 3 to 1, which a
    host reads as an impossible page and ends the job for. The page says 3 until the new
    count passes it, as the host keeps a Done's count (never less than before)."""
    host, worker, lease = _leased()
    for step in (1, 2, 3):
        assert lease.release(step, persistent=100, peak=100) and lease.take(step)
    seen = host.read()
    assert lease.release(1, persistent=100, peak=100)  # the first optimizer step
    assert lease.take(1)
    now = host.read()
    assert implausible(seen, now, Figures(), 10**9) is None, now
    assert (now.steps, now.steps_at_take) == (3, 3)
    assert lease.release(4, persistent=100, peak=100) and host.read().steps == 4
    host.close()
    worker.close()


def test_a_fresh_page_says_nothing_was_measured_and_offers_nothing():
    """Its zeros would read as a job measured to hold no memory (a probe's figure of 0)."""
    host, worker = _pair()
    assert host.read() == Figures() and host.read().mem_peak == -1
    assert not WorkerLease(worker).take(0)  # nothing offered, and the host holds the lock
    host.close()
    worker.close()


def test_a_leased_worker_counts_its_iterations_on_the_page():
    host, worker, lease = _leased()
    assert lease.release(1, persistent=100, peak=199)
    for step in range(1, 4):
        assert lease.take(step) and not host.try_take()  # inside: the host cannot take it
        assert lease.release(step + 1, persistent=100, peak=200 + step)
    figures = host.read()
    assert (figures.iterations, figures.steps, figures.steps_at_take) == (4, 4, 3)
    assert figures.lease == 1  # the lease it took up
    assert (figures.mem_persistent, figures.mem_peak) == (100, 203)
    host.close()
    worker.close()


def test_the_host_takes_the_lane_in_a_gap_and_waits_for_an_iteration_s_end():
    host, worker, lease = _leased()
    host.offer(0)  # another job is ready: inside an iteration, the host cannot take it
    assert not host.try_take()
    assert not lease.release(1, None, None)  # ... and at its end the worker says so,
    assert not host.try_take()  # keeping the lock until its device is done (a hand-over's
    lease.hand_back()  # tail; here none: at once)
    assert host.try_take() and not lease.take(1)  # the lane is the host's: READY next
    host.offer(2)
    host.give()
    assert not lease.take(1)  # a lease offered on the page alone, with no Go: not its own
    lease.granted(2, 1)
    assert lease.release(2, None, None) and lease.take(2) and lease.release(3, None, None)
    host.offer(0)  # in its gap: the host takes the lane at once
    assert host.try_take()
    host.offer(2)  # a job that wrote the word back still finds the lock taken
    assert not lease.take(3)
    host.close()
    worker.close()


def test_a_lease_for_a_run_of_turns_begins_no_iteration_once_the_run_is_over():
    """A person's run of turns ends at a boundary the worker sees, not inside the iteration
    after it, where the host would catch it: past ``until`` it asks with READY."""
    host, worker = _pair()
    lease = WorkerLease(worker)
    host.run_until(time.monotonic_ns() + 200_000_000)
    host.offer(1)
    host.give()
    lease.granted(1, 0)
    assert lease.release(1, None, None) and lease.take(1)  # within the run: goes on
    assert lease.release(2, None, None)
    host.run_until(time.monotonic_ns() - 1)  # the run is over
    assert not lease.take(2)  # READY instead, the lock left free for the host to take
    assert host.try_take()
    host.close()
    worker.close()


def test_the_lane_lock_holds_between_processes_of_different_users():
    host, fd = SharedPage.create()
    host.give()
    child = os.fork()
    if child == 0:  # the job's side, as another user: takes the lane and exits holding it
        os.setgid(65534)
        os.setuid(65534)
        worker = SharedPage.attach(fd)
        os._exit(0 if worker.try_take() else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert not host.try_take()  # this process's copy of the job's descriptor holds it still
    os.close(fd)  # the last copy gone, as when a job's processes have all ended
    assert host.try_take()
    host.close()


def test_a_page_cannot_be_shrunk_under_the_host():
    page, fd = SharedPage.create()
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    os.close(fd)
    page.close()


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(iterations=1), "iterations went from 5 to 1"),
        (dict(steps=2), "steps went from 5 to 2"),
        (dict(iterations=10**15), "iterations in a lease of"),
        (dict(mem_peak=-7), "a negative figure"),
        (dict(steps_at_take=-1), "a negative figure"),
    ],
)
def test_impossible_figures_are_named(change, fragment):
    seen = Figures(steps=5, iterations=5)
    now = Figures(**{**seen.__dict__, **change})
    problem = implausible(seen, now, Figures(), lease_ns=1_000_000_000)
    assert problem is not None and fragment in problem, problem
    assert implausible(seen, seen, Figures(), lease_ns=1_000_000_000) is None


def _resident(**fields) -> Resident:
    return Resident(
        **{
            **dict(
                job_id=1,
                run=1,
                user="u",
                priority=0,
                submit_time=0.0,
                declared_total=10,
                lane=0,
                process=None,
                channel=None,
                started_at=0.0,
                started_wall=0.0,
            ),
            **fields,
        }
    )


def test_a_leased_jobs_page_gives_counts_and_memory_never_time():
    resident = _resident()
    resident.take_figures(
        Figures(steps=4, iterations=4, mem_persistent=5, mem_peak=9, steps_at_take=3)
    )
    assert resident.iterations == 4 and resident.steps_done == 4
    assert resident.attained == 0.0  # billed by the host alone
    assert (resident.mem_persistent, resident.mem_peak) == (5, 9) and not resident.past_total
    resident.take_figures(Figures(steps=10, iterations=6, steps_at_take=10))
    assert resident.past_total  # it began an iteration with all its steps done
    assert resident.mem_peak == 9  # a page without a new sample keeps the last one


def test_the_mean_policies_see_is_the_host_s_once_it_has_timed_two_iterations():
    """A page that claims a million iterations in a second's lease makes its mean read as a
    microsecond; srtf would pick it first for ever. It is believed only until the host has
    timed two iterations itself (the first contention)."""
    resident = _resident(attained=1.0, iterations=1_000_000)
    assert resident.mean_iteration == pytest.approx(1e-6, rel=0.01)
    for length in (0.1, 0.2, 0.2):  # the first is warm-up
        resident.time_iteration(length, 1)
    assert resident.mean_iteration == pytest.approx(0.2)


def test_a_lease_s_mean_counts_every_iteration_in_its_time_and_half_the_one_under_way():
    """A job leased from its first iteration, 7 of 30 ms counted: its lease's time was
    divided by 6 (as if its first, never timed, were out of it), and the iteration under way
    counted as none: 43 ms read where it ran 30, and its forecasts ran 1.7 s late."""
    resident = _resident(iterations=7, attained=0.21)
    assert resident.mean_iteration == pytest.approx(0.03)
    leased = _resident(
        iterations=7, attained=0.21, standing=Standing.LEASED, granted_at=time.monotonic() - 0.015
    )
    assert leased.mean_iteration == pytest.approx(0.03, rel=0.05)
    # its first iteration timed (a plain grant), the rest leased: that one stays out
    mixed = _resident(iterations=7, attained=0.28, timed=1, first_iteration=0.1)
    assert mixed.mean_iteration == pytest.approx(0.03)


def test_a_gap_timed_before_its_lease_takes_none_of_the_lease_s_iterations_time():
    """A job granted its first iteration, then idle 50 ms (a warm-up's gap, or a gap made
    that long on purpose), then leased alone for 29 iterations of 10 ms. Its lease's pace
    was split by that one gap: iteration 10 ms less a 10 ms gap, none. srtf then saw no
    time left in it and ranked it ahead of a job it samples, which a lease undisputed
    keeps waiting for its whole run. The host saw each leased iteration hold the lane
    10 ms: that is its iteration until the host times more."""
    kept = _resident(
        job_id=1, declared_total=300, iterations=30, attained=0.30, timed=1, first_iteration=0.01
    )  # (its lease over: its billed time stays as it is while the test runs)
    kept.gaps.add(0.05)
    assert kept.mean_iteration == pytest.approx(0.01)
    assert kept.mean_gap is None  # its gaps are in that pace: it ran no longer than that
    sampled = _resident(job_id=2, submit_time=1.0, declared_total=30)
    pick = policies.make("srtf").pick([kept.view(), sampled.view()], [], time.monotonic())
    assert pick is not None and pick.id == 2


def test_a_report_with_a_figure_past_the_wires_bounds_goes_without_its_figures():
    """Sent as it was, the daemon would drop the host's whole connection (and an exit
    report it can never take would be kept for ever)."""
    resident = _resident(job_id=3, declared_total=None, attained=1e30, iterations=4)
    report = resident.progress()
    assert report.attained == 0.0 and report.mean_iteration is None and report.job == 3
    resident.attained = 2.0
    assert resident.progress().attained == 2.0


# ----- a real host and worker, driven by hand ----------------------------------------
def _spin(seconds: float) -> None:
    begin = time.monotonic()
    while time.monotonic() - begin < seconds:
        pass


def _host_with_worker(worker) -> tuple[Host, Resident, int, socket.socket]:
    """A Host on the cpu with one lane and one resident, job 1, whose worker (a forked child
    running ``worker(session)``) talks to it over a socket pair and a page, as a job's does."""
    page, page_fd = SharedPage.create()
    host_end, worker_end = socket.socketpair()
    child = os.fork()
    if child == 0:
        host_end.close()
        session = WorkerSession(WorkerChannel(worker_end), None, SharedPage.attach(page_fd))
        job_session.active = session
        try:
            worker(session)
        finally:
            os._exit(0)
    worker_end.close()
    os.close(page_fd)
    host = Host("cpu", False, 1, socket.socket(socket.AF_UNIX), 1.0)
    host.granter.set_policy(policies.make("fair", "always", policies.DEFAULT_QUANTUM))
    resident = _add(host, 1, host_end, page)
    return host, resident, child, host_end


def _add(host: Host, job_id: int, sock: socket.socket, page: SharedPage | None) -> Resident:
    sock.setblocking(False)
    resident = _resident(
        job_id=job_id,
        declared_total=None,
        started_at=time.monotonic(),
        channel=Channel(sock, FROM_WORKER, chunk=defaults.WORKER_READ),
        page=page,
    )
    host.residents[job_id] = resident
    host.lanes[0].residents.append(resident)
    host.selector.register(sock, selectors.EVENT_READ, resident)
    return resident


def _serve(host: Host, until, timeout: float = 10) -> None:
    """The host's loop, as far as its workers go: their messages, and its polls."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        for key, _ in host.selector.select(0.002):
            host.granter.from_worker(key.data)
        host.granter.close_given_back()
    assert until(), "the host never got there"


def _grant_then_lease(session) -> None:
    session.acquire()  # READY, then a Go with a lease: alone, the lane is its own
    session.release()  # no message
    session.acquire()
    _spin(0.2)  # another job asks meanwhile
    session.count_step(job_session.EXPLICIT)
    session.release()  # asked back: a Done
    session.acquire()  # READY
    session.release()
    time.sleep(0.5)


def test_a_lease_asked_back_inside_an_iteration_ends_with_it_billed_its_wall_time():
    host, resident, child, _ = _host_with_worker(_grant_then_lease)
    _serve(
        host, lambda: resident.standing is Standing.LEASED and resident.page.read().iterations == 1
    )
    time.sleep(0.05)
    other_end, theirs = socket.socketpair()
    other = _add(host, 2, other_end, None)
    theirs.sendall(encode(Ready()))
    _serve(host, lambda: resident.standing is Standing.RECALLED)
    assert host.lanes[0].holder is resident  # inside its iteration: its until its end
    _serve(host, lambda: host.lanes[0].holder is other)
    assert resident.standing in (Standing.IDLE, Standing.WAITING)
    assert resident.iterations == 2 and resident.steps_done == 1
    assert resident.timed == 0  # both were leased: billed as a lease, not timed
    assert resident.attained >= 0.2, resident.attained
    os.kill(child, 9)
    os.waitpid(child, 0)


def _statement_then_pause(session) -> None:
    for _ in range(3):  # a statement's steps, under a lease: no message
        session.acquire()
        session.release()
    session.end_iteration()  # the statement is over: the lease goes back, with a Done
    time.sleep(0.5)  # the person reads its output
    session.acquire()  # the next statement asks with READY
    session.release()
    time.sleep(2)


def test_a_statement_gives_its_lease_back_as_it_ends_not_billed_the_pause_after():
    """A person's pause after a statement is no iteration: the lease ends as the statement
    does (the lane free for others, its wall time billed until then), and the next
    statement asks anew."""
    host, resident, child, _ = _host_with_worker(_statement_then_pause)
    _serve(host, lambda: resident.standing is Standing.LEASED)
    _serve(host, lambda: resident.standing is Standing.IDLE)
    assert host.lanes[0].holder is None and resident.page_iterations == 3
    billed = resident.attained
    assert resident.billed == billed  # the pause is not billed
    _serve(host, lambda: resident.standing is Standing.LEASED)  # a new lease, after READY
    assert resident.attained == billed and resident.iterations == 3
    os.kill(child, 9)
    os.waitpid(child, 0)


def _statement_interrupted_as_it_gives_back(session) -> None:
    pending: list = []
    device = session.device
    device.then = pending.append  # the device busy at each release: the give waits for it
    device.keep = lambda: pending.pop() if pending else None

    def interrupted() -> None:
        raise KeyboardInterrupt  # a Ctrl-C while the statement's tail runs

    for _ in range(3):
        session.acquire()
        session.release()
    device.finish = interrupted
    session.end_iteration()
    time.sleep(0.5)
    session.acquire()  # the next statement
    session.release()
    time.sleep(2)


def test_a_ctrl_c_as_a_statement_gives_its_lease_back_still_lets_the_lock_go():
    """Whatever the wait for the device's tail raises as a statement gives its lease back,
    the lock goes and the host hears it: a lock kept would keep the lane from every other
    job while the person reads."""
    host, resident, child, _ = _host_with_worker(_statement_interrupted_as_it_gives_back)
    _serve(host, lambda: resident.standing is Standing.LEASED)
    _serve(host, lambda: resident.standing is Standing.IDLE)
    assert host.lanes[0].holder is None
    _serve(host, lambda: resident.standing is Standing.LEASED)  # the next, granted anew
    os.kill(child, 9)
    os.waitpid(child, 0)


def test_a_ready_that_comes_before_the_host_takes_back_a_lease_asked_back_is_heard():
    """A lease asked back inside an iteration whose worker kept the lock past its end (its
    device busy) finds the word cleared at its next acquire, lets the lock go and asks with
    READY at once. Heard before the host's next try of the lock, that READY ends the lease
    and is an ask: were it dropped, the host would take the lane back on the lock alone and
    never grant the job again (turns taken a slice at a time asked leases back this way
    every 50 ms, and a job hung so)."""
    page, page_fd = SharedPage.create()
    host_end, worker_end = socket.socketpair()
    host = Host("cpu", False, 1, socket.socket(socket.AF_UNIX), 1.0)
    host.granter.set_policy(policies.make("fair", "always", policies.DEFAULT_QUANTUM))
    resident = _add(host, 1, host_end, page)
    worker = WorkerChannel(worker_end)
    lease = WorkerLease(SharedPage.attach(page_fd))
    worker.send_line(encode(Ready()))
    _serve(host, lambda: resident.standing is Standing.LEASED)
    lease.granted(worker.receive_grant().lease, 0)  # taken up: the lock is the job's
    other_end, theirs = socket.socketpair()
    other = _add(host, 2, other_end, None)
    theirs.sendall(encode(Ready()))  # fair would switch to it: the lease is asked back
    _serve(host, lambda: resident.standing is Standing.RECALLED)
    assert not lease.release(1, None, None)  # its iteration's end: the word is cleared
    lease.hand_back()
    worker.send_line(encode(Ready()))
    for _ in range(100):  # its READY before the host tries the lock again
        host.granter.from_worker(resident)
        if resident.standing is not Standing.RECALLED:
            break
        time.sleep(0.01)
    assert resident.standing is Standing.WAITING
    assert host.lanes[0].holder is other
    assert resident.attained > 0 and resident.page_iterations == 1
    page.close()
    host_end.close()
    worker_end.close()
    other_end.close()
    theirs.close()


def _lease_then_keep_lock(session) -> None:
    session.acquire()  # an iteration under the lease ...
    page = session.lease.page
    time.sleep(0.2)
    page.offer(7)  # ... whose worker writes the word back and gives the lock unasked,
    page.give()  # with no Done, and takes it again later
    time.sleep(0.3)
    page.try_take()
    time.sleep(2)


def test_a_job_that_writes_its_lease_back_keeps_the_lane_for_no_longer_than_its_iteration():
    host, resident, child, _ = _host_with_worker(_lease_then_keep_lock)
    _serve(host, lambda: resident.standing is Standing.LEASED)
    other_end, theirs = socket.socketpair()
    other = _add(host, 2, other_end, None)
    time.sleep(0.05)
    theirs.sendall(encode(Ready()))
    _serve(host, lambda: host.lanes[0].holder is other, timeout=1.0)
    assert resident.standing is Standing.IDLE
    os.kill(child, 9)
    os.waitpid(child, 0)


# ----- with a daemon, a host and workers ----------------------------------------------
LEASED = """
import json, os, sys, time
import gq
from gq.exec.job import session as job_session

log = open("a.jsonl", "a", buffering=1)
lease = job_session.active.lease


def items():
    for i in range(int(sys.argv[1])):
        if i == 20:  # a long gap: another job may take the lane meanwhile
            log.write(json.dumps({"gap": time.monotonic()}) + "\\n")
            waited = time.monotonic()
            while not os.path.exists("b.started") and time.monotonic() - waited < 30:
                time.sleep(0.01)
        yield i


for i in gq.steps(items()):
    log.write(json.dumps({"i": i, "at": time.monotonic(), "leased": lease.active}) + "\\n")
    begin = time.monotonic()
    while time.monotonic() - begin < 0.01:
        pass
"""

OTHER = """
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
"""


def test_a_job_alone_keeps_its_lane_and_gives_it_up_in_its_gap(daemon, tmp_path):
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
    ended = json.loads((tmp_path / "b.ended").read_text())
    meanwhile = [line for line in iterations if started < line["at"] < ended]
    assert not any(line["leased"] for line in meanwhile), meanwhile
    info = job(first)
    assert 0.9 * 120 * 0.01 <= info["attained"] < 60  # billed its leases' wall time
    assert 0.008 <= info["mean_iteration"] <= 0.5


def _text(path) -> str:
    return path.read_text() if path.exists() else ""


HOSTILE = """
import sys, time
import gq
from gq.exec.job import session as job_session

lease = job_session.active.lease
kind = int(sys.argv[1])


def items():
    for i in range(100000):
        if lease.page.offered() and i >= 6:
            values = lease.values
            if kind == 0:
                values[1] = -1  # fewer iterations than before
            elif kind == 1:
                values[1] += 10 ** 15  # more iterations than a lease could hold
            else:
                values[3] = -9  # a negative peak
            lease._write()
            time.sleep(120)  # the host reads it as it reports progress
        yield i


for i in gq.steps(items()):
    time.sleep(0.005)
"""


def test_a_worker_that_writes_impossible_figures_loses_its_job_and_nothing_else(daemon, tmp_path):
    host = host_process(daemon.pid())
    script = write_script(tmp_path / "hostile.py", HOSTILE)
    fragments = ["iterations went from", "iterations in a lease of", "a negative figure"]
    for kind, fragment in enumerate(fragments):
        info = wait_state(submit(str(script), str(kind)), "FAILED", timeout=60)
        assert info["reason"].startswith(
            "protocol error: its worker wrote impossible figures on its page"
        ), info["reason"]
        assert fragment in info["reason"], (fragment, info["reason"])
    assert host_process(daemon.pid()).pid == host.pid  # the host never went down
    after = submit(str(write_script(tmp_path / "ok.py", OTHER)))
    assert wait_state(after, "COMPLETED", timeout=60)["steps_done"] == 30
    assert len(all_jobs()) == len(fragments) + 1


SHRINK = """
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
"""


def test_a_job_that_tries_to_shrink_its_page_cannot(daemon, tmp_path):
    """A shrunk page would make the host's next read of it a SIGBUS: every job on the
    device would lose its host."""
    host = host_process(daemon.pid())
    info = wait_state(
        submit(str(write_script(tmp_path / "s.py", SHRINK))), "COMPLETED", "FAILED", timeout=60
    )
    out = (tmp_path / f"gq-{info['id']}.out").read_text()
    assert out.splitlines()[0] == "sealed", out
    assert info["state"] == "COMPLETED" and info["steps_done"] == 20
    assert host_process(daemon.pid()).pid == host.pid


# Logs each iteration, and whether it ran under a lease; 10 ms of sleep each.
LOGGED = """
import json, sys, time
import gq
from gq.exec.job import session as job_session

log = open(sys.argv[1], "a", buffering=1)
lease = job_session.active.lease
for i in gq.steps(range(int(sys.argv[2]))):
    log.write(json.dumps({"i": i, "at": time.monotonic(), "leased": lease.active}) + "\\n")
    time.sleep(0.01)
"""

# Marks when it asks for the lane (its READY follows at once), then iterates.
ASKS = """
import json, sys, time
import gq

with open(sys.argv[1], "w") as mark:
    mark.write(json.dumps(time.monotonic()))
for i in gq.steps(range(int(sys.argv[2]))):
    time.sleep(0.01)
"""


def _iterations(path) -> list[dict]:
    return [json.loads(line) for line in _text(path).splitlines()]


def test_a_lease_goes_on_beside_jobs_that_could_not_take_the_lane(daemon, tmp_path):
    """Under priority with --fill never, a job of priority 5 keeps its lease beside a
    priority-0 job waiting for the lane (each of its iterations used to go through the
    host, a fifth of a 1 ms loop's time); one of priority 9 arriving takes the lane (the
    lease asked back) and completes while the first still runs, which has a lease again
    once it has gone. The lowest job runs once both have ended."""
    gq_ok("policy", "set", "priority", "--fill", "never")
    logged = write_script(tmp_path / "logged.py", LOGGED)
    asks = write_script(tmp_path / "asks.py", ASKS)
    declared = ("--gpu-mem", "64M")
    # 15 s of steps: it still runs once two more jobs have started, the high one ended
    # (600 steps had ended by then once, on a loaded machine).
    first = submit(*declared, "--priority", "5", str(logged), str(tmp_path / "a.jsonl"), "1500")
    wait_for(lambda: len(_text(tmp_path / "a.jsonl").splitlines()) > 10, 60, what="its steps")
    low = submit(*declared, str(asks), str(tmp_path / "low.asked"), "20")
    wait_for((tmp_path / "low.asked").exists, 60, what="the low job to ask for the lane")
    asked = json.loads((tmp_path / "low.asked").read_text())
    wait_for(
        lambda: sum(line["at"] > asked + 0.5 for line in _iterations(tmp_path / "a.jsonl")) > 30,
        60,
        what="the first job's iterations beside the low one",
    )
    beside = [line for line in _iterations(tmp_path / "a.jsonl") if line["at"] > asked + 0.5]
    assert all(line["leased"] for line in beside), beside
    high = submit(*declared, "--priority", "9", str(asks), str(tmp_path / "high.asked"), "30")
    assert wait_state(high, "COMPLETED", timeout=60)["steps_done"] == 30
    assert job(first)["state"] == "RUNNING" and job(low)["steps_done"] == 0
    wait_for(
        lambda: any(line["leased"] for line in _iterations(tmp_path / "a.jsonl")[-5:]),
        60,
        what="the first job's lease again",
    )
    assert wait_state(first, "COMPLETED", timeout=90)["steps_done"] == 1500
    assert wait_state(low, "COMPLETED", timeout=60)["steps_done"] == 20


def test_two_jobs_under_fair_alternate_a_slice_at_a_time_under_leases(daemon, tmp_path):
    """Two loops of 3 ms iterations with no gaps share one lane under fair: each runs its
    iterations under a lease, a slice of lane time at a time (not a switch through the host
    at every boundary, which cost 1 ms loops a quarter of their time), and they still share
    the lane: while both run, neither does more than about twice the other's iterations.
    (3 ms, not 1: the gaps the host times between grants carry its messages' latency, which
    on a loaded machine can pass a tenth of a 1 ms iteration and so keep any slice off;
    bench/holder.py measures the 1 ms pair.)"""
    gq_ok("policy", "set", "fair")
    logged = write_script(tmp_path / "logged.py", LOGGED.replace("0.01", "0.003"))
    declared = ("--gpu-mem", "64M")
    first = submit(*declared, str(logged), str(tmp_path / "a.jsonl"), "600")
    second = submit(*declared, str(logged), str(tmp_path / "b.jsonl"), "600")
    for job_id in (first, second):
        assert wait_state(job_id, "COMPLETED", timeout=90)["steps_done"] == 600
    a, b = _iterations(tmp_path / "a.jsonl"), _iterations(tmp_path / "b.jsonl")
    both = (max(a[0]["at"], b[0]["at"]), min(a[-1]["at"], b[-1]["at"]))
    beside = [[line for line in job if both[0] <= line["at"] <= both[1]] for job in (a, b)]
    assert all(len(lines) > 100 for lines in beside), [len(lines) for lines in beside]
    # Most of them leased, though the two took turns all along.
    for lines in beside:
        assert sum(line["leased"] for line in lines) >= 0.8 * len(lines), lines[:50]
    turns = sorted(
        [(line["at"], 0) for line in beside[0]] + [(line["at"], 1) for line in beside[1]]
    )
    switches = sum(1 for x, y in zip(turns, turns[1:]) if x[1] != y[1])
    assert switches >= 4, switches
    counts = [len(lines) for lines in beside]
    assert max(counts) <= 2 * min(counts) + 60, counts
    # A slice at a time: runs of a job's iterations, not one each (at most twice the
    # slice's lane time, as the lease is asked back at the next look past it).
    runs = [len(list(group)) for _, group in itertools.groupby(turns, key=lambda t: t[1])]
    assert statistics.median(runs) >= 8, runs
