"""A job whose every iteration queues two kernels on a fake device (tests/zoo/fake_cuda.py)
and returns without waiting for them, as a PyTorch step on a GPU does; once its loop is
over it waits for its device and writes when each of its kernels was queued and ran, and
how long its loop took, (JSON) to its first argument. Under gq the fake device stands in
for torch.cuda in gq's release path. Where ``GQ_FAKE_CUDA_DEVICE`` names a directory, the
jobs that name it share one device (contexts time-slice: see fake_cuda.py);
``GQ_FAKE_CUDA_IPC=0`` makes it one without interprocess events, so that its releases wait
for the device.

Its iterations are marked with ``gq.steps``; with ``compiled`` (a fifth argument) each is
instead a training step compiled whole by ``torch.compile`` (forward, backward, the
kernels and the optimizer's step inside one compiled function), as a script would write
one that gq finds no module call in.

    python fake_kernels.py OUT [ITERATIONS] [KERNEL_MS] [START_FILE|-] [compiled]"""

import json
import os
import sys
import time

from fake_cuda import FakeDevice

import gq
from gq.exec.job import session as job_session
from gq.exec.lane import device_sync

out = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 10
kernel = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.02
start = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
compiled = sys.argv[5:6] == ["compiled"]
device = FakeDevice(interprocess=os.environ.get("GQ_FAKE_CUDA_IPC") != "0")
device_sync.stand_in(device)
waited = []  # the handles of other jobs' events its grants made it wait on
if job_session.active is not None:
    work = job_session.active.device
    wait_on = work.wait_on
    work.wait_on = lambda handle: waited.append(handle.hex()) or wait_on(handle)
if compiled:
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")  # (no C compiler needed)
    def train_step(batch):
        model(batch).pow(2).mean().backward()
        device.launch(kernel)  # (dynamo runs it as it is, between two compiled graphs)
        device.launch(kernel)
        optimizer.step()
        optimizer.zero_grad()

    train_step(torch.ones(2, 4))  # compiled before the timed loop
    device.wait_for(device.launched)
    device.intervals.clear()
    device.queued.clear()
    loop = (train_step(torch.ones(2, 4)) for _ in range(iterations))
else:
    loop = (device.launch(kernel) or device.launch(kernel) for _ in gq.steps(range(iterations)))
if start:
    with open(f"{start}.waiting", "a") as waiting:
        waiting.write(f"{os.getpid()}\n")
    while not os.path.exists(start):
        time.sleep(0.01)
begin = time.monotonic()
for _ in loop:
    pass
looped = time.monotonic() - begin  # what the job's own thread spent, queueing and waiting
device.wait_for(device.launched)
with open(out, "w") as result:
    json.dump(
        {
            "kernels": device.intervals,
            "queued": device.queued,
            "loop_s": looped,
            "pid": os.getpid(),
            "waited": waited,
        },
        result,
    )
