"""A small, unmodified PyTorch training loop: gq finds its iterations by itself.

Run it by hand (python examples/train.py --steps 50) or queue it
(gq submit --steps 200 examples/train.py --steps 200).
"""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--width", type=int, default=512)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
device = torch.device(os.environ.get("GQ_DEVICE", "cpu"))
model = nn.Sequential(
    nn.Linear(32, args.width), nn.ReLU(),
    nn.Linear(args.width, args.width), nn.ReLU(),
    nn.Linear(args.width, 1),
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
inputs = torch.randn(32, 32, device=device)
targets = inputs.sum(dim=1, keepdim=True)

for step in range(args.steps):
    loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0 or step == args.steps - 1:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
