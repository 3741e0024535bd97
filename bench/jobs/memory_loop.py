"""A seeded training loop whose losses are its result (one JSON line at the end).
``--grow-mb N``: on its first run only (SLURM_RESTART_COUNT unset or 0) it overshoots at
step ``--grow-at``: ``--how allocate`` holds N MiB more for real, ``--how raise`` raises
the error CUDA's allocator raises for an ask of N MiB. ``--leave FILE``: once its steps are
done, it ends only once FILE exists (a test decides when its room is free)."""

import argparse
import json
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--pause", type=float, default=0.02)
parser.add_argument("--grow-mb", type=int, default=0)
parser.add_argument("--grow-at", type=int, default=3)
parser.add_argument("--how", choices=("allocate", "raise"), default="allocate")
parser.add_argument("--leave")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(32, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 32)
target = data.sum(dim=1, keepdim=True)
first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
kept, losses = [], []
for step in range(args.steps):
    optimizer.zero_grad()
    loss = ((model(data) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    losses.append(round(loss.item(), 6))
    if step == args.grow_at and args.grow_mb and first_run:
        if args.how == "raise":
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {args.grow_mb}.00 MiB."
            )
        kept.append(bytearray(args.grow_mb << 20))
        kept[-1][::4096] = b"x" * len(kept[-1][::4096])
    time.sleep(args.pause)
while args.leave and not os.path.exists(args.leave):
    time.sleep(0.05)
print(json.dumps(losses), flush=True)
