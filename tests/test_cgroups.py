"""Job cgroups against this machine's real kernel hierarchies: a job's processes, a
daemonised one included, are all found, counted and killed at once, and nothing is left
behind. Skipped where not root or where the hierarchy is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from gq.exec.cgroups import files as cgroup_files
from gq.exec.cgroups import job_cgroups as cgroups
from gq.exec.cgroups import tasks as cgroup_tasks
from gq.exec.cgroups.hierarchies import V2

# A daemonised child (its own session, out of the job's process group) and a plain one.
JOB = ["sh", "-c", "setsid sleep 300 & sleep 300 & wait"]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """State, session and start time of a process; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[3]), int(fields[19])


def _sessions(pids: list[int]) -> set[int]:
    return {stat[1] for stat in map(_stat, pids) if stat is not None}


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _clean(backend: cgroups.Cgroups) -> None:
    """Kill whatever a failed test left in the instance's cgroups and remove them all."""
    for base in backend.bases.values():
        for directory, _, _ in os.walk(base, topdown=False):
            leftover = cgroups.JobCgroup(directory, {"any": directory})
            leftover.kill(2.0)
            leftover.remove()


def _backend(kind: str) -> Iterator[cgroups.Cgroups]:
    if os.geteuid() != 0:
        pytest.skip("cgroups are only writable by root here")
    backend = cgroups.detect(kind, uuid.uuid4().hex[:12])
    if backend is None:
        pytest.skip(f"no usable cgroup {kind} hierarchy on this machine")
    try:
        yield backend
    finally:
        _clean(backend)
        assert not any(os.path.exists(base) for base in backend.bases.values())


@pytest.fixture(params=["v1", "v2"])
def backend(request) -> Iterator[cgroups.Cgroups]:
    yield from _backend(request.param)


@pytest.fixture
def v1() -> Iterator[cgroups.Cgroups]:
    yield from _backend("v1")


@pytest.fixture
def v2() -> Iterator[cgroups.Cgroups]:
    yield from _backend("v2")


def _kill_whole_job(backend: cgroups.Cgroups) -> None:
    """Start the job in its cgroup, see all of it there, kill it whole, leave nothing."""
    cgroup = backend.create("cpu0", 17, 2)
    assert cgroup.name == "cpu0/job-17.2"
    assert all(os.path.isdir(path) for path in cgroup.paths.values())
    process = subprocess.Popen(JOB, preexec_fn=cgroup.enter)
    try:
        assert _wait_for(lambda: cgroup.usage().processes == 3), cgroup.pids()
        pids = cgroup.pids()
        assert process.pid in pids and len(pids) == 3
        # The daemonised child leaves the job's session once it has run setsid: wait for it.
        assert _wait_for(lambda: len(_sessions(pids)) == 2), _sessions(pids)
        before = {pid: _stat(pid) for pid in pids}
        usage = cgroup.usage()
        if backend.kind == "v1" and "memory" in cgroup.paths:
            assert usage.memory is not None and usage.memory > 0
        elif usage.memory is not None:  # v2 with the memory controller offered
            assert usage.memory > 0
        cgroup.remove()  # busy: refused quietly, nothing lost
        assert all(os.path.isdir(path) for path in cgroup.paths.values())

        assert cgroup.kill(timeout=5) is True
        assert process.wait(timeout=5) == -9
        assert cgroup.pids() == [] and cgroup.usage().processes == 0
        for pid, stat in before.items():
            now = _stat(pid)
            # Gone, a zombie left for init to reap, or the pid reused by another process.
            assert now is None or now[0] in "ZX" or now[2] != stat[2], (pid, now)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    cgroup.remove()
    assert not any(os.path.exists(path) for path in cgroup.paths.values())
    backend.remove_device("cpu0")
    assert not any(os.path.exists(base) for base in backend.bases.values())


def test_kill_whole_job(backend: cgroups.Cgroups) -> None:
    _kill_whole_job(backend)


def test_v1_without_freezer_kills_listed_pids_until_empty(v1: cgroups.Cgroups) -> None:
    if set(v1.bases) <= {"freezer"}:
        pytest.skip("v1 has only the freezer hierarchy here")
    unfrozen = cgroups.Cgroups("v1", {h: b for h, b in v1.bases.items() if h != "freezer"})
    _kill_whole_job(unfrozen)


def test_v2_without_cgroup_kill_freezes(v2: cgroups.Cgroups, monkeypatch) -> None:
    if not os.path.exists(os.path.join(v2.bases[V2], "cgroup.freeze")):
        pytest.skip("this v2 hierarchy has no cgroup.freeze")
    write = cgroup_files.write
    frozen = []

    def no_cgroup_kill(path: str, control: str, value: str) -> bool:
        """As a kernel before 5.14 answers: no cgroup.kill."""
        if control == "cgroup.kill":
            return False
        if control == "cgroup.freeze" and value == "1":
            frozen.append(path)
        return write(path, control, value)

    monkeypatch.setattr(cgroup_files, "write", no_cgroup_kill)
    _kill_whole_job(v2)
    assert frozen


def test_without_a_memory_controller_usage_sums_its_processes_up_to_a_bound(v2) -> None:
    """Where v2 passes no memory controller to a job's cgroup, what it holds is its
    processes' resident memory, summed; past ``processes_summed`` processes it is unknown,
    so that a request for it never walks thousands of them."""
    cgroup = v2.create("cpu0", 18, 1)
    if "memory" in cgroup.paths and v2.holds_memory():
        pytest.skip("v2's memory controller counts for it here")
    process = subprocess.Popen(JOB, preexec_fn=cgroup.enter)
    try:
        assert _wait_for(lambda: cgroup.usage().processes == 3), cgroup.pids()
        usage = cgroup.usage(processes_summed=3)
        assert usage.memory is not None and usage.memory > 0
        unsummed = cgroup.usage(processes_summed=2)
        assert (unsummed.memory, unsummed.processes, unsummed.summed) == (None, 3, 0)
    finally:
        assert cgroup.kill(timeout=5) is True
        process.wait(timeout=5)
        cgroup.remove()


# Forks 20 sleeping children, then says how many forks the kernel refused (EAGAIN).
FORKS = (
    "import errno, os, time\n"
    "refused = 0\n"
    "for _ in range(20):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(300)\n"
    "            os._exit(0)\n"
    "    except OSError as error:\n"
    "        assert error.errno == errno.EAGAIN, error\n"
    "        refused += 1\n"
    "print(refused, flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_jobs_cgroup_holds_at_most_its_tasks_and_counts_the_forks_refused(backend) -> None:
    """--max-pids: the job's pids.max is written before it starts, a fork past it fails with
    EAGAIN in that job, and the kernel's figures say so; the instance's base holds all its
    jobs together to a share of the node's PIDs. Where no pids controller serves the job's
    cgroup (v2 without it passed on), the limit is said to be unenforced."""
    cgroup = backend.create("cpu0", 21, 1)
    unenforced = cgroup.limit(None, None, 8)
    if not backend.holds_tasks():
        assert unenforced == ["its limit of 8 tasks"] and cgroup.tasks() is None
        assert cgroup.usage().tasks is None
        return
    assert unenforced == []
    hierarchy = "pids" if backend.kind == "v1" else V2
    assert cgroup_files.read(cgroup.paths[hierarchy], "pids.max") == "8\n"
    bound = cgroup_files.read(backend.bases[hierarchy], "pids.max")
    assert bound == f"{cgroup_tasks.node_bound()}\n"
    assert 0 < cgroup_tasks.node_bound() < int(open("/proc/sys/kernel/pid_max").read())
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", FORKS],
        preexec_fn=cgroup.enter,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "13\n"  # the parent and 7 children are 8
        assert cgroup.tasks() == cgroup_tasks.Tasks(current=8, limit=8, refused=13)
        assert cgroup.usage().tasks == cgroup.tasks() and len(cgroup.pids()) == 8
    finally:
        assert cgroup.kill(timeout=5) is True
        process.wait(timeout=5)
        cgroup.remove()


FORKED = [
    sys.executable,
    "-c",
    (
        "import os, sys, time\n"
        "held = bytearray(100 << 20)\n"
        "held[::4096] = b'x' * len(held[::4096])\n"
        "children = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"  # a child: it sleeps, sharing the parent's pages
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "print(*children, flush=True)\n"
        "time.sleep(60)\n"
    ),
]


def test_what_forked_processes_share_is_held_once():
    """Pages a fork shares copy-on-write count once among the processes that share them:
    a job whose 100M is shared by 4 forked children (a data loader's workers) holds about
    100M, not 500M (the resident sizes summed counted it once per process, and ended such
    jobs at a --host-mem they kept to)."""
    parent = subprocess.Popen(FORKED, stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        children = [int(pid) for pid in parent.stdout.readline().split()]
        alone = cgroups.held_bytes([parent.pid])
        together = cgroups.held_bytes([parent.pid, *children])
        assert together > 100 << 20
        assert together < 1.5 * (100 << 20) + 5 * (20 << 20), (alone, together)
    finally:
        for pid in [parent.pid, *children]:
            os.kill(pid, signal.SIGKILL)
        parent.wait()


def test_never_created_cgroup(backend: cgroups.Cgroups) -> None:
    cgroup = backend.job("cpu0", 99, 1)
    assert cgroup.kill(timeout=1) is True
    assert cgroup.pids() == []
    assert cgroup.usage() == cgroups.Usage(memory=None, processes=0)
    with pytest.raises(OSError):
        cgroup.enter()
    cgroup.remove()
    backend.remove_device("cpu0")


def test_detection_gives_every_caller_the_same_paths(backend: cgroups.Cgroups) -> None:
    scope = os.path.basename(next(iter(backend.bases.values())))[len("gq-") :]
    again = cgroups.detect(backend.kind, scope)
    assert again is not None and again.bases == backend.bases
    script = (
        "import sys; from gq.exec.cgroups import job_cgroups as cgroups; "
        "print(cgroups.detect(sys.argv[1], sys.argv[2]).job('cpu0', 1, 1).paths)"
    )
    other = subprocess.run(
        ["python3", "-c", script, backend.kind, scope], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert other == str(backend.job("cpu0", 1, 1).paths)
    elsewhere = cgroups.detect(backend.kind, uuid.uuid4().hex[:12])
    assert elsewhere is not None
    try:
        assert set(elsewhere.bases.values()).isdisjoint(backend.bases.values())
    finally:
        _clean(elsewhere)


def test_off_and_bad_names() -> None:
    assert cgroups.detect("off", "abc") is None
    for kind in ("v3", ""):
        with pytest.raises(ValueError):
            cgroups.detect(kind, "abc")
    for scope in ("", ".", "..", "a/b", "a b"):
        with pytest.raises(ValueError):
            cgroups.detect("off", scope)
    backend = cgroups.Cgroups("v1", {"memory": "/nonexistent/gq-test"})
    for device in ("", ".", "..", "../x", "a/b", "cpu\n0", "x" * 200):
        with pytest.raises(ValueError):
            backend.job(device, 1, 1)
        with pytest.raises(ValueError):
            backend.create(device, 1, 1)
        with pytest.raises(ValueError):
            backend.remove_device(device)
    assert backend.job("cuda_0.a-b", 5, 3).paths == {
        "memory": "/nonexistent/gq-test/cuda_0.a-b/job-5.3"
    }


def test_a_process_is_found_in_its_job_by_its_cgroup_however_it_left_the_tree(
    backend: cgroups.Cgroups,
) -> None:
    """NVML lists a GPU's processes by pid: one a job daemonised (out of its process tree)
    is still the job's, by the cgroup it cannot leave; a process of no job is nobody's."""
    cgroup = backend.create("gpu0", 41, 1)
    process = subprocess.Popen(JOB, preexec_fn=cgroup.enter)
    try:
        assert _wait_for(lambda: len(cgroup.pids()) == 3)
        assert _wait_for(lambda: len(_sessions(cgroup.pids())) == 2)
        assert {backend.job_of(pid) for pid in cgroup.pids()} == {41}
        assert backend.job_of(os.getpid()) is None
        assert backend.job_of(2**70) is None and backend.job_of(-1) is None
    finally:
        cgroup.kill(timeout=5)
        process.wait(timeout=5)
        cgroup.remove()
        backend.remove_device("gpu0")


def test_the_job_in_a_membership_text_is_read_from_its_exact_shape_only() -> None:
    """Only a proposal (a path elsewhere may end the same way: Cgroups.job_of then looks for
    the process in that job's cgroup under its own base)."""
    base = "gq-abc"
    v1 = "12:pids:/user.slice/gq-abc/gpu0/job-17.2\n5:memory:/user.slice/gq-abc/gpu0/job-17.2\n"
    assert cgroups.job_in(v1, base) == ("gpu0", 17, 2)
    assert cgroups.job_in("0::/system.slice/gq.service/gq-abc/gpu1/job-9.1/inner\n", base) == (
        "gpu1",
        9,
        1,
    )
    for text in (
        "0::/gq-other/gpu0/job-17.2\n",  # another instance's
        "0::/gq-abc/gpu0/job-x.2\n",
        "0::/gq-abc/job-17.2\n",
        "0::/gq-abc/gpu0/job-17\n",
        "0::/gq-abc/gpu0/job-1" + "0" * 40 + ".1\n",
        "0::/gq-abc/../job-1.1\n",
        "",
        "\x00\x00",
        "garbage without colons",
        "0::/\n",
        "0::/gq-abc/gpu0\n",
    ):
        assert cgroups.job_in(text, base) is None, text


def test_a_process_in_a_look_alike_cgroup_elsewhere_is_no_job_s(backend) -> None:
    """A user's own cgroup (systemd delegates one) named .../gq-<scope>/gpu0/job-3.1 holds
    a process that is in no job of gq's: it is nobody's, and its memory the device's."""
    name = os.path.basename(next(iter(backend.bases.values())))
    base = next(iter(backend.bases.values()))  # beside the instance's base: not under it
    look_alike = os.path.join(os.path.dirname(base), "elsewhere", name, "gpu0", "job-3.1")
    os.makedirs(look_alike)
    process = subprocess.Popen(["sleep", "30"])
    try:
        with open(os.path.join(look_alike, "cgroup.procs"), "w") as procs:
            procs.write(str(process.pid))
        with open(f"/proc/{process.pid}/cgroup") as membership:
            assert cgroups.job_in(membership.read(), name) == ("gpu0", 3, 1)
        assert backend.job_of(process.pid) is None
    finally:
        process.kill()
        process.wait()
        for _ in range(4):
            os.rmdir(look_alike)
            look_alike = os.path.dirname(look_alike)
