"""The GPU check's checkpoint job (bench/gpu_check.py, phase checkpoint): a small
deterministic training loop beside a block of device memory it holds, so that a suspend
that moves its memory to host memory and back can be judged bit for bit.

  python hold_train.py --device cuda|cpu --hold-mb N --iters K --out RUN.json
                       [--start-file F] [--mark-at I] [--step-ms MS]

Seeded and deterministic (torch.use_deterministic_algorithms): two runs give the same
losses, bit for bit, however often the run was suspended. Once set up it creates
RUN.json.ready and waits for --start-file; after iteration --mark-at it creates
RUN.json.marked (the check suspends it then). At its end it writes RUN.json: every
iteration's loss, as the float's hex, a checksum of the held block (what a restore must
give back), its pid, and its loop's wall time.
"""

import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--hold-mb", type=int, default=1024)
p.add_argument("--iters", type=int, default=100)
p.add_argument("--mark-at", type=int, default=-1)
p.add_argument("--step-ms", type=float, default=0.0, help="host time per iteration")
p.add_argument("--start-file")
p.add_argument("--out", required=True)
a = p.parse_args()

import torch  # noqa: E402

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
dev = torch.device(a.device)
# The held block: values that say where they are, so a restore that lost or moved any
# page changes the checksum.
count = a.hold_mb * (1 << 20) // 4
held = torch.arange(count, dtype=torch.int32, device=dev).remainder_(9973).to(torch.float32)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
).to(dev)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator(device="cpu").manual_seed(1)
inputs = torch.randn(64, 256, generator=generator).to(dev)
labels = torch.randint(0, 10, (64,), generator=generator).to(dev)


def checksum() -> str:
    step = max(1, count // 4096)
    return float(held[::step].double().sum().item()).hex()


before = checksum()
open(a.out + ".ready", "w").close()
give_up = time.monotonic() + 900
while a.start_file and not os.path.exists(a.start_file) and time.monotonic() < give_up:
    time.sleep(0.005)
losses, started = [], time.monotonic()
for i in range(a.iters):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    losses.append(float(loss.item()).hex())
    if a.step_ms:
        time.sleep(a.step_ms / 1000)
    if i == a.mark_at:
        open(a.out + ".marked", "w").close()
result = {
    "pid": os.getpid(),
    "gq_job": os.environ.get("GQ_JOB_ID"),
    "losses": losses,
    "checksum_before": before,
    "checksum_after": checksum(),
    "wall_s": time.monotonic() - started,
}
with open(a.out + ".tmp", "w") as out:
    json.dump(result, out)
os.replace(a.out + ".tmp", a.out)
