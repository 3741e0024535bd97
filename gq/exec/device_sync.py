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

Work on another stream than the current one is not waited for; a job that runs such work
past its release runs it outside the lane, as it would by starting a thread of its own.

The few ``torch.cuda`` calls made here go through :func:`cuda`, which a test may point at a
stand-in device (tests/zoo/fake_cuda.py) whose kernels run on a thread.
"""

from __future__ import annotations

import sys
from typing import Any

_stand_in: Any = None


def stand_in(module: Any) -> None:
    """Use ``module`` (is_initialized, Event(blocking=...) with record, query, synchronize)
    in place of torch.cuda from now on: a fake device, for tests without a GPU."""
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

    def finish(self) -> None:
        """Return once the device has run everything queued so far on the current stream."""
        module = cuda()
        if module is None:
            return
        device = module.current_device()
        event = self._events.get(device)
        if event is None:
            event = self._events[device] = module.Event(blocking=True)
        event.record()
        if not event.query():
            event.synchronize()
