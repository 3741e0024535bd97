"""A stand-in for the few ``torch.cuda`` calls gq makes (gq.exec.lane.device_sync), for tests
without a GPU: a device whose kernels run one after another on a thread of this process,
asynchronously, as a GPU runs what the CPU queued.

``launch(seconds)`` queues a kernel and returns at once; the device thread runs each for
that long and records when it ran, on the monotonic clock all processes share. ``Event``
records the position in the queue and waits (``synchronize``) or asks (``query``) whether
the device has got past it, as ``torch.cuda.Event`` does.

Given a directory (``shared``, or the environment's ``GQ_FAKE_CUDA_DEVICE``), every process
that names it shares one device, as the processes of a node share a GPU without MPS: their
contexts time-slice. A kernel runs holding the directory's ``lock`` (an flock), so kernels
of two processes never run at once; where the context that ran last was another process's,
the kernel first pays ``switch_us`` (``GQ_FAKE_CUDA_SWITCH_US``), as a context switch costs.
Every kernel is appended to ``kernels`` as ``pid start_ns end_ns queued_ns``, and each process
publishes how far its queue has run in ``done-PID``. Events made with ``interprocess=True``
give an ``ipc_handle()`` (64 bytes naming the process and the position), which another
process opens with ``Event.from_ipc_handle(device, handle)``; its
``current_stream().wait_event(event)`` holds its next kernels until that process's device
has got past the position, or that process has died (its context gone, as CUDA's goes).
``interprocess=False`` at construction: a device without interprocess events (making one
raises, as on a platform without CUDA IPC)."""

from __future__ import annotations

import collections
import fcntl
import os
import struct
import threading
import time

HANDLE = struct.Struct("<8sqq40x")  # magic, pid, mark: 64 bytes, as CUDA's handles are
MAGIC = b"gqfake01"
POLL = 0.00002  # seconds between looks at another process's progress


class FakeDevice:
    def __init__(self, shared: str | None = None, interprocess: bool = True) -> None:
        self._changed = threading.Condition()
        # ("kernel", seconds, queued_ns) or ("wait", pid, mark), in the order queued
        self._queue: collections.deque[tuple[str, float, int]] = collections.deque()
        self.launched = 0
        self.completed = 0
        self.intervals: list[tuple[int, int]] = []  # (start_ns, end_ns) of each kernel
        self.queued: list[int] = []  # when each of them was launched (ns)
        self.interprocess = interprocess
        self.shared = shared if shared is not None else os.environ.get("GQ_FAKE_CUDA_DEVICE")
        self.switch = int(os.environ.get("GQ_FAKE_CUDA_SWITCH_US", "0")) / 1e6
        self.pid = os.getpid()
        self.Event = _Events(self)  # (torch's spelling: a class with a classmethod)
        self._stream = FakeStream(self)
        if self.shared is not None:
            self._lock = _open(os.path.join(self.shared, "lock"))
            self._log = _open(os.path.join(self.shared, "kernels"), os.O_APPEND)
            self._done = _open(os.path.join(self.shared, f"done-{self.pid}"))
            os.pwrite(self._done, struct.pack("<q", 0), 0)
        threading.Thread(target=self._run, daemon=True).start()

    def launch(self, seconds: float) -> None:
        self._put(("kernel", seconds, time.monotonic_ns()))

    def _put(self, item: tuple[str, float, int]) -> None:
        with self._changed:
            self._queue.append(item)
            self.launched += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue)
                item = self._queue.popleft()
            kind, first, second = item
            if kind == "wait":
                _wait_until_past(self.shared, self._lock, int(first), second)
                begin = end = 0
            else:
                begin, end = self._kernel(first, second)
            with self._changed:
                if begin:
                    self.intervals.append((begin, end))
                    self.queued.append(second)
                self.completed += 1
                if self.shared is not None and not begin:  # (a kernel's: published already)
                    os.pwrite(self._done, struct.pack("<q", self.completed), 0)
                self._changed.notify_all()

    def _kernel(self, seconds: float, queued: int) -> tuple[int, int]:
        if self.shared is None:
            begin = time.monotonic_ns()
            time.sleep(seconds)  # the device is busy; no CPU of the job's is
            return begin, time.monotonic_ns()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            last = os.pread(self._lock, 8, 0)
            if last != struct.pack("<q", self.pid):
                if self.switch:
                    time.sleep(self.switch)
                os.pwrite(self._lock, struct.pack("<q", self.pid), 0)
            begin = time.monotonic_ns()
            time.sleep(seconds)
            end = time.monotonic_ns()
            # Published before the context lets the device go: a process waiting on this
            # one's event sees it as soon as the kernel is over.
            os.pwrite(self._done, struct.pack("<q", self.completed + 1), 0)
            os.write(self._log, f"{self.pid} {begin} {end} {queued}\n".encode())
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        return begin, end

    def wait_for(self, mark: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.completed >= mark)

    # ----- the torch.cuda surface gq uses ------------------------------------------------
    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def current_stream(self) -> FakeStream:
        return self._stream

    # Memory statistics: what a test sets, and whether anything reset the peaks.
    allocated = reserved_peak = 0
    resets = 0

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_reserved(self) -> int:
        return self.reserved_peak

    def memory_reserved(self) -> int:
        return self.reserved_peak

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def empty_cache(self) -> None:
        pass


class FakeEvent:
    def __init__(self, device: FakeDevice, interprocess: bool = False) -> None:
        self.device = device
        self.mark = 0
        self.interprocess = interprocess
        self.pid = device.pid

    def record(self) -> None:
        self.mark = self.device.launched

    def query(self) -> bool:
        return self.device.completed >= self.mark

    def synchronize(self) -> None:
        self.device.wait_for(self.mark)

    def ipc_handle(self) -> bytes:
        if not self.interprocess:
            raise RuntimeError("the event was not made with interprocess=True")
        return HANDLE.pack(MAGIC, self.pid, self.mark)


class _Events:
    """``device.Event(...)`` makes an event; ``device.Event.from_ipc_handle`` opens
    another process's, as ``torch.cuda.Event`` does."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def __call__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> FakeEvent:
        if interprocess and (not self.device.interprocess or self.device.shared is None):
            raise RuntimeError("this device has no interprocess events")
        return FakeEvent(self.device, interprocess)

    def from_ipc_handle(self, device: int, handle: bytes) -> FakeEvent:
        if self.device.shared is None:
            raise RuntimeError("this device has no interprocess events")
        magic, pid, mark = HANDLE.unpack(handle)  # (struct.error: not 64 bytes)
        if magic != MAGIC or pid <= 0 or mark < 0:
            raise RuntimeError("not an interprocess event's handle")
        event = FakeEvent(self.device, interprocess=True)
        event.pid, event.mark = pid, mark
        return event


class FakeStream:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def wait_event(self, event: FakeEvent) -> None:
        """This stream's later kernels run once ``event`` has been reached: another
        process's, as far as its device has run; one of this process's, in order anyway."""
        if event.pid != self.device.pid:
            self.device._put(("wait", event.pid, event.mark))


def _open(path: str, flags: int = 0) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, 0o666)
    try:
        os.fchmod(fd, 0o666)  # (the test's users share the device)
    except PermissionError:
        pass  # made by another user, who opened it to all
    return fd


def _wait_until_past(shared: str | None, lock: int, pid: int, mark: int) -> None:
    """Until process ``pid``'s device has run ``mark`` items, or ``pid`` has died. While a
    kernel runs (of ``pid``'s, most often) this sleeps on the device's lock, which its end
    lets go, rather than polling: a loaded machine's CPUs go to the jobs."""
    path = os.path.join(shared or "", f"done-{pid}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # never ran on this device: nothing to wait for
    try:
        while struct.unpack("<q", os.pread(fd, 8, 0).ljust(8, b"\0"))[0] < mark:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return  # its context is gone, and with it what it queued
            except PermissionError:
                pass  # alive, another user's
            fcntl.flock(lock, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_UN)
            if struct.unpack("<q", os.pread(fd, 8, 0).ljust(8, b"\0"))[0] < mark:
                time.sleep(POLL)  # between two of its kernels, or before its first
    finally:
        os.close(fd)
