"""A new user's training loop: a tiny forward, backward and optimizer step (the iteration,
which holds the lane under gq), then --host-ms of busy host-side work (the gap: loading the
next batch, logging).

Run bare (python train_loop.py ...) or under gq alike. Writes one JSON line: the loop's wall
time, on the system-wide monotonic clock.
"""

import argparse
import json
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--host-ms", type=float, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(8, 16)
host_work = args.host_ms / 1000
start = time.monotonic()
for _ in range(args.steps):
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()
    begin = time.monotonic()
    while time.monotonic() - begin < host_work:
        pass
loop = time.monotonic() - start
with open(args.out, "a") as out:
    out.write(json.dumps({"job": os.environ.get("GQ_JOB_ID"), "loop_seconds": loop}) + "\n")
