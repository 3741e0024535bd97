"""A stand-in for the few ``torch.cuda`` calls gq makes (gq.exec.lane.device_sync), for tests
without a GPU: a device whose kernels run one after another on a thread of this process,
asynchronously, as a GPU runs what the CPU queued.

``launch(seconds)`` queues a kernel and returns at once; the device thread runs each for
that long and records when it ran, on the monotonic clock all processes share. ``Event``
records the position in the queue and waits (``synchronize``) or asks (``query``) whether
the device has got past it, as ``torch.cuda.Event`` does."""

from __future__ import annotations

import collections
import threading
import time


class FakeDevice:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._queue: collections.deque[float] = collections.deque()
        self.launched = 0
        self.completed = 0
        self.intervals: list[tuple[int, int]] = []  # (start_ns, end_ns) of each kernel
        threading.Thread(target=self._run, daemon=True).start()

    def launch(self, seconds: float) -> None:
        with self._changed:
            self._queue.append(seconds)
            self.launched += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue)
                seconds = self._queue.popleft()
            begin = time.monotonic_ns()
            time.sleep(seconds)  # the device is busy; no CPU of the job's is
            with self._changed:
                self.intervals.append((begin, time.monotonic_ns()))
                self.completed += 1
                self._changed.notify_all()

    def wait_for(self, mark: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.completed >= mark)

    # ----- the torch.cuda surface gq uses ------------------------------------------------
    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def Event(self, blocking: bool = False) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self)

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
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.mark = 0

    def record(self) -> None:
        self.mark = self.device.launched

    def query(self) -> bool:
        return self.device.completed >= self.mark

    def synchronize(self) -> None:
        self.device.wait_for(self.mark)
