"""No job can break a lane: what a hostile job does to the memory it shares with its host,
or to its lane's protocol, costs no one but itself. Each attack an earlier review found is
run here against a real daemon, host and workers: the host lives, the neighbour completes
with its share, and nothing is shared between two jobs."""

from __future__ import annotations

import json

from test_reliability import host_process

from conftest import gq_ok, job, submit, wait_for, wait_state, write_script

# 10 ms of work an iteration, each one's end noted in argv[1], argv[2] iterations.
LOOP = """
log = open(sys.argv[1], "a", buffering=1)
for i in gq.steps(range(int(sys.argv[2]))):
    begin = time.monotonic()
    while time.monotonic() - begin < 0.01:
        pass
    log.write(json.dumps(time.monotonic()) + "\\n")
"""

# Scribbles random words over the first WORDS words of its page (argv[3]; the first 8 are
# where the semaphore a host once posted on lay), from a thread, all the time, while it
# iterates, alone and beside another job; notes its iterations.
SCRIBBLER = (
    """
import json, os, random, sys, threading, time
import gq
from gq.exec.job import session as job_session

page = job_session.active.lease.page
words = min(int(sys.argv[3]), len(page.map) // 8)


def scribble():
    while True:
        for _ in range(64):
            at = random.randrange(words) * 8
            page.map[at:at + 8] = random.getrandbits(64).to_bytes(8, "little")
        time.sleep(0.0005)


threading.Thread(target=scribble, daemon=True).start()
"""
    + LOOP
)

HONEST = (
    """
import json, os, stat, sys, time
import gq
from gq.exec.job import session as job_session

page = job_session.active.lease.page
mine = []  # what another process could share with it: sockets, pipes, shared memory
for fd in os.listdir("/proc/self/fd"):
    try:
        found = os.stat(f"/proc/self/fd/{fd}")
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if (stat.S_ISSOCK(found.st_mode) or stat.S_ISFIFO(found.st_mode)
            or target.startswith("/memfd:")):
        mine.append([found.st_dev, found.st_ino])
assert [os.fstat(page.fd).st_dev, os.fstat(page.fd).st_ino] in mine
with open(sys.argv[1] + ".inodes", "w") as out:
    json.dump(sorted(mine), out)
"""
    + LOOP
)


def _times(path) -> list[float]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_that_scribbles_over_its_page_costs_no_one_else_anything(daemon, tmp_path):
    """Random words where a semaphore once lay, all the time: the host's calls on the page
    are the kernel's lock and reads it checks, so the host lives, and the job, which asks
    with READY whenever its page no longer offers it its lease, runs on beside a neighbour
    that has its share. Over the whole page (its counts too), the job ends itself."""
    gq_ok("policy", "set", "fair")
    host = host_process(daemon.pid())
    script = str(write_script(tmp_path / "h.py", SCRIBBLER))
    everywhere = submit("--gpu-mem", "64M", script, str(tmp_path / "all.log"), "400", "4096")
    ended = wait_state(everywhere, "COMPLETED", "FAILED", timeout=120)
    if ended["state"] == "FAILED":  # caught writing impossible figures: its own loss
        assert ended["reason"].startswith("protocol error"), ended["reason"]
    hostile_log, honest_log = tmp_path / "hostile.log", tmp_path / "honest.log"
    hostile = submit("--gpu-mem", "64M", script, str(hostile_log), "400", "8")
    wait_for(lambda: len(_times(hostile_log)) >= 20, 60, what="the scribbler alone a while")
    honest = submit(
        "--gpu-mem", "64M", str(write_script(tmp_path / "o.py", HONEST)), str(honest_log), "100"
    )
    assert wait_state(honest, "COMPLETED", timeout=120)["steps_done"] == 100
    assert wait_state(hostile, "COMPLETED", timeout=120)["steps_done"] == 400
    assert host_process(daemon.pid()).pid == host.pid  # the host never went down
    # While both ran, the honest job had its share of the lane (fair: about half).
    theirs, mine = _times(hostile_log), _times(honest_log)
    both = (mine[0], min(mine[-1], theirs[-1]))
    during = [t for t in theirs if both[0] <= t <= both[1]]
    if len(during) >= 10:  # the scribbler was still there for a while of it
        share = sum(both[0] <= t <= both[1] for t in mine) / (
            len(during) + len([t for t in mine if both[0] <= t <= both[1]])
        )
        assert share >= 0.35, share
    after = submit(str(write_script(tmp_path / "after.py", HONEST)), str(tmp_path / "a.log"), "10")
    assert wait_state(after, "COMPLETED", timeout=60)["steps_done"] == 10


def test_two_jobs_on_one_lane_share_no_memory_and_no_descriptor(daemon, tmp_path):
    """A page or token both jobs could write would let one break the other (a lane-mate's
    semaphore words, once): each job's page and descriptors are its own."""
    go = tmp_path / "go"
    logs = [tmp_path / f"j{n}.log" for n in range(2)]
    body = HONEST.replace(
        "log = open", f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nlog = open"
    )
    script = write_script(tmp_path / "j.py", body)
    ids = [submit("--gpu-mem", "64M", str(script), str(log), "20") for log in logs]
    wait_for(
        lambda: all((tmp_path / f"j{n}.log.inodes").exists() for n in range(2)),
        60,
        what="both jobs' descriptors",
    )
    go.touch()
    infos = [wait_state(i, "COMPLETED", timeout=60) for i in ids]
    assert infos[0]["device"] == infos[1]["device"]
    first, second = (
        {tuple(key) for key in json.loads((tmp_path / f"j{n}.log.inodes").read_text())}
        for n in range(2)
    )
    assert first and second and not first & second
    assert all(job(i)["steps_done"] == 20 for i in ids)
