"""A seeded training loop on the device gq gives the job (GQ_DEVICE) whose losses are its
result (one JSON line at the end). ``--grow-mb N --grow-at K``: on its first run only
(SLURM_RESTART_COUNT unset or 0), it allocates N MiB more on the device at step K."""

import argparse
import json
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from torch import nn  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--mb", type=int, default=64)
parser.add_argument("--grow-mb", type=int, default=0)
parser.add_argument("--grow-at", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
device = torch.device(os.environ.get("GQ_DEVICE", "cuda:0"))
width = 1024
layers = max(1, args.mb * (1 << 20) // (width * width * 4))
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(64, width, device=device)
first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
kept, losses = [], []
for step in range(args.steps):
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    if step == args.grow_at and args.grow_mb and first_run:
        kept.append(torch.empty(args.grow_mb << 20, dtype=torch.uint8, device=device))
print(json.dumps({"losses": losses, "allocated": torch.cuda.memory_allocated()}), flush=True)
