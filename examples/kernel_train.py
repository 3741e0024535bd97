"""An unmodified PyTorch training loop (no gq import) whose forward pass takes --iter-ms,
standing in for a device kernel of known length (a sleep, so a busy CPU does not stretch
it), with --gap-ms of idle time per step. The tests and benchmarks run it; its last line is
JSON: the loop's wall time and its startup (process start to the first iteration)."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--iter-ms", type=float, default=5.0)
parser.add_argument("--gap-ms", type=float, default=0.0)
parser.add_argument("--start-file", help="wait for this file before the loop (saying so in "
                    "FILE.waiting)")
parser.add_argument("--infer", action="store_true", help="forward passes under no_grad only")
parser.add_argument("--crash-at", type=int, default=-1)
parser.add_argument("--spans-out", help="append each iteration's device-time span here")
parser.add_argument("--crash-how", default="exception",
                    choices=["exception", "os_exit", "sigsegv", "sys_exit0"])
args = parser.parse_args()


class Kernel(nn.Module):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.layer = nn.Linear(32, 32)
        self.spans: list[tuple[float, float]] = []

    def forward(self, x):
        begin = time.time()
        time.sleep(self.seconds)
        self.spans.append((begin, time.time()))
        return self.layer(x)


def crash(how: str) -> None:
    print(f"crashing: {how}", flush=True)
    if how == "exception":
        raise RuntimeError("deliberate crash")
    if how == "os_exit":
        os._exit(3)
    if how == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(0)


torch.set_num_threads(1)
kernel = Kernel(args.iter_ms / 1000)
model = nn.Sequential(kernel, nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 32), torch.randn(32, 1)
startup = time.time() - psutil.Process().create_time()
if args.start_file:
    # One line per job that waits, model built and torch imported: a test starts them
    # together only once all are here (resident is not enough: importing torch takes long).
    with open(f"{args.start_file}.waiting", "a") as waiting:
        waiting.write(f"{os.getpid()}\n")
    while not Path(args.start_file).exists():
        time.sleep(0.01)
start = time.perf_counter()
for step in range(args.steps):
    if args.infer:
        with torch.no_grad():
            model(x)
    else:
        loss = nn.functional.mse_loss(model(x), y)
        if step == args.crash_at:
            crash(args.crash_how)  # while holding the lane: mid-iteration
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.gap_ms:
        time.sleep(args.gap_ms / 1000)
if args.spans_out:
    with open(args.spans_out, "a") as out:
        out.write(json.dumps({"job": os.environ.get("GQ_JOB_ID"), "spans": kernel.spans}) + "\n")
print(json.dumps({"loop_seconds": time.perf_counter() - start, "steps": args.steps,
                  "startup": startup}), flush=True)
