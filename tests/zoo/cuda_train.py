"""A small training loop on the device gq gives the job (GQ_DEVICE). It holds --mb MiB of
weights, runs --steps iterations, and prints one JSON line: what CUDA showed it, and the
memory it had reserved while parked (after its last release) and at the end."""

import argparse
import json
import os
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--mb", type=int, default=256)
parser.add_argument("--start-file")
args = parser.parse_args()

device = torch.device(os.environ.get("GQ_DEVICE", "cuda:0"))
width = 1024
layers = max(1, args.mb * (1 << 20) // (width * width * 4))
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(64, width, device=device)
while args.start_file and not os.path.exists(args.start_file):
    time.sleep(0.02)
for _ in range(args.steps):
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()
torch.cuda.synchronize()
print(json.dumps({
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
    "name": torch.cuda.get_device_name(0), "allocated": torch.cuda.memory_allocated(),
    "reserved": torch.cuda.memory_reserved()}), flush=True)
