"""A job whose every iteration queues two kernels on a fake device (tests/zoo/fake_cuda.py)
and returns without waiting for them, as a PyTorch step on a GPU does; once its loop is
over it waits for its device and writes when each of its kernels ran, and how long its
loop took, (JSON) to its first argument. Under gq the fake device stands in for torch.cuda in gq's release path.

    python fake_kernels.py OUT [ITERATIONS] [KERNEL_MS] [START_FILE]"""

import json
import os
import sys
import time

from fake_cuda import FakeDevice

import gq
from gq.exec import device_sync

out = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 10
kernel = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.02
start = sys.argv[4] if len(sys.argv) > 4 else None
device = FakeDevice()
device_sync.stand_in(device)
if start:
    with open(f"{start}.waiting", "a") as waiting:
        waiting.write(f"{os.getpid()}\n")
    while not os.path.exists(start):
        time.sleep(0.01)
begin = time.monotonic()
for _ in gq.steps(range(iterations)):
    device.launch(kernel)
    device.launch(kernel)
looped = time.monotonic() - begin  # what the job's own thread spent, queueing and waiting
device.wait_for(device.launched)
with open(out, "w") as result:
    json.dump({"kernels": device.intervals, "loop_s": looped}, result)
