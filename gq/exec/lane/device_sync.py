"""A grant means the device: at a release, the job waits until its device has run what the
iteration queued, so the next job granted the lane never runs beside this one's tail.

PyTorch queues CUDA kernels and returns: when an optimizer step or a forward returns, the
device may still be busy with it for milliseconds. Were the lane passed on then, the next
holder's kernels would be time-sliced with this one's (no MPS), and every figure the host
measures, from a grant to a release, would be the time it took to *queue* the work. So at
every release the worker records an event on the current stream and waits for it. The
event is made with ``blocking=True``: the waiting thread sleeps instead of spinning a core
(``torch.cuda.synchronize()`` spins by default). A job whose device has finished already
pays one query; a job that never used CUDA pays nothing (CUDA is not even looked at until
the script has initialised it).

A job alone on its lane (a lease) must not wait at every release: its CPU would stop
queueing work while the device runs its tail, and the device would then idle while the CPU
queues the next iteration (a 2 ms spin loop ran at 0.66 of its bare speed on an H200 so).
It keeps the lane's lock instead while its device is busy, and a thread of the worker's
lets the lock go once the device is done (:meth:`DeviceWork.then`); where the job's next
iteration begins first, it takes that back (:meth:`DeviceWork.keep`) and goes on holding
the lock, with no system call. The host, wanting the lane back, finds the lock held until
the tail has run. It runs ahead of its device by no more than one iteration: at each
release it waits (:meth:`DeviceWork.wait_kept`) until the device has only this iteration's
work and the one before it left, enough to keep the device busy while the CPU queues the
next. A job that comes meanwhile waits for what is left of those and of the iteration the
holder is queueing then, under three iterations' work, not for everything the CPU could
queue (CUDA takes about a thousand kernels before a launch blocks). The cost: a lone job
whose CPU stalls for longer than an iteration's device time leaves the device idle.
Leased beside jobs waiting for a slice of the lane, it keeps no more than this iteration's
work, so that a slice of lane time is one of device time too. A release through the host (a
Done) is held back the same way: the thread sends the Done once the device is done, while
the job runs on with its gap's work (a high-priority job's host-side work beside its own
tail); where the job asks for the lane again first, it waits for the device and sends the
Done itself, before its READY.

Where every job on the lane is its owner's, a contended release need not wait at all
(:meth:`DeviceWork.hand_over`, gq.exec.lane.handover): it records an interprocess event
(one per device, kept for the process's life: a handle opened elsewhere must not outlive
its event) and the Done carries its handle at once; the next holder's stream waits on it
before its first kernel (:meth:`DeviceWork.wait_on`), so the device runs the two back to
back, and the thread above says Drained once the tail has run. Where the event cannot be
made (no CUDA IPC) the release waits as before.

Work on another stream than the current one is not waited for; a job that runs such work
past its release runs it outside the lane, as it would by starting a thread of its own.

The few ``torch.cuda`` calls made here go through :func:`cuda`, which a test may point at a
stand-in device (tests/zoo/fake_cuda.py) whose kernels run on a thread, and which the
processes of a test may share (contexts time-slicing, interprocess events).
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import Any

_stand_in: Any = None
HANDLE_SIZE = 64  # bytes of a CUDA interprocess event's handle (cudaIpcEventHandle_t)


def stand_in(module: Any) -> None:
    """Use ``module`` (current_device, current_stream().wait_event, Event(blocking=...,
    interprocess=...) with record, query, synchronize and ipc_handle, Event.from_ipc_handle,
    and the memory statistics gq.exec.job.worker_memory reads) in place of torch.cuda
    from now on, initialised or not: a fake device, for tests without a GPU (None: torch's
    own again)."""
    global _stand_in
    _stand_in = module


def cuda() -> Any:
    """The CUDA module in use, or None where the script has not initialised CUDA."""
    if _stand_in is not None:
        return _stand_in
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


class DeviceWork:
    """What the job has queued on its device, waited for at each release."""

    def __init__(self) -> None:
        self._events: dict[int, Any] = {}  # by device: an event belongs to one
        self._tail: _Tail | None = None  # made when a lease's release first finds it busy
        self._shared: dict[int, Any] = {}  # by device: the interprocess event handed over
        # The events of the ``give``s taken back (keep), oldest first, their work not yet
        # run. A few: one stream's events are reached in order, so waiting for a later one
        # waits for those it pushed out (a capture, which waits for none, may push some).
        self._kept: collections.deque[Any] = collections.deque(maxlen=4)

    def finish(self) -> None:
        """Return once the device has run everything queued so far on the current stream."""
        module = cuda()
        if module is None or _capturing(module):
            return
        device = module.current_device()
        event = self._events.get(device)
        if event is None:
            event = self._events[device] = module.Event(blocking=True)
        event.record()
        if not event.query():
            event.synchronize()
        self._kept.clear()  # (all of it run)

    def then(self, give: Callable[[], None]) -> None:
        """Call ``give`` once the device has run everything queued so far on the current
        stream: now where it has (or CUDA is not in use), else from a thread that waits for
        it while the job runs on."""
        module = cuda()
        if module is None or _capturing(module):
            give()
            return
        event = module.Event(blocking=True)  # its own: the waiting thread keeps it
        event.record()
        if event.query():
            give()
            return
        if self._tail is None:
            self._tail = _Tail()
        self._tail.hand(event, give)

    def hand_over(self) -> bytes | None:
        """Record an interprocess event after everything queued so far on the current
        stream and return its handle (64 bytes) for the next holder's stream to wait on;
        None where CUDA is not in use, a graph is being captured, or the device cannot share
        events (then the release waits for the device, as :meth:`then` does)."""
        module = cuda()
        if module is None or _capturing(module):
            return None
        device = module.current_device()
        try:
            event = self._shared.get(device)
            if event is None:  # one per device, kept: a handle opened elsewhere must not
                event = module.Event(blocking=True, interprocess=True)  # outlive its event
                self._shared[device] = event
            event.record()
            handle = bytes(event.ipc_handle())
        except Exception:  # noqa: BLE001 - no CUDA IPC here (a platform, an old torch)
            return None
        return handle if len(handle) == HANDLE_SIZE else None

    def wait_on(self, handle: bytes) -> None:
        """The current stream's next kernels run once the device has run what the previous
        holder (another process of this job's owner) queued before its event: queued now,
        waited for by the device, not by this thread. Where the event cannot be opened (its
        process has gone, and its work with it), nothing is waited for."""
        module = cuda()
        if module is None or _capturing(module):
            return  # no CUDA yet: creating a context takes far longer than a tail
        try:
            event = module.Event.from_ipc_handle(module.current_device(), handle)
            module.current_stream().wait_event(event)
        except Exception:  # noqa: BLE001 - a handle of a process that has ended
            pass

    def keep(self) -> Callable[[], None] | None:
        """Take back a ``give`` not made yet, and return it (None: nothing was pending). The
        caller makes it, or keeps what it would have let go (:meth:`wait_kept` waits for
        the work it was to follow)."""
        pending = None if self._tail is None else self._tail.cancel()
        if pending is None:
            return None
        self._kept.append(pending[0])
        return pending[1]

    def wait_kept(self, behind: int = 0) -> None:
        """Return once no more than the last ``behind`` of the ``give``s taken back still
        have work queued on the device (events of one stream are reached in order): at a
        leased release, ``behind`` iterations' work besides this one's is all the job
        keeps on its device (gq.exec.lane.lease)."""
        module = cuda()
        if module is None or _capturing(module):
            return  # (a wait inside a capture would break it)
        kept = self._kept
        try:
            while kept and (len(kept) > behind or kept[0].query()):
                kept.popleft().synchronize()  # (at once where it was reached)
        except Exception:  # noqa: BLE001 - a device that failed has nothing left to run
            kept.clear()


def _capturing(module: Any) -> bool:
    """Whether the current stream is capturing a CUDA graph: an event recorded or waited
    for on it then would break the capture, and nothing it queues runs before a replay."""
    capturing = getattr(module, "is_current_stream_capturing", None)
    return capturing is not None and capturing()


class _Tail:
    """One pending ``give``, made by a thread of its own once its event has been reached."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: tuple[Any, Callable[[], None]] | None = None
        threading.Thread(target=self._run, name="gq-device-tail", daemon=True).start()

    def hand(self, event: Any, give: Callable[[], None]) -> None:
        with self._changed:
            self._pending = (event, give)
            self._changed.notify()

    def cancel(self) -> tuple[Any, Callable[[], None]] | None:
        with self._changed:
            pending, self._pending = self._pending, None
        return pending

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None)
                pending = self._pending
                assert pending is not None  # wait_for returned with it set, the lock held
            try:
                pending[0].synchronize()
            except Exception:  # noqa: BLE001 - a device that failed has nothing left to run
                pass
            with self._changed:
                if self._pending is pending:  # not taken back meanwhile
                    self._pending = None
                    pending[1]()
