"""The GPU check's job (bench/gpu_check.py): one kind of training loop that notes each
iteration's device interval on the system-wide monotonic clock.

  python job.py --kind spin|matmul|launch|graph --device cuda|cpu --iters N --out RUN.json

A plain PyTorch script: gq finds its iterations through module calls and optimizer steps
(--plain: no torch at all, CPU busy work in gq.steps, for quick runs on small machines).
On CUDA an iteration's interval is two timing events on the current stream around its
device work, recorded without synchronizing, mapped to time.monotonic_ns() through an
anchor event synchronized at the loop's start and one at its end (drift corrected); on the
CPU it is monotonic_ns around the work. Once set up the job creates RUN.json.ready and waits
for --start-file; it stops early once --stop-file exists. At its end it writes RUN.json:
every iteration's [start, end] in ns (the first --warm are warm-up), and its timed loop's
wall time and iterations per second. --die: it kills itself once its loop has queued its
last iteration (--last-ms of spin on CUDA), its tail still on the device.
"""

import argparse
import json
import os
import signal
import time

p = argparse.ArgumentParser()
p.add_argument("--kind", choices=("spin", "matmul", "launch", "graph"), default="spin")
p.add_argument("--device", default="cuda")
p.add_argument("--plain", action="store_true", help="no torch: busy work in gq.steps")
p.add_argument("--iters", type=int, default=200)
p.add_argument("--warm", type=int, default=3)
p.add_argument("--ms", type=float, default=2.0, help="spin, graph, plain: ms of work")
p.add_argument("--gap-ms", type=float, default=0.0, help="host idle time between iterations")
p.add_argument("--last-ms", type=float, help="spin on CUDA: the last iteration's ms of work")
p.add_argument("--die", action="store_true", help="SIGKILL itself once its loop has queued")
p.add_argument("--width", type=int, default=4096)
p.add_argument("--batch", type=int, default=8192)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--start-file")
p.add_argument("--stop-file")
p.add_argument("--out", required=True)
a = p.parse_args()
now = time.monotonic_ns
gap = a.gap_ms / 1000
total = a.warm + a.iters


def busy(ms):
    end = now() + int(ms * 1e6)
    while now() < end:
        pass


def stopped():
    return a.stop_file is not None and os.path.exists(a.stop_file)


def ready_and_wait():
    open(a.out + ".ready", "w").close()
    give_up = time.monotonic() + 900
    while a.start_file and not os.path.exists(a.start_file) and time.monotonic() < give_up:
        time.sleep(0.005)


def finish(intervals, loop_ns, extra, pieces=1):
    """``pieces``: intervals an iteration has (a graph job's module call and its replay,
    each granted on its own: the lane may pass between them)."""
    done = (len(intervals) - a.warm * pieces) // pieces
    result = {
        "kind": a.kind,
        "device": a.device,
        "plain": a.plain,
        "pid": os.getpid(),
        "gq_job": os.environ.get("GQ_JOB_ID"),
        "warm": a.warm * pieces,
        "pieces": pieces,
        "iters": done,
        "iv": intervals,
        "wall_s": loop_ns / 1e9,
        "its": done / (loop_ns / 1e9) if done > 0 and loop_ns > 0 else None,
        **extra,
    }
    with open(a.out + ".tmp", "w") as out:
        json.dump(result, out)
    os.replace(a.out + ".tmp", a.out)


if a.plain:
    import gq

    def items():
        for i in range(total):
            if stopped():
                return
            if i and gap:
                time.sleep(gap)
            yield i

    ready_and_wait()
    spans, loop_start = [], now()
    for i in gq.steps(items()):
        if i == a.warm:
            loop_start = now()
        begin = now()
        busy(a.ms)
        spans.append([begin, now()])
    finish(spans, now() - loop_start, {})
    raise SystemExit(0)

import torch  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
dev = torch.device(a.device)
cuda = dev.type == "cuda"
starts, ends = [], []


def mark(into):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        into.append(event)
    else:
        into.append(now())


class Marked(torch.nn.Module):
    """The model the loop calls: notes the iteration's start inside the call (inside the
    grant); on the CPU a spin's or graph's work is here too."""

    def __init__(self, inner, cpu_ms=0.0, end_here=False):
        super().__init__()
        self.inner, self.cpu_ms, self.end_here = inner, cpu_ms, end_here

    def forward(self, x):
        mark(starts)
        y = self.inner(x)
        if self.cpu_ms:
            busy(self.cpu_ms)
        if self.end_here:
            mark(ends)
        return y


dtype = torch.bfloat16 if cuda else torch.float32
extra = {}
if a.kind in ("spin", "graph"):
    spin_cpu = 0.0 if cuda else a.ms
    model = Marked(torch.nn.Linear(64, 64), spin_cpu, end_here=a.kind == "graph")
    x = torch.randn(32, 64)
elif a.kind == "matmul":
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width, bias=False), torch.nn.ReLU()]
    model = Marked(torch.nn.Sequential(*layers))
    x = torch.randn(a.batch, a.width)
else:  # launch: ~50 tiny layers, batch 32: the host's launches bound it
    model = Marked(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(a.layers)]))
    x = torch.randn(32, 64)
model = model.to(dev, dtype if a.kind == "matmul" else torch.float32)
x = x.to(dev, dtype if a.kind == "matmul" else torch.float32)
if a.kind == "matmul":
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
# The iteration's end, inside the grant: a per-optimizer post hook runs before the global
# ones (gq releases the lane from a global one).
optimizer.register_step_post_hook(lambda *_: mark(ends))

if cuda:
    (torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)).sum()  # cuBLAS up
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)  # clocks up first
    e0.record()
    torch.cuda._sleep(4_000_000)
    e1.record()
    e1.synchronize()
    cycles = int(a.ms * 4_000_000 / e0.elapsed_time(e1))
    extra["sleep_cycles"] = cycles
    last_cycles = int(cycles * a.last_ms / a.ms) if a.last_ms else cycles
if a.kind == "graph" and cuda:
    A = torch.randn(a.width, a.width, device=dev, dtype=dtype)
    B, C = torch.randn_like(A), torch.empty_like(A)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.matmul(A, B, out=C)
    torch.cuda.current_stream().wait_stream(side)
    e0.record()
    for _ in range(5):
        torch.matmul(A, B, out=C)
    e1.record()
    e1.synchronize()
    count = max(1, round(a.ms / (e0.elapsed_time(e1) / 5)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # gq's threads may call CUDA
        for _ in range(count):
            torch.matmul(A, B, out=C)
    torch.cuda.synchronize()
    extra["graph_matmuls"] = count


def iteration(last=False):
    if a.kind == "graph":
        with torch.no_grad():  # an evaluation batch: gq releases at the call's end
            model(x)
        if cuda:  # the device work, outside any module call: an interval of its own
            mark(starts)
            graph.replay()
            mark(ends)
        return
    optimizer.zero_grad(set_to_none=True)
    loss = model(x).float().square().mean()
    loss.backward()
    if a.kind == "spin" and cuda:
        torch.cuda._sleep(last_cycles if last else cycles)
    optimizer.step()


ready_and_wait()
if cuda:
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    anchor.synchronize()
    t0 = now()
loop_start = now()
for i in range(total):
    if i == a.warm:
        if cuda:
            torch.cuda.synchronize()  # once, before the timed loop: not inside it
        loop_start = now()
    if stopped():
        break
    iteration(i == total - 1)
    if gap:
        time.sleep(gap)
if a.die:  # released, its last iteration's tail still on the device (a holder that dies)
    os.kill(os.getpid(), signal.SIGKILL)
if cuda:
    torch.cuda.synchronize()
loop_ns = now() - loop_start
if cuda:
    last = torch.cuda.Event(enable_timing=True)
    last.record()
    last.synchronize()
    t1 = now()
    scale = (t1 - t0) / (anchor.elapsed_time(last) * 1e6)
    extra["drift_ppm"] = (scale - 1) * 1e6
    starts = [t0 + int(anchor.elapsed_time(e) * 1e6 * scale) for e in starts]
    ends = [t0 + int(anchor.elapsed_time(e) * 1e6 * scale) for e in ends]
finish([list(s) for s in zip(starts, ends)], loop_ns, extra, 2 if a.kind == "graph" and cuda else 1)
