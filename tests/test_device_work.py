"""A grant means the device: the lane passes to another job only once the device has run
what its holder queued (gq.exec.lane.device_sync), so two jobs' kernels never overlap under one
lane, and the time gq bills each job is the time its kernels took, not the time it took to
queue them. Shown on a fake device whose kernels run asynchronously on a thread
(tests/zoo/fake_cuda.py), standing in for torch.cuda in gq's release path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, gq_ok, job, submit, wait_for, wait_state

sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from fake_cuda import FakeDevice  # noqa: E402

from gq.exec.lane import device_sync  # noqa: E402

KERNELS = str(ROOT / "tests" / "zoo" / "fake_kernels.py")


def _overlap_ns(first: list, second: list) -> int:
    return sum(max(0, min(e1, e2) - max(b1, b2)) for b1, e1 in first for b2, e2 in second)


def test_a_release_waits_for_the_device_and_a_job_that_never_used_it_pays_nothing():
    device = FakeDevice()
    work = device_sync.DeviceWork()
    assert device_sync.cuda() is None  # no stand-in, and no CUDA here: nothing to wait for
    work.finish()
    device_sync.stand_in(device)
    try:
        device.launch(0.05)
        device.launch(0.05)
        work.finish()
        assert device.completed == 2  # both kernels had run when it returned
        work.finish()  # nothing queued since: returns at once
    finally:
        device_sync.stand_in(None)


def test_two_jobs_kernels_never_overlap_under_one_lane_and_are_billed_as_device_time(
    daemon, tmp_path
):
    gq_ok("policy", "set", "fair")
    go = tmp_path / "go"
    outs = [tmp_path / f"kernels{n}.json" for n in range(2)]
    ids = [submit("--gpu-mem", "64M", KERNELS, str(out), "12", "20", str(go)) for out in outs]
    waiting = Path(f"{go}.waiting")
    wait_for(
        lambda: waiting.exists() and len(waiting.read_text().split()) == 2,
        60,
        what="both jobs at their start file",
    )
    go.touch()
    infos = [wait_state(i, "COMPLETED", timeout=90) for i in ids]
    assert infos[0]["device"] == infos[1]["device"]
    first, second = (json.loads(out.read_text())["kernels"] for out in outs)
    assert len(first) == len(second) == 24
    assert _overlap_ns(first, second) == 0  # never both on the device at once
    # They took turns (fair), rather than one running all its kernels first.
    starts = sorted([(b, 0) for b, _ in first] + [(b, 1) for b, _ in second])
    assert sum(a[1] != b[1] for a, b in zip(starts, starts[1:])) >= 4
    for kernels, job_id in zip((first, second), ids):
        busy = sum(end - begin for begin, end in kernels) / 1e9
        attained = job(job_id)["attained"]
        assert busy * 0.95 <= attained <= busy * 1.6 + 0.3, (busy, attained)


def test_a_lease_keeps_as_many_iterations_queued_as_it_is_told_and_waits_for_the_rest():
    """At each leased release (gq.exec.job.worker) the job waits until no more than
    ``behind`` earlier iterations' work is left on its device besides this one's; the lane's
    lock each release would let go is taken back as the next iteration begins."""
    device, made = FakeDevice(), []
    device_sync.stand_in(device)
    try:
        for behind in (0, 1, 2):
            work, queued = device_sync.DeviceWork(), []
            for _ in range(8):
                device.launch(0.03)  # an iteration's work
                work.wait_kept(behind)  # its release
                queued.append(device.launched - device.completed)
                work.then(lambda: made.append(1))
                assert work.keep() is not None  # the next iteration began first
            assert max(queued) == behind + 1, (behind, queued)
            work.finish()
        assert not made  # (each taken back before its device was done)
    finally:
        device_sync.stand_in(None)


def test_a_release_inside_a_graph_capture_waits_for_nothing_kept():
    """Waiting for an event while a CUDA graph is captured would break the capture: the
    release that keeps its iterations queued waits for none of them then."""
    device = FakeDevice()
    device_sync.stand_in(device)
    try:
        work = device_sync.DeviceWork()
        for _ in range(3):
            device.launch(0.05)
            work.then(lambda: None)
            assert work.keep() is not None
        device.is_current_stream_capturing = lambda: True
        work.wait_kept(0)
        assert device.launched - device.completed >= 2  # nothing was waited for
        device.is_current_stream_capturing = lambda: False
        work.wait_kept(0)
        assert device.launched - device.completed <= 1
    finally:
        device_sync.stand_in(None)


def _most_queued(run: dict) -> int:
    """The most kernels a job's device had yet to finish as the job launched one."""
    ends = [end for _, end in run["kernels"]]
    return max(sum(end > queued for end in ends[:n]) for n, queued in enumerate(run["queued"]))


def test_a_job_alone_runs_an_iteration_ahead_of_its_device_and_a_newcomer_waits_that_tail(
    daemon, tmp_path
):
    """Alone on its lane (a lease) a job does not wait for its device at each release: it
    queues its next iteration while the device runs the last (a thread lets the lane's lock
    go once the device is done), and no further, so a job that comes meanwhile gets the lane
    once that tail has run, not once everything the holder could queue has."""
    gq_ok("policy", "set", "fair")
    alone, later = tmp_path / "alone.json", tmp_path / "later.json"
    first = submit("--gpu-mem", "64M", KERNELS, str(alone), "30", "20")
    wait_state(first, "RUNNING", timeout=60)
    second = submit("--gpu-mem", "64M", KERNELS, str(later), "5", "20")
    for job_id in (first, second):
        wait_state(job_id, "COMPLETED", timeout=90)
    mine, theirs = (json.loads(out.read_text()) for out in (alone, later))
    busy = sum(end - begin for begin, end in mine["kernels"]) / 1e9
    assert busy >= 1.1
    # Two kernels an iteration: launching an iteration's second, the job has its first and
    # the two iterations' before it still queued (one of them running), four where its
    # thread was late; run ahead without a bound, it queued all 60 at once.
    assert 4 <= _most_queued(mine) <= 5, _most_queued(mine)
    assert _overlap_ns(mine["kernels"], theirs["kernels"]) == 0


def test_memory_figures_are_the_device_s_reserved_peak_and_leave_the_script_s_own_alone():
    """The cap holds reserved memory, so the figure is the reserved peak; and the peak
    statistics a training framework logs are the script's: gq never resets them."""
    from gq.exec.job import worker_memory

    device = FakeDevice()
    device.allocated, device.reserved_peak = 3 << 20, 9 << 20
    device_sync.stand_in(device)
    try:
        for _ in range(3):
            assert worker_memory.sample() == worker_memory.MemorySample(
                persistent=3 << 20, peak=9 << 20
            )
    finally:
        device_sync.stand_in(None)
    assert device.resets == 0


def test_a_release_through_the_host_is_told_once_the_device_is_done_and_before_a_ready():
    """The job runs on with its gap's work while the device runs its tail (a thread sends
    the Done then); where it asks for the lane again first, it waits for the device and
    sends the Done itself, before its READY."""
    import select
    import socket
    import time

    from gq.exec.job.messages import Go
    from gq.exec.job.worker import WorkerSession
    from gq.exec.job.worker_link import WorkerChannel
    from gq.exec.protocol import FROM_WORKER, Channel, encode

    device = FakeDevice()
    device_sync.stand_in(device)
    host_end, worker_end = socket.socketpair()
    host = Channel(host_end, FROM_WORKER)
    session = WorkerSession(WorkerChannel(worker_end))
    try:
        host_end.sendall(encode(Go()))  # ahead of the READY: the grant is there at once
        session.acquire()
        assert type(host.receive_one()).__name__ == "Ready"
        device.launch(0.2)
        begin = time.monotonic()
        session.release()
        assert time.monotonic() - begin < 0.1  # it ran on
        assert not select.select([host_end], [], [], 0.05)[0]  # the device is not done
        assert type(host.receive_one()).__name__ == "Done"
        assert time.monotonic() - begin >= 0.19 and device.completed == 1
        host_end.sendall(encode(Go()))
        session.acquire()
        assert type(host.receive_one()).__name__ == "Ready"
        device.launch(0.2)
        begin = time.monotonic()
        session.release()
        host_end.sendall(encode(Go()))
        session.acquire()  # at once: the Done first, once the device is done
        assert device.completed == 2 and time.monotonic() - begin >= 0.19
        assert [type(host.receive_one()).__name__ for _ in range(2)] == ["Done", "Ready"]
    finally:
        device_sync.stand_in(None)
        host_end.close()
        worker_end.close()


@pytest.mark.long
def test_a_training_step_compiled_whole_is_granted_the_lane_at_each_call(daemon, tmp_path):
    """``@torch.compile def train_step(...)`` (forward, backward, optimizer step inside)
    calls no module gq sees: its iterations ran beside the lane's holder, unbilled. Each
    call of a compiled function is now an outermost call, granted the lane: under fifo,
    the second job's steps wait for the first job's, although the first is idle (at its
    start file) when the second is ready to run. (The second marks its steps with
    gq.steps: a compiled step ungranted would run beside them.)"""
    gq_ok("policy", "set", "fifo")
    go = tmp_path / "go"
    ahead, behind = tmp_path / "ahead.json", tmp_path / "behind.json"
    first = submit("--gpu-mem", "2G", KERNELS, str(ahead), "10", "20", str(go), "compiled")
    waiting = Path(f"{go}.waiting")
    wait_for(waiting.exists, 120, what="the first job compiled and at its start file")
    second = submit("--gpu-mem", "2G", KERNELS, str(behind), "10", "20")
    wait_state(second, "RUNNING", timeout=60)
    go.touch()
    infos = [wait_state(i, "COMPLETED", timeout=120) for i in (first, second)]
    assert infos[0]["device"] == infos[1]["device"]
    mine, theirs = (json.loads(out.read_text())["kernels"] for out in (ahead, behind))
    assert len(mine) == len(theirs) == 20
    assert max(end for _, end in mine) <= min(begin for begin, _ in theirs)
    for kernels, info in zip((mine, theirs), infos):
        busy = sum(end - begin for begin, end in kernels) / 1e9
        assert info["attained"] >= busy * 0.95, (busy, info["attained"])


def test_a_ctrl_c_as_the_ready_goes_waits_for_the_grant_and_loses_nothing():
    """A console's Ctrl-C that comes just as the worker sends its READY, before it waits
    for the GO: raised at once, it left the READY unanswered while the host granted, and
    the lane was held by no one who knew it. It is held back until the grant is in."""
    import signal
    import socket

    from gq.exec.job.console import interrupting
    from gq.exec.job.messages import Go
    from gq.exec.job.worker import WorkerSession
    from gq.exec.job.worker_link import WorkerChannel
    from gq.exec.protocol import FROM_WORKER, Channel, encode

    class InterruptedAsItSends(WorkerChannel):
        def send_line(self, line: bytes) -> None:
            super().send_line(line)
            interrupting(session)(signal.SIGINT, None)  # the SIGINT, right then

    host_end, worker_end = socket.socketpair()
    host = Channel(host_end, FROM_WORKER)
    session = WorkerSession(InterruptedAsItSends(worker_end))
    try:
        host_end.sendall(encode(Go()))
        with pytest.raises(KeyboardInterrupt):
            session.acquire()
        assert type(host.receive_one()).__name__ == "Ready"
        assert session.held  # the grant was read: the statement's end gives it back
        session.end_iteration()
        assert type(host.receive_one()).__name__ == "Done"
        worker_end.setblocking(False)
        with pytest.raises(BlockingIOError):  # no GO left unread for the next READY
            worker_end.recv(1)
    finally:
        host_end.close()
        worker_end.close()


def test_a_ctrl_c_as_a_release_goes_waits_for_the_done_and_loses_nothing():
    """A console's Ctrl-C that comes as the worker releases, before its DONE is sent:
    raised there, the host never heard of the release and the lane stayed with an idle
    REPL (seen as a batch job that stopped after an interrupted notebook cell)."""
    import signal
    import socket

    from gq.exec.job.console import interrupting
    from gq.exec.job.messages import Go
    from gq.exec.job.worker import WorkerSession
    from gq.exec.job.worker_link import WorkerChannel
    from gq.exec.protocol import FROM_WORKER, Channel, encode

    class InterruptedBeforeItSends(WorkerChannel):
        def send(self, kind, **fields) -> bool:
            interrupting(session)(signal.SIGINT, None)  # the SIGINT, right then
            return super().send(kind, **fields)

    host_end, worker_end = socket.socketpair()
    host_end.settimeout(5)  # a DONE that never comes fails the test
    host = Channel(host_end, FROM_WORKER)
    session = WorkerSession(InterruptedBeforeItSends(worker_end))
    try:
        host_end.sendall(encode(Go()))
        session.acquire()
        assert type(host.receive_one()).__name__ == "Ready"
        with pytest.raises(KeyboardInterrupt):
            session.release()
        assert type(host.receive_one()).__name__ == "Done"  # sent before the interrupt
        assert not session.held
    finally:
        host_end.close()
        worker_end.close()


HOOKS_SCAFFOLD = r"""
import signal, socket, sys, threading, time
import torch
from gq.exec.job import hooks
from gq.exec.job.console import interrupting
from gq.exec.protocol import FROM_WORKER, Channel, encode
from gq.exec.job.worker_link import WorkerChannel
from gq.exec.job.worker import WorkerSession
from gq.exec.job.messages import Go

host_end, worker_end = socket.socketpair()
session = WorkerSession(WorkerChannel(worker_end))
heard = []

def host():
    channel = Channel(host_end, FROM_WORKER)
    while True:
        message = channel.receive_one()
        heard.append(type(message).__name__)
        if heard[-1] == "Ready":
            host_end.sendall(encode(Go()))

threading.Thread(target=host, daemon=True).start()
hooks.install(session, torch)
boundaries = session.ending.__self__

"""
# How a statement ends, interrupted: what its end gives back, as the host hears it.
STATEMENT_END = r"""
try:
    model(torch.ones(4))
except KeyboardInterrupt:
    print("interrupted")
session.end_iteration()  # the statement's end
deadline = time.monotonic() + 3
while "Done" not in heard and time.monotonic() < deadline:
    time.sleep(0.01)
print("heard", " ".join(heard))
"""
HOOKS_INTERRUPTED = (
    HOOKS_SCAFFOLD
    + r"""
class TrippingLock:
    # The hooks' lock, whose next acquire comes with a SIGINT once armed.
    def __init__(self):
        self.lock, self.armed = threading.Lock(), False
    def acquire(self, *args):
        if self.armed:
            self.armed = False
            interrupting(session)(signal.SIGINT, None)
        return self.lock.acquire(*args)
    def release(self):
        self.lock.release()
    __enter__ = acquire
    def __exit__(self, *exc):
        self.release()

boundaries.lock = TrippingLock()
if hasattr(boundaries, "section"):
    boundaries.section = type(boundaries.section)(boundaries.lock, session)

class Arming(torch.nn.Linear):
    def forward(self, x):
        boundaries.lock.armed = True  # the SIGINT comes as the call is counted out
        return super().forward(x)

model = Arming(4, 4)
"""
    + STATEMENT_END
)
# The SIGINT comes while the hooks' own code runs between its sections: in the finally
# that leaves the outermost call, before it has counted the call out.
HOOKS_INTERRUPTED_BETWEEN = (
    HOOKS_SCAFFOLD
    + r"""
leave = boundaries.leave

def interrupted_leave():
    interrupting(session)(signal.SIGINT, sys._getframe(1))  # in the hooks' frame
    leave()

boundaries.leave = interrupted_leave
model = torch.nn.Linear(4, 4)
"""
    + STATEMENT_END
)


def _interrupted_as_the_host_hears_it(script: str) -> None:
    """Run a script that interrupts its hooks: it must be interrupted, and the host must
    hear its Ready, then its Done (no iteration left open)."""
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["interrupted", "heard Ready Done"], done


def test_a_ctrl_c_as_the_hooks_count_a_call_out_leaves_no_iteration_open(tmp_path):
    """A console's Ctrl-C that came as the hooks counted an outermost call out (waiting
    for their lock) left the call counted inside for good: the statement's end released
    nothing, and the lane stayed with an idle REPL. The hooks' sections hold it back."""
    _interrupted_as_the_host_hears_it(HOOKS_INTERRUPTED)


def test_a_ctrl_c_between_the_hooks_sections_is_raised_after_the_call_is_counted_out():
    """A Ctrl-C can come while the hooks run outside their sections, in the finally that
    counts an outermost call out: raised there, the call stayed counted inside and the lane
    with an idle kernel (a batch job beside an interrupted notebook cell stopped, now and
    then, under load). It is held back to the end of the call's counting out."""
    _interrupted_as_the_host_hears_it(HOOKS_INTERRUPTED_BETWEEN)
