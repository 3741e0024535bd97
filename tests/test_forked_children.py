"""The children that the root daemon and hosts fork and that take a user's identity: the
daemon's opener of a user's file and a host's job process before its exec. A signal such a
child gets must never reach its parent's loop (they share the wakeup socket across the
fork); the daemon's opener is never the user's to signal at all (a user may signal any
process whose real or saved uid is theirs), and a job's process that never reaches its
exec is killed after the launch timeout."""

from __future__ import annotations

import errno
import json
import os
import signal
import time

import psutil
import pytest

from gq import defaults, wakeup
from gq.daemon import ownerfiles
from gq.errors import LaunchError
from gq.exec import spawn
from gq.exec.protocol import LaunchSpec

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
        os.write(write_end, json.dumps({
            "uids": os.getresuid(), "wakeup": signal.set_wakeup_fd(-1),
            "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}).encode())
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
    fields = dict(id=7, run=1, argv=["/bin/true"], worker=False, cwd="/", env={},
                  stdout="/dev/null", stderr="/dev/null", user="nobody", submit_time=1.0,
                  uid=NOBODY, gid=NOBODY, groups=[NOBODY])
    return LaunchSpec(**{**fields, **change})


@root_only
def test_a_jobs_process_leaves_the_hosts_signals_before_it_is_its_users(loop_signals,
                                                                         monkeypatch):
    read_end, write_end = os.pipe()
    record = _recorder(write_end)
    open_output = spawn._open_output

    def recorded(path: str, error_write: int) -> int:
        record()
        return open_output(path, error_write)

    monkeypatch.setattr(spawn, "_open_output", recorded)
    process = spawn.start_as_submitter(_spec(), {"PATH": "/usr/bin:/bin"}, ())
    assert process.wait(timeout=10) == 0
    seen = json.loads(os.read(read_end, 4096).split(b"}")[0] + b"}")
    os.close(read_end)
    os.close(write_end)
    # All its ids are the user's where it touches their files (a FUSE mount asks that).
    assert seen == {"uids": [NOBODY] * 3, "wakeup": -1, "term": True}


def test_a_launch_that_never_reaches_its_exec_is_killed(monkeypatch):
    """However it got stuck before its exec (stopped, a hung file system), the child costs
    its own launch after the launch timeout, never the host's loop, and is collected."""
    monkeypatch.setattr(defaults, "LAUNCH_TIMEOUT", 0.5)
    monkeypatch.setattr(spawn, "_open_output", lambda path, error_write: time.sleep(60))
    spec = _spec(uid=0, gid=0, groups=[]) if os.geteuid() == 0 else _spec(uid=None, gid=None)
    before = {child.pid for child in psutil.Process().children()}
    started = time.monotonic()
    with pytest.raises(LaunchError, match="stopped or stuck before it could start"):
        spawn.start_as_submitter(spec, {"PATH": "/usr/bin:/bin"}, ())
    assert time.monotonic() - started < 5
    assert {child.pid for child in psutil.Process().children()} <= before
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_launch_stalled_before_it_names_its_pid_is_still_killed(monkeypatch):
    """The alarm may come before the child has written its pid: the host still learns it
    and kills it, instead of leaving a job that runs untracked."""
    monkeypatch.setattr(defaults, "LAUNCH_TIMEOUT", 0.1)
    slow = wakeup.detach_in_child

    def late_detach() -> None:
        slow()
        time.sleep(0.4)

    monkeypatch.setattr(spawn.wakeup, "detach_in_child", late_detach)
    spec = _spec(uid=0, gid=0, groups=[]) if os.geteuid() == 0 else _spec(uid=None, gid=None)
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(LaunchError, match="stopped or stuck before it could start"):
        spawn.start_as_submitter(spec, {"PATH": "/usr/bin:/bin"}, ())
    assert {child.pid for child in psutil.Process().children()} <= before
