"""Loans: two jobs whose iterations fit in each other's gaps are lent their lane and take it
from each other without asking the host (gq.exec.lease), until a third job asks or one of
them breaks the rules."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import gq_ok, job, submit, wait_for, wait_state, write_script
from test_hardening import host_process
from test_monitoring import free_port, scrape, value

from gq import defaults, policies
from gq.exec.lanes import lendable
from gq.exec.lease import LoanPage, SharedPage, WorkerLease
from gq.policies.base import JobView


# ----- the rule ----------------------------------------------------------------------
def _job(job_id: int, iteration: float | None, gap: float | None) -> JobView:
    return JobView(id=job_id, mean_iteration=iteration, mean_gap=gap, released_at=0.0)


@pytest.mark.parametrize("first, second, lent", [
    ((0.0004, 0.001), (0.0004, 0.001), True),  # each iteration fits in the other's gap
    ((0.003, 0.0025), (0.003, 0.0025), True),  # gaps too long to keep the lane for
    ((0.0015, 0.001), (0.0004, 0.001), False),  # the first does not fit in a kept gap
    ((0.0004, 0.0001), (0.0004, 0.001), False),  # a tight loop: the lane is kept for it
    ((None, 0.01), (0.001, 0.01), False),  # not measured yet
    ((0.001, None), (0.001, 0.01), False),
])
def test_two_jobs_are_lent_their_lane_only_where_no_choice_of_the_policy_is_met(first, second,
                                                                                 lent):
    a, b = _job(1, *first), _job(2, *second)
    for name in ("fair", "srtf", "rr", "deadline"):
        assert lendable(policies.make(name), a, b) is lent, name
        assert lendable(policies.make(name), b, a) is lent, name


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
    """What the host's _lend does: the loan's page sent to both, their pages made ready."""
    loan, fd = LoanPage.create()
    for (page, worker), inside in ((holder, True), (mate, False)):
        if inside or send_to_mate:
            worker.lent(number, os.dup(fd))
        page.drain()
        if not inside:
            page.give()
        page.lend(number)
        page.want(False)
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

MARKED = '''
import json, time
import gq

for i in gq.steps(range(20)):
    if i == 0:
        with open("c.started", "w") as mark:
            mark.write(json.dumps(time.monotonic()))
    time.sleep(0.005)
    if i == 19:
        with open("c.ended", "w") as mark:
            mark.write(json.dumps(time.monotonic()))
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
    third = submit(str(write_script(tmp_path / "c.py", MARKED)))
    assert wait_state(third, "COMPLETED", timeout=60)["steps_done"] == 20
    started = json.loads((tmp_path / "c.started").read_text())
    ended = json.loads((tmp_path / "c.ended").read_text())
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
with open("looked", "w") as out:
    out.write(repr(found))
'''


def test_a_job_placed_on_a_lent_lane_is_sent_nothing_of_the_loan(daemon, tmp_path):
    """Only the two jobs a loan is made for get its page: a job that comes to the lane
    meanwhile (and asks for nothing) has no way to its token."""
    gq_ok("policy", "set", "fair")
    _start_pair(tmp_path, 700)
    wait_for(lambda: all(any(line["loan"] for line in _iterations(tmp_path / f"{n}.jsonl"))
                         for n in "ab"), 60, what="the lane lent to both jobs")
    third = submit("--gpu-mem", "256M", str(write_script(tmp_path / "c.py", LOOKS)))
    assert wait_state(third, "COMPLETED", timeout=60)["exit_code"] == 0
    assert (tmp_path / "looked").read_text() == "[]"
    a = _iterations(tmp_path / "a.jsonl")
    assert a[-1]["loan"]  # the loan stood meanwhile


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
