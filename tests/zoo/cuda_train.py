"""A small seeded training loop on the device gq gives the job (GQ_DEVICE). It holds --mb MiB
of weights, runs --steps iterations, and prints one JSON line: what CUDA showed it, the
memory it had reserved while parked (after its last release) and at the end, and its
losses. ``--grow-mb N --grow-at K``: on its first run only (SLURM_RESTART_COUNT unset or 0)
it allocates N MiB more on the device at step K; with ``--lift-cap`` it first sets its own
per-process memory fraction to the whole device, as a script may."""

import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic losses

import torch  # noqa: E402
from torch import nn  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--mb", type=int, default=256)
parser.add_argument("--start-file")
parser.add_argument("--grow-mb", type=int, default=0)
parser.add_argument("--grow-at", type=int, default=3)
parser.add_argument("--lift-cap", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
device = torch.device(os.environ.get("GQ_DEVICE", "cuda:0"))
width = 1024
layers = max(1, args.mb * (1 << 20) // (width * width * 4))
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(64, width, device=device)
while args.start_file and not os.path.exists(args.start_file):
    time.sleep(0.02)
first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
kept, losses = [], []
for step in range(args.steps):
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    if step == args.grow_at and args.grow_mb and first_run:
        if args.lift_cap:
            torch.cuda.set_per_process_memory_fraction(1.0)
        kept.append(torch.empty(args.grow_mb << 20, dtype=torch.uint8, device=device))
torch.cuda.synchronize()
print(
    json.dumps(
        {
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(0),
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "losses": losses,
        }
    ),
    flush=True,
)
