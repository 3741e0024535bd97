"""The children that the root daemon and hosts fork and that take a user's identity: the
daemon's opener of a user's file and a host's job process before its exec. A signal such a
child gets must never reach its parent's loop (they share the wakeup socket across the
fork); the daemon's opener is never the user's to signal at all (a user may signal any
process whose real or saved uid is theirs), and a job's process that never reaches its
exec costs its host no wait (the fork returns before the identity switch)."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import threading
import time

import psutil
import pytest

from gq import wakeup
from gq.daemon.serving import ownerfiles
from gq.exec.host import process_groups, spawn
from gq.exec.host.loop import Host
from gq.exec.host.messages import Launch, LaunchSpec, Started, StopWhy

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (takes another uid)")


@pytest.fixture
def loop_signals():
    """The process set up as the daemon and hosts are: SIGTERM wakes a loop through a
    socket. Restored afterwards (this is a test worker, not a daemon)."""
    previous_term = signal.getsignal(signal.SIGTERM)
    previous_fd = signal.set_wakeup_fd(-1)
    wake = wakeup.signal_socket([signal.SIGTERM])
    yield wake
    signal.set_wakeup_fd(previous_fd)
    signal.signal(signal.SIGTERM, previous_term)
    wake.close()


def _recorder(write_end: int):
    """What the child is like where it touches the user's file: written to a pipe."""

    def record() -> None:
        os.write(
            write_end,
            json.dumps(
                {
                    "uids": os.getresuid(),
                    "wakeup": signal.set_wakeup_fd(-1),
                    "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                }
            ).encode(),
        )

    return record


@root_only
def test_the_daemons_opener_is_not_the_owners_to_signal(loop_signals, monkeypatch):
    read_end, write_end = os.pipe()
    record = _recorder(write_end)

    def open_regular(path: str) -> int:
        record()
        raise FileNotFoundError(errno.ENOENT, "recorded", path)

    monkeypatch.setattr(ownerfiles, "_open_regular", open_regular)
    with pytest.raises(FileNotFoundError):
        ownerfiles.open_as("/no/such/file", ownerfiles.Owner(NOBODY, NOBODY, (NOBODY,)))
    seen = json.loads(os.read(read_end, 4096))
    os.close(read_end)
    os.close(write_end)
    # Its effective uid opens the file; its real and saved uid stay root's.
    assert seen == {"uids": [0, NOBODY, 0], "wakeup": -1, "term": True}


def _spec(**change) -> LaunchSpec:
    fields = dict(
        id=7,
        run=1,
        argv=["/bin/true"],
        worker=False,
        cwd="/",
        env={},
        stdout="/dev/null",
        stderr="/dev/null",
        user="nobody",
        submit_time=1.0,
        uid=NOBODY,
        gid=NOBODY,
        groups=[NOBODY],
    )
    return LaunchSpec(**{**fields, **change})


@root_only
def test_a_jobs_process_leaves_the_hosts_signals_before_it_is_its_users(loop_signals, monkeypatch):
    """Where it touches the user's files it is theirs: by then it holds nothing of the
    host's (no socket, no pidfile lock, only its own descriptors and the set-up pipe), and
    no signal disposition or mask of the host's (an ignored SIGQUIT, a blocked SIGUSR1)."""
    read_end, write_end = os.pipe()
    open_output = spawn._open_output

    def recorded(path: str) -> int:
        os.write(
            5,
            json.dumps(
                {  # the job's descriptor 5 is the pipe
                    "uids": os.getresuid(),
                    "wakeup": signal.set_wakeup_fd(-1),
                    "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                    "quit": signal.getsignal(signal.SIGQUIT) == signal.SIG_DFL,
                    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
                }
            ).encode(),
        )
        return open_output(path)

    monkeypatch.setattr(spawn, "_open_output", recorded)
    quit_was = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        process = spawn.start_as_submitter(_spec(), {"PATH": "/usr/bin:/bin"}, {5: write_end})
    finally:
        signal.signal(signal.SIGQUIT, quit_was)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    assert process.wait(timeout=10) == 0
    seen = json.loads(os.read(read_end, 4096).split(b"}")[0] + b"}")
    os.close(read_end)
    os.close(write_end)
    # All its ids are the user's where it touches their files (a FUSE mount asks that).
    assert {k: seen[k] for k in ("uids", "wakeup", "term", "quit", "mask")} == {
        "uids": [NOBODY] * 3,
        "wakeup": -1,
        "term": True,
        "quit": True,
        "mask": [],
    }
    # 0-2, its descriptor 5, the set-up pipe (10 and up), and listdir's own (the lowest)
    rest = set(seen["fds"]) - {0, 1, 2, 5}
    assert len(rest) == 2 and min(rest) == 3 and max(rest) >= 10, seen["fds"]


def _own_spec(**change) -> LaunchSpec:
    """A job of the test's own user (root runs root's jobs as root)."""
    if os.geteuid() == 0:
        return _spec(uid=0, gid=0, groups=[], **change)
    return _spec(uid=None, gid=None, **change)


def test_a_launch_stuck_before_its_exec_costs_the_host_no_wait(monkeypatch):
    """However its process gets stuck between its identity switch and its exec (stopped by
    its user, a hung file system), the fork returns at once: the host's loop, and every
    other job on its device, never wait for it. It is the user's own stuck job, killed
    whole like any other."""
    monkeypatch.setattr(spawn, "_open_output", lambda path: time.sleep(60))
    started = time.monotonic()
    process = spawn.start_as_submitter(_own_spec(), {"PATH": "/usr/bin:/bin"}, {})
    assert time.monotonic() - started < 1.0
    assert process.poll() is None
    # It leads its own group already: a cancel that comes at once reaches it.
    assert os.getpgid(process.pid) == process.pid
    process_groups.kill_group(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL
    process.read_setup()
    assert process.setup_failure is None  # killed, not failed: it said nothing
    assert process.pid not in {child.pid for child in psutil.Process().children()}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cwd": "/no/such/dir"}, "cannot enter working directory /no/such/dir: No such file"),
        ({"argv": ["/no/such/program"]}, "cannot start /no/such/program: No such file"),
        ({"stdout": "/"}, "cannot open output file /: Is a directory"),
    ],
)
def test_a_set_up_that_fails_says_why_through_its_pipe(change, reason):
    process = spawn.start_as_submitter(_own_spec(**change), {"PATH": "/usr/bin:/bin"}, {})
    assert process.wait(timeout=10) == spawn.SETUP_FAILED_EXIT
    process.read_setup()
    assert process.setup_failure is not None and process.setup_failure.startswith(reason)


def test_the_jobs_program_gets_no_descriptor_of_the_hosts_but_its_socket():
    leaked_read, leaked_write = os.pipe()
    os.set_inheritable(leaked_write, True)  # even one the host left inheritable
    passed_read, passed_write = os.pipe()
    process = spawn.start_as_submitter(
        _own_spec(argv=["sleep", "30"]), {"PATH": "/usr/bin:/bin"}, {4: passed_write}
    )
    try:
        assert select.select([process.setup_pipe], [], [], 10)[0]  # readable at its exec
        process.read_setup()
        assert process.setup_failure is None
        # sleep's own start-up opens files (the locale archive) for a moment after its exec:
        # what it was given stays, a leak among it stays for good.
        deadline = time.monotonic() + 5
        while (fds := {int(fd) for fd in os.listdir(f"/proc/{process.pid}/fd")}) != {
            0,
            1,
            2,
            4,
        } and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fds == {0, 1, 2, 4}
        os.write(passed_write, b"x")  # descriptor 4 of the job is the one it was given
        assert os.read(passed_read, 1) == b"x"
    finally:
        process_groups.kill_group(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        for fd in (leaked_read, leaked_write, passed_read, passed_write):
            os.close(fd)


def _run_chores_until(host: Host, done, timeout: float = 10.0) -> None:
    """Turn the host's reaping as its loop does, until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the host never saw it"
        host.jobs.reap()
        time.sleep(0.01)


def test_a_launch_stuck_before_its_exec_holds_up_no_other_job_of_its_host(monkeypatch, tmp_path):
    """Before, the host waited in the fork for the exec: a user who stopped their job's
    process in that window stopped the device's host (5 s a launch, then a failed launch).
    Now the host answers at once, runs the next job, and the stuck one is a job like any
    other: cancelled, it ends CANCELLED with everything it started."""
    listener, _other_end = socket.socketpair()
    host = Host("cpu0", False, 1, listener, kill_grace=1.0)
    told: list = []
    monkeypatch.setattr(host, "_tell", told.append)
    open_output = spawn._open_output
    monkeypatch.setattr(
        spawn,
        "_open_output",
        lambda path: time.sleep(60) if path.endswith("stuck.out") else open_output(path),
    )
    env = {"PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    host._on_launch(
        Launch(
            _own_spec(
                id=1,
                argv=["true"],
                env=env,
                stdout=str(tmp_path / "stuck.out"),
                stderr=str(tmp_path / "stuck.out"),
            )
        )
    )
    host._on_launch(
        Launch(
            _own_spec(
                id=2,
                argv=["sh", "-c", "echo ran"],
                env=env,
                stdout=str(tmp_path / "ok.out"),
                stderr=str(tmp_path / "ok.out"),
            )
        )
    )
    assert time.monotonic() - started < 1.0
    assert [(type(m), m.job) for m in told] == [(Started, 1), (Started, 2)]
    _run_chores_until(host, lambda: 2 in host.exited)
    assert host.exited[2].code == 0 and (tmp_path / "ok.out").read_text() == "ran\n"
    stuck = host.residents[1]
    assert stuck.process.poll() is None
    host.kill(stuck, StopWhy.CANCEL, grace=0.0)
    _run_chores_until(host, lambda: 1 in host.exited)
    assert host.exited[1].kill_why is StopWhy.CANCEL
    assert host.exited[1].signal in (signal.SIGTERM, signal.SIGKILL)
    assert not psutil.pid_exists(stuck.process.pid)


def test_a_failed_set_up_is_reported_as_its_jobs_exit_with_the_reason(monkeypatch, tmp_path):
    listener, _other_end = socket.socketpair()
    host = Host("cpu0", False, 1, listener, kill_grace=1.0)
    monkeypatch.setattr(host, "_tell", lambda message: None)
    host._on_launch(Launch(_own_spec(id=3, cwd=str(tmp_path / "gone"))))
    _run_chores_until(host, lambda: 3 in host.exited)
    report = host.exited[3]
    assert report.kill_why is StopWhy.LAUNCH and report.code is None
    assert report.detail.startswith(f"cannot enter working directory {tmp_path / 'gone'}")
    assert not host.residents and not host.lanes[0].residents


class _SlowToEmpty:
    """A job's cgroup whose last process takes a while to die (stuck in the kernel, say):
    not empty for its first ``passes`` looks, each taking as long as it was allowed."""

    name = "cpu/job-5.1"
    memory_limited = True

    def __init__(self, passes: int):
        self.passes = passes
        self.removed = False

    def enter(self) -> None:
        pass

    def kill(self, timeout: float) -> bool:
        if self.passes > 0:
            self.passes -= 1
            time.sleep(timeout)
            return False
        return True

    def remove(self) -> None:
        self.removed = True

    def pids(self) -> list[int]:
        return []


def test_an_exited_jobs_leftovers_never_hold_up_its_host(monkeypatch):
    """The host waited up to a second in each reap for a killed job's cgroup to empty: a
    user whose jobs left a process stuck in the kernel stalled every job on the device,
    once per exit. Now each turn looks once, and the exit is reported once it is empty."""
    listener, _other_end = socket.socketpair()
    host = Host("cpu0", False, 1, listener, kill_grace=1.0)
    told: list = []
    monkeypatch.setattr(host, "_tell", told.append)
    cgroup = _SlowToEmpty(passes=3)
    monkeypatch.setattr(host.jobs, "_make_cgroup", lambda spec: (cgroup, None))
    host._on_launch(Launch(_own_spec(id=5, argv=["true"], env={"PATH": "/usr/bin:/bin"})))
    resident = host.residents[5]
    assert resident.process.wait(timeout=10) == 0
    turns = []
    while 5 not in host.exited:
        started = time.monotonic()
        host.jobs.reap()
        turns.append(time.monotonic() - started)
        assert len(turns) < 100
    assert max(turns) < 0.1 and len(turns) == 4  # three looks at leftovers, then reported
    assert host.exited[5].code == 0 and cgroup.removed and not host.lanes[0].residents
    host.kill(resident, StopWhy.CANCEL, grace=0.0)  # a cancel that comes too late
    assert host.exited[5].kill_why is None


class _NoMemoryController(_SlowToEmpty):
    """A job's cgroup that holds no memory limit (v2 without its memory controller)."""

    memory_limited = False

    def __init__(self):
        super().__init__(passes=0)
        self.listed: list[int] = []

    def pids(self) -> list[int]:
        return self.listed


def test_a_slow_memory_reading_never_holds_up_its_hosts_loop(monkeypatch):
    """Where no cgroup holds a job's --host-mem, what its processes hold is read in the
    host's watch thread: reading it takes what the job makes it take (thousands of
    mappings, its memory lock kept busy: seconds), and the host's loop goes on meanwhile.
    Only a job over its limit by resident sizes (which cost microseconds) is read so; one
    read over its limit is ended, saying so; a round that fails leaves the watch going."""
    from gq.exec.host import memory_watch

    listener, _other_end = socket.socketpair()
    host = Host("cpu0", False, 1, listener, kill_grace=1.0)
    monkeypatch.setattr(host, "_tell", lambda message: None)
    cgroup = _NoMemoryController()
    monkeypatch.setattr(host.jobs, "_make_cgroup", lambda spec: (cgroup, None))
    host._on_launch(
        Launch(
            _own_spec(id=6, argv=["sleep", "30"], env={"PATH": "/usr/bin:/bin"}, host_mem=512 << 20)
        )
    )
    resident = host.residents[6]
    cgroup.listed = [resident.process.pid]
    assert resident.host_mem_watched == 512 << 20
    resident_sizes = iter([100 << 20, 1 << 30, 1 << 30, 1 << 30])
    held = iter([RuntimeError("a round that fails"), 100 << 20, 600 << 20])
    read = []
    release = threading.Event()

    def slow_reading(pids):
        read.append(pids)
        release.wait(10)  # as long as the job makes it: until the test lets it end
        outcome = next(held)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(memory_watch, "resident_bytes", lambda pids: next(resident_sizes))
    monkeypatch.setattr(memory_watch, "held_bytes", slow_reading)

    def round_(expected) -> None:
        started = time.monotonic()
        host.host_memory.next_ask = 0.0
        host.host_memory.watch()
        assert time.monotonic() - started < 0.5 and host.host_memory.memory_watch.busy
        host.host_memory.watch()  # asked again while reading: nothing more is asked
        release.set()
        assert select.select([host.host_memory.memory_watch.wake], [], [], 10)[0]
        wait_until = time.monotonic() + 10
        while host.host_memory.memory_watch.busy and time.monotonic() < wait_until:
            time.sleep(0.001)
        host.host_memory.on_readings()
        release.clear()
        assert resident.kill_why is expected

    try:
        round_(None)  # within its limit by resident sizes: nothing more is read
        assert read == []
        round_(None)  # the reading fails: logged, and the next round is asked as usual
        round_(None)  # read within its limit
        round_(StopWhy.HOST_MEMORY)
        assert len(read) == 3
        assert resident.detail == ("over its --host-mem of 512.0M (its processes held 600.0M)")
        assert resident.process.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        release.set()
        if resident.process.poll() is None:
            resident.process.kill()
            resident.process.wait()


@root_only
def test_a_snapshot_is_shown_only_over_a_regular_file_its_user_owns(tmp_path):
    """In a child whose root mount is shared (as under systemd), the bind that shows a
    snapshot under the script's name: over nobody's own file, yes; over root's file, a
    link, or a directory that nobody submitted, never."""
    snapshot = tmp_path / "snapshot.sh"
    snapshot.write_text("echo snapshot\n")
    theirs, roots, link = tmp_path / "theirs.sh", tmp_path / "roots.sh", tmp_path / "link.sh"
    for path in (theirs, roots):
        path.write_text("echo original\n")
    os.chown(theirs, NOBODY, NOBODY)
    link.symlink_to(theirs)
    os.lchown(link, NOBODY, NOBODY)
    for directory in (tmp_path, *tmp_path.parents):  # nobody finds their script, as users do
        if directory == directory.parent:
            break
        os.chmod(directory, os.stat(directory).st_mode | 0o011)
    nobody = (NOBODY, NOBODY, [NOBODY])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            libc = spawn._libc
            assert libc.unshare(spawn._CLONE_NEWNS) == 0
            assert libc.mount(b"none", b"/", None, spawn._MS_REC | 0x100000, None) == 0  # shared
            shown = {
                path.name: spawn._show_snapshot_at(str(snapshot), str(path), nobody)
                for path in (roots, link, tmp_path, theirs)
            }
            shown["seen"] = theirs.read_text()
            os.write(write_end, json.dumps(shown).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    shown = json.loads(os.read(read_end, 4096) or b"{}")
    os.close(read_end)
    assert shown == {
        "roots.sh": False,
        "link.sh": False,
        tmp_path.name: False,
        "theirs.sh": True,
        "seen": "echo snapshot\n",
    }
    assert theirs.read_text() == "echo original\n"  # outside that child, nothing changed
