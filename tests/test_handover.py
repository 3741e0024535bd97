"""Gapless hand-over within a lane (gq.exec.lane.handover): at a contended release the holder
sends its Done at once with an interprocess event, and a successor of the same user queues
its work behind it on the device, so the device does not idle between the two and their
kernels never interleave. Shown through the real daemon, host and CLI on a fake device that
every job of a test shares (tests/zoo/fake_cuda.py: contexts time-slice, one kernel at a
time, a switching cost between contexts), whose log of kernels is read on the monotonic
clock all processes share."""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, gq_ok, job, submit, wait_for, wait_state, write_script

sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import fake_cuda  # noqa: E402

from gq.exec.lane import device_sync  # noqa: E402

KERNELS = str(ROOT / "tests" / "zoo" / "fake_kernels.py")
KERNEL_MS = 2


def kernel_log(directory: Path) -> list[tuple[int, int, int, int]]:
    """(pid, start_ns, end_ns, queued_ns) of every kernel the shared device ran, in order."""
    rows = [
        tuple(map(int, line.split()))
        for line in (directory / "kernels").read_text().split("\n")
        if line
    ]
    return sorted(rows, key=lambda row: row[1])  # type: ignore[arg-type, return-value]


def hand_overs(log: list[tuple[int, int, int, int]]) -> dict:
    """What the log says of the device: kernels that overlapped, runs of one process's
    kernels (an iteration's come whole, two by two, unless another's cut in), and the idle
    time at each change of process, against the span from first kernel to last."""
    overlaps = sum(1 for a, b in zip(log, log[1:]) if b[1] < a[2])
    runs, length = [], 1
    for a, b in zip(log, log[1:]):
        if a[0] == b[0]:
            length += 1
        else:
            runs.append(length)
            length = 1
    runs.append(length)
    changes = [(a, b) for a, b in zip(log, log[1:]) if a[0] != b[0]]
    gaps = [max(0, b[1] - a[2]) for a, b in changes]
    span = log[-1][2] - log[0][1]
    return {
        "overlaps": overlaps,
        "runs": runs,
        "gaps_ns": gaps,
        "idle": sum(gaps) / span,
        # the next job's kernel was queued before the last one's tail had run
        "ahead": sum(1 for a, b in changes if b[3] < a[2]) / len(changes),
    }


def _pair(tmp_path: Path, monkeypatch, name: str, ipc: bool, iterations: int = 60) -> tuple:
    device = tmp_path / name
    device.mkdir()
    monkeypatch.setenv("GQ_FAKE_CUDA_DEVICE", str(device))
    monkeypatch.setenv("GQ_FAKE_CUDA_SWITCH_US", "20")
    monkeypatch.setenv("GQ_FAKE_CUDA_IPC", "1" if ipc else "0")
    go = tmp_path / f"go-{name}"
    outs = [tmp_path / f"{name}{n}.json" for n in range(2)]
    args = (str(iterations), str(KERNEL_MS), str(go))
    ids = [submit("--gpu-mem", "64M", KERNELS, str(out), *args) for out in outs]
    waiting = Path(f"{go}.waiting")
    wait_for(
        lambda: waiting.exists() and len(waiting.read_text().split()) == 2,
        60,
        what="both jobs at their start file",
    )
    go.touch()
    for job_id in ids:
        wait_state(job_id, "COMPLETED", timeout=120)
    return ids, [json.loads(out.read_text()) for out in outs], kernel_log(device)


def test_one_users_jobs_hand_over_without_the_device_idling_and_never_interleave(
    daemon, tmp_path, monkeypatch
):
    gq_ok("policy", "set", "fair")
    # (fair takes turns a slice of lane time at a time: 300 iterations of 4 ms make some)
    ids, results, log = _pair(tmp_path, monkeypatch, "gapless", ipc=True, iterations=300)
    _, synced_results, synced_log = _pair(
        tmp_path, monkeypatch, "synced", ipc=False, iterations=300
    )
    gapless, synced = hand_overs(log), hand_overs(synced_log)
    for seen in (gapless, synced):
        assert seen["overlaps"] == 0
        assert all(run % 2 == 0 for run in seen["runs"]), seen["runs"]  # whole iterations
        assert len(seen["runs"]) >= 20  # they took turns (fair), handing over at each
    # Handles passed between them (one user's jobs), and none where IPC is not there.
    assert all(r["waited"] for r in results), [len(r["waited"]) for r in results]
    assert not any(r["waited"] for r in synced_results)
    # The successor queued its work while the holder's tail ran; waited for, never.
    assert gapless["ahead"] >= 0.8, gapless["ahead"]
    assert synced["ahead"] == 0, synced["ahead"]
    quartile = statistics.quantiles(gapless["gaps_ns"], n=4)[0]
    synced_quartile = statistics.quantiles(synced["gaps_ns"], n=4)[0]
    print(
        f"at hand-overs, gapless: idle {gapless['idle']:.3f} of the span, gaps' quartile "
        f"{quartile / 1e3:.0f} us, queued ahead {gapless['ahead']:.2f}; synced: "
        f"{synced['idle']:.3f}, {synced_quartile / 1e3:.0f} us"
    )
    # What is left of a gap is the fake's own wake-up on a CPU other processes share (its
    # upper tail, the same noise either way: measured on two loaded cores, gaps' quartiles
    # 150-290 us against 430-760 us; idle 0.08-0.14 against 0.13-0.22).
    assert quartile <= 0.6 * synced_quartile, (quartile, synced_quartile)
    # Billed as device time still: each job's kernels, not the moments its Done came.
    for result, job_id in zip(results, ids):
        busy = sum(end - begin for begin, end in result["kernels"]) / 1e9
        attained = job(job_id)["attained"]
        assert busy * 0.9 <= attained <= busy * 1.6 + 0.3, (busy, attained)


_HOLDER = """\
import os, sys, time
sys.path.insert(0, {zoo!r})
from fake_cuda import FakeDevice
import gq
from gq.exec.job import session
from gq.exec.lane import device_sync
device = FakeDevice()
device_sync.stand_in(device)
while not os.path.exists("holder-go"):
    time.sleep(0.01)
for step in gq.steps(range(3)):
    if step == 0:
        open("go", "w").close()  # the successor starts with the lane held: it cannot run ahead
    device.launch(0.002)
# Its last iteration once the successor has iterated, and, where it holds a lease, once
# the successor has asked for the lane: a successor that asks only after this release finds
# the lease's lock kept while the tail runs, and waits for that lock, not an event.
successor = open("go.waiting").read().split()[0]
while successor not in open("device/kernels").read().split()[::4]:
    time.sleep(0.01)
for _ in gq.steps(range(1)):
    lease = session.active.lease
    while lease is not None and lease.active and lease.page.offered():
        time.sleep(0.002)
    device.launch(3.0)  # its tail: 3 s after its release
with open("released.tmp", "w") as out:
    out.write(f"{{os.getpid()}} {{time.monotonic_ns()}}")
os.rename("released.tmp", "released")
time.sleep(60)
"""


def test_a_holder_killed_after_its_release_does_not_hang_its_successor(
    daemon, tmp_path, monkeypatch
):
    """The successor waits on the event its holder recorded before its Done: the holder
    killed while its tail runs, the successor's device goes on (the holder's work went
    with its context), and not before the kill."""
    gq_ok("policy", "set", "fair")
    device = tmp_path / "device"
    device.mkdir()
    monkeypatch.setenv("GQ_FAKE_CUDA_DEVICE", str(device))
    monkeypatch.chdir(tmp_path)
    zoo = str(ROOT / "tests" / "zoo")
    holder = submit(
        "--gpu-mem", "64M", write_script(tmp_path / "holder.py", _HOLDER.format(zoo=zoo))
    )
    out = tmp_path / "successor.json"
    go = tmp_path / "go"
    successor = submit("--gpu-mem", "64M", KERNELS, str(out), "400", str(KERNEL_MS), str(go))
    wait_for(lambda: Path(f"{go}.waiting").exists(), 60, what="the successor at its start")
    wait_state(holder, "RUNNING", timeout=60)
    (tmp_path / "holder-go").touch()  # (the holder starts the successor)
    released_file = tmp_path / "released"
    wait_for(released_file.exists, 60, what="the holder's last release")
    pid, released = map(int, released_file.read_text().split())
    time.sleep(0.5)  # the successor granted meanwhile, its device waiting on the tail
    killed = time.monotonic_ns()
    os.kill(pid, signal.SIGKILL)
    wait_state(successor, "COMPLETED", timeout=60)
    result = json.loads(out.read_text())
    assert result["waited"], "its grants carried the holder's events"
    begins = [begin for begin, _ in result["kernels"]]
    # Nothing of the successor's ran beside the holder's tail (what it had queued before
    # the holder's last iteration may end just after the release)...
    assert not [b for b in begins if released + 0.1e9 <= b < killed]
    # ... and it went on once the holder was gone, long before its tail would have ended.
    assert min(b for b in begins if b >= killed) < killed + 1e9 < released + 3e9
    assert wait_state(holder, "FAILED", "CANCELLED", timeout=30)


_HOSTILE = """\
import os, sys, time
import gq
from gq.exec.job import session
while not os.path.exists("go"):
    time.sleep(0.01)
for _ in gq.steps(range(1)):
    session.active.channel.send_line({line!r})
    time.sleep(1)
"""


BAD_EVENTS = {
    "short": "ab" * 63,
    "long": "ab" * 65,
    "nul": "\u0000" * 128,
    "upper": "AB" * 64,
    "newline": "ab" * 64 + "\n",
    "int": 5,
    "list": ["ab" * 64],
    "huge": "ab" * 60000,
}


def test_the_host_refuses_every_event_handle_but_64_bytes_in_hex():
    from gq.exec import protocol
    from gq.exec.job.worker_link import line

    for bad in BAD_EVENTS.values():
        with pytest.raises(protocol.MessageError):
            protocol.decode(line("done", steps=1, event=bad).rstrip(b"\n"), protocol.FROM_WORKER)
    good = protocol.decode(line("done", steps=1, event="0f" * 64).rstrip(), protocol.FROM_WORKER)
    assert good.event == "0f" * 64


@pytest.mark.parametrize("bad", ["short", "nul", "int", "huge"])
def test_a_hostile_event_handle_fails_its_sender_and_reaches_no_one(
    daemon, tmp_path, monkeypatch, bad
):
    """Sent by a hand-written worker holding the lane: its job fails naming the message,
    and the job granted next runs, given no handle."""
    gq_ok("policy", "set", "fair")
    device = tmp_path / "device"
    device.mkdir()
    monkeypatch.setenv("GQ_FAKE_CUDA_DEVICE", str(device))
    monkeypatch.chdir(tmp_path)
    line = json.dumps({"kind": "done", "steps": 1, "event": BAD_EVENTS[bad]}).encode() + b"\n"
    hostile = submit(
        "--gpu-mem", "64M", write_script(tmp_path / "hostile.py", _HOSTILE.format(line=line))
    )
    out = tmp_path / "honest.json"
    go = tmp_path / "go"
    honest = submit("--gpu-mem", "64M", KERNELS, str(out), "50", str(KERNEL_MS), str(go))
    wait_state(hostile, "RUNNING", timeout=60)
    wait_state(honest, "RUNNING", timeout=60)
    go.touch()
    failed = wait_state(hostile, "FAILED", timeout=30)
    assert failed["reason"].startswith("protocol error: its worker sent done.event"), failed
    wait_state(honest, "COMPLETED", timeout=30)
    assert json.loads(out.read_text())["waited"] == []


_AS_USER = """\
import os, runpy, sys
os.environ["GQ_FAKE_CUDA_DEVICE"] = {device!r}
sys.argv = ["fake_kernels.py", *{args!r}]
runpy.run_path("fake_kernels.py", run_name="__main__")
"""


def _user_job(node, owner, device: Path, name: str, iterations: int) -> int:
    """A fake_kernels job of ``owner``'s on the shared ``device``, at its start file
    ``go-NAME``, writing ``NAME.json``."""
    import shutil

    for part in ("fake_cuda.py", "fake_kernels.py"):
        copy = owner.workdir / part
        if not copy.exists():
            shutil.copy(ROOT / "tests" / "zoo" / part, copy)
            os.chown(copy, owner.uid, owner.gid)
    args = [f"{name}.json", str(iterations), str(KERNEL_MS), f"go-{name}"]
    script = write_script(
        owner.workdir / f"{name}.py", _AS_USER.format(device=str(device), args=args)
    )
    os.chown(script, owner.uid, owner.gid)
    return int(node.ok(owner, "submit", "--parsable", "--gpu-mem", "64M", script).strip())


def _shared_device(tmp_path: Path) -> Path:
    device = tmp_path / "device"
    device.mkdir()
    device.chmod(0o777)
    return device


def test_two_users_jobs_hand_over_with_their_device_waited_for_and_no_handle(
    shared_node, users, tmp_path
):
    """Jobs of alice and bob on one lane: no event of one reaches the other; each release
    waits for its device, so their kernels still never interleave."""
    shared_node.ok(None, "policy", "set", "fair")
    device = _shared_device(tmp_path)
    owners = [users["alice"], users["bob"]]
    ids = [_user_job(shared_node, owner, device, "k", 300) for owner in owners]
    for owner in owners:
        wait_for((owner.workdir / "go-k.waiting").exists, 60, what="the job at its start file")
    for owner in owners:
        (owner.workdir / "go-k").touch()
    for job_id in ids:
        shared_node.wait_state(job_id, "COMPLETED", timeout=120)
    results = [json.loads((o.workdir / "k.json").read_text()) for o in owners]
    assert [r["waited"] for r in results] == [[], []]
    seen = hand_overs(kernel_log(device))
    assert seen["overlaps"] == 0
    assert all(run % 2 == 0 for run in seen["runs"]), seen["runs"]
    assert len(seen["runs"]) >= 20


def test_another_users_job_that_comes_to_a_lane_ends_its_gapless_hand_overs(
    shared_node, users, tmp_path
):
    """alice's two jobs hand over gaplessly until bob's job comes to their lane: from then
    on no grant allows it (bob's never gets a handle), and no kernels interleave. (A job
    that comes while a tail is pending, say moved from another lane, waits for its
    Drained: see the unit test of gq.exec.lane.handover below.)"""
    alice, bob = users["alice"], users["bob"]
    shared_node.ok(None, "policy", "set", "fair")
    device = _shared_device(tmp_path)
    ids = [_user_job(shared_node, alice, device, f"a{n}", 150) for n in range(2)]
    for n in range(2):
        wait_for((alice.workdir / f"go-a{n}.waiting").exists, 60, what="alice's job at its start")
    for n in range(2):
        (alice.workdir / f"go-a{n}").touch()
    wait_for(
        lambda: len((device / "kernels").read_text().splitlines()) >= 40,
        60,
        what="alice's jobs under way",
    )
    ids.append(_user_job(shared_node, bob, device, "b", 60))
    (bob.workdir / "go-b").touch()  # (it starts at once)
    for job_id in ids:
        shared_node.wait_state(job_id, "COMPLETED", timeout=120)
    results = [json.loads((alice.workdir / f"a{n}.json").read_text()) for n in range(2)]
    bobs = json.loads((bob.workdir / "b.json").read_text())
    assert all(r["waited"] for r in results)  # alice's handed over before bob came
    assert bobs["waited"] == []
    log = kernel_log(device)
    bob_pid = bobs["pid"]
    assert log[0][0] != bob_pid and any(row[0] == bob_pid for row in log)
    seen = hand_overs(log)
    assert seen["overlaps"] == 0
    assert all(run % 2 == 0 for run in seen["runs"]), seen["runs"]


# ----- the pure parts and the fake device ---------------------------------------------
def test_the_shared_fake_device_orders_one_process_after_anothers_event(tmp_path):
    """Two devices on one directory: kernels never overlap, a stream that waits on the
    other's event runs after what that one queued before it, and an event of a process that
    has died is waited for no longer."""
    import multiprocessing

    first = fake_cuda.FakeDevice(str(tmp_path))
    first.launch(0.05)
    event = first.Event(interprocess=True)
    event.record()
    handle = event.ipc_handle()
    assert len(handle) == device_sync.HANDLE_SIZE

    def other(handle: bytes, out: str) -> None:
        second = fake_cuda.FakeDevice(str(tmp_path))
        second.current_stream().wait_event(second.Event.from_ipc_handle(0, handle))
        second.launch(0.001)
        second.wait_for(second.launched)
        Path(out).write_text(json.dumps(second.intervals))

    out = tmp_path / "second.json"
    child = multiprocessing.get_context("fork").Process(target=other, args=(handle, str(out)))
    child.start()
    child.join(10)
    first.wait_for(first.launched)
    ((begin, end),) = first.intervals
    ((later, _),) = json.loads(out.read_text())
    assert later >= end
    # A handle naming a process that has gone: nothing is waited for.
    gone = fake_cuda.HANDLE.pack(fake_cuda.MAGIC, child.pid, 10**9)
    started = time.monotonic()
    first.current_stream().wait_event(first.Event.from_ipc_handle(0, gone))
    first.launch(0.0)
    first.wait_for(first.launched)
    assert time.monotonic() - started < 5
    with pytest.raises(RuntimeError):
        fake_cuda.FakeDevice(str(tmp_path), interprocess=False).Event(interprocess=True)


def test_device_work_hands_over_where_the_device_can_and_waits_on_handles():
    work = device_sync.DeviceWork()
    assert work.hand_over() is None  # no CUDA in use: nothing to hand over
    device = fake_cuda.FakeDevice(interprocess=False)  # no interprocess events here
    device_sync.stand_in(device)
    try:
        device.launch(0.01)
        assert work.hand_over() is None  # the release then waits for its device
        work.wait_on(b"\0" * 64)  # a handle it cannot open: nothing waited for, no error
    finally:
        device_sync.stand_in(None)


class _Job:
    """What gq.exec.lane.handover reads of a resident, and what billing writes."""

    def __init__(self, job_id: int, user: str, lane: int = 0) -> None:
        self.job_id, self.user, self.lane = job_id, user, lane
        self.granted_at, self.released_at, self.dirty = 0.0, None, False
        self.billed: list[tuple[float, int | None]] = []
        self.attained = self.leased = 0.0  # (a lease's tail is billed to these)

    def end_iteration(self, held: float, steps: int | None = None) -> None:
        self.billed.append((round(held, 6), steps))


def test_a_hand_over_is_allowed_and_a_handle_passed_only_between_one_users_jobs():
    from types import SimpleNamespace

    from gq.exec.lane import handover

    a1, a2, b = _Job(1, "alice"), _Job(2, "alice"), _Job(3, "bob")
    lane = SimpleNamespace(residents=[a1, a2])
    assert handover.allowed(lane, a1)
    lane.residents.append(b)
    assert not handover.allowed(lane, a1)

    books = handover.HandOvers()
    lane.residents.remove(b)
    assert books.offer(lane, a1)
    a1.granted_at = 10.0
    assert books.released(a1, "ab" * 64, 5, now=10.1)  # billed once it drains
    assert a1.billed == []
    assert books.for_grant(0, a2, now=10.2, bound=1.0) == (False, "ab" * 64)
    assert books.for_grant(0, b, now=10.2, bound=1.0) == (False, None)  # ordered after a2
    a2.granted_at = 10.2
    assert books.drained(a1, now=10.5) == 0
    assert a1.billed == [(0.5, 5)]  # its Go to its Drained
    # a2's device ran a1's tail first: billed from its end, not from a2's Go.
    books.offer(lane, a2)
    books.released(a2, "cd" * 64, 8, now=10.3)
    books.drained(a2, now=10.9)
    assert a2.billed == [(0.4, 8)]

    # Another user's job that came meanwhile waits for the tail, bounded.
    books.offer(lane, a1)
    a1.granted_at = 11.0
    books.released(a1, "ef" * 64, 9, now=11.1)
    assert books.for_grant(0, b, now=11.2, bound=1.0) == (True, None)
    assert books.due_in(now=11.2, bound=1.0) == pytest.approx(0.9)
    assert books.for_grant(0, b, now=12.2, bound=1.0) == (False, None)  # it never said
    assert a1.billed[-1] == (1.2, 9)
    # A handle the host never allowed is dropped; a job's own tail needs none.
    assert not books.offer(SimpleNamespace(residents=[a1, b]), a1)
    assert books.released(a1, "ab" * 64, 10, now=13.0) is False
    assert books.for_grant(0, b, now=13.0, bound=1.0) == (False, None)
    books.offer(lane, a1)
    books.released(a1, "ab" * 64, 11, now=14.0)
    assert books.for_grant(0, a1, now=14.1, bound=1.0) == (False, None)
    books.forget(a1, now=14.2)  # gone: billed until then
    assert a1.billed[-1][1] == 11


def test_a_lease_asked_back_hands_over_its_tail_billed_as_lease_time():
    """The Done that ends a lease asked back (a slice's end, say) hands over as a grant's
    does where its Go allowed it: a successor of its owner waits on its event, another
    user's job for its Drained; the tail is billed to the lease once it drains, never
    counted as an iteration (its page counted it). Without an event, the device was waited
    for: nothing is pending."""
    from types import SimpleNamespace

    from gq.exec.lane import handover

    a1, a2, b = _Job(1, "alice"), _Job(2, "alice"), _Job(3, "bob")
    lane = SimpleNamespace(residents=[a1, a2])
    books = handover.HandOvers()
    assert books.offer(lane, a1)  # its Go, a lease's
    books.lease_released(a1, "ab" * 64, now=20.0)  # billed until now by the lease's books
    assert books.for_grant(0, a2, now=20.001, bound=1.0) == (False, "ab" * 64)
    assert books.drained(a1, now=20.003) == 0
    assert a1.billed == [] and a1.attained == pytest.approx(0.003) == a1.leased
    assert a1.released_at == 20.003  # its gap begins once its device is done
    # Another user's job that came during the lease waits for the tail to drain.
    books.offer(lane, a1)
    books.lease_released(a1, "cd" * 64, now=21.0)
    assert books.for_grant(0, b, now=21.001, bound=1.0) == (True, None)
    assert books.drained(a1, now=21.002) == 0
    assert books.for_grant(0, b, now=21.003, bound=1.0) == (False, None)
    # No event, or one its Go never allowed: nothing pending, nothing billed.
    books.lease_released(a1, None, now=22.0)
    assert not books.offer(SimpleNamespace(residents=[a1, b]), a1)
    books.lease_released(a1, "ef" * 64, now=22.5)
    assert books.for_grant(0, b, now=22.6, bound=1.0) == (False, None)
    assert books.drained(a1, now=22.7) is None
    assert a1.attained == pytest.approx(0.005) and a1.billed == []
