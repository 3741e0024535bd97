"""An unmodified PyTorch training loop (no gq import) whose forward pass takes --iter-ms,
standing in for a device kernel of known length (a sleep, so a busy CPU does not stretch
it), with --gap-ms of idle time per step. The tests and benchmarks run it; its last line is
JSON: the loop's wall time and its startup (process start to the first iteration).

With --no-torch the same loop imports no torch and marks its iterations with gq.steps
instead: it starts in a tenth of the time and CPU, for the tests whose subject is what the
scheduler does with iterations rather than how gq finds them in a PyTorch script."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--iter-ms", type=float, default=5.0)
parser.add_argument("--gap-ms", type=float, default=0.0)
parser.add_argument("--start-file", help="wait for this file before the loop (saying so in "
                    "FILE.waiting)")
parser.add_argument("--infer", action="store_true", help="forward passes under no_grad only")
parser.add_argument("--crash-at", type=int, default=-1)
parser.add_argument("--spans-out", help="append each iteration's device-time span here, and "
                    "when each step was asked for (with --no-torch: when gq.steps asks for the "
                    "lane)")
parser.add_argument("--stop-file", help="end the loop early, at a step boundary, once this "
                    "file exists")
parser.add_argument("--crash-how", default="exception",
                    choices=["exception", "os_exit", "sigsegv", "sys_exit0"])
parser.add_argument("--no-torch", action="store_true",
                    help="import no torch: iterations are gq.steps, each a sleep of --iter-ms")
args = parser.parse_args()


seconds = args.iter_ms / 1000
spans: list[tuple[float, float]] = []
asked: list[float] = []


def kernel() -> None:
    begin = time.time()
    time.sleep(seconds)
    spans.append((begin, time.time()))


def since_process_start() -> float:
    """Seconds since this process started, to a clock tick (psutil's create_time is off by
    up to a second: the kernel gives the boot time in whole seconds)."""
    with open("/proc/uptime") as uptime, open("/proc/self/stat") as stat:
        now, fields = float(uptime.read().split()[0]), stat.read()
    started = int(fields[fields.rindex(")") + 2:].split()[19])
    return now - started / os.sysconf("SC_CLK_TCK")


def crash(how: str) -> None:
    print(f"crashing: {how}", flush=True)
    if how == "exception":
        raise RuntimeError("deliberate crash")
    if how == "os_exit":
        os._exit(3)
    if how == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(0)


def steps_and_gaps():
    """The step numbers, each step followed by --gap-ms idle (outside its iteration)."""
    for step in range(args.steps):
        if args.stop_file and os.path.exists(args.stop_file):
            return
        asked.append(time.time())  # last before the yield: gq.steps asks for the lane next
        yield step
        if args.gap_ms:
            time.sleep(args.gap_ms / 1000)


if args.no_torch:
    import gq

    steps = gq.steps(steps_and_gaps())

    def iteration(step: int) -> None:
        kernel()
        if step == args.crash_at:
            crash(args.crash_how)  # while holding the lane: mid-iteration
else:
    import torch
    from torch import nn

    class Kernel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(32, 32)

        def forward(self, x):
            kernel()
            return self.layer(x)

    torch.set_num_threads(1)
    model = nn.Sequential(Kernel(), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 32), torch.randn(32, 1)
    steps = steps_and_gaps()

    def iteration(step: int) -> None:
        if args.infer:
            with torch.no_grad():
                model(x)
            return
        loss = nn.functional.mse_loss(model(x), y)
        if step == args.crash_at:
            crash(args.crash_how)  # while holding the lane: mid-iteration
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


startup = since_process_start()
if args.start_file:
    # One line per job that waits, ready for its loop: a test starts them together only
    # once all are here (resident is not enough: importing torch takes long).
    with open(f"{args.start_file}.waiting", "a") as waiting:
        waiting.write(f"{os.getpid()}\n")
    while not Path(args.start_file).exists():
        time.sleep(0.01)
start = time.perf_counter()
for step in steps:
    iteration(step)
if args.spans_out:
    with open(args.spans_out, "a") as out:
        out.write(json.dumps({"job": os.environ.get("GQ_JOB_ID"), "spans": spans,
                              "asked": asked}) + "\n")
print(json.dumps({"loop_seconds": time.perf_counter() - start, "steps": len(spans),
                  "startup": startup}), flush=True)
