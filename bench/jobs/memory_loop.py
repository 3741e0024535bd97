"""A seeded training loop whose losses are its result (one JSON line at the end).
``--grow-mb N``: on its first run only (SLURM_RESTART_COUNT unset or 0) it overshoots at
step ``--grow-at``: ``--how allocate`` holds N MiB more for real, ``--how raise`` raises
the error CUDA's allocator raises for an ask of N MiB. ``--leave FILE``: once its steps are
done, it ends only once FILE exists (a test decides when its room is free). ``--no-torch``:
a linear model fitted in plain Python, its iterations marked with gq.steps, for jobs whose
memory is the subject, not how gq finds a PyTorch script's iterations (importing torch
costs a job about 2 s of CPU)."""

import argparse
import json
import os
import random
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--pause", type=float, default=0.02)
parser.add_argument("--grow-mb", type=int, default=0)
parser.add_argument("--grow-at", type=int, default=3)
parser.add_argument("--how", choices=("allocate", "raise"), default="allocate")
parser.add_argument("--leave")
parser.add_argument("--no-torch", action="store_true")
args = parser.parse_args()
if args.no_torch and args.how == "raise":
    parser.error("--how raise raises torch's error: it needs torch")


def torch_loop():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(64, 32)
    target = data.sum(dim=1, keepdim=True)

    def step() -> float:
        optimizer.zero_grad()
        loss = ((model(data) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.item()

    return range(args.steps), step, torch.OutOfMemoryError


def plain_loop():
    import gq

    rng = random.Random(0)
    data = [[rng.gauss(0.0, 1.0) for _ in range(8)] for _ in range(16)]
    weights = [0.0] * 8

    def step() -> float:
        grads, total = [0.0] * 8, 0.0
        for row in data:
            error = sum(w * x for w, x in zip(weights, row)) - sum(row)
            total += error * error
            for i, x in enumerate(row):
                grads[i] += 2 * error * x / len(data)
        for i, grad in enumerate(grads):
            weights[i] -= 0.05 * grad
        return total / len(data)

    return gq.steps(range(args.steps)), step, None


steps, train_step, out_of_memory = plain_loop() if args.no_torch else torch_loop()
first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
kept, losses = [], []
for step in steps:
    losses.append(round(train_step(), 6))
    if step == args.grow_at and args.grow_mb and first_run:
        if args.how == "raise":
            raise out_of_memory(f"CUDA out of memory. Tried to allocate {args.grow_mb}.00 MiB.")
        kept.append(bytearray(args.grow_mb << 20))
        kept[-1][::4096] = b"x" * len(kept[-1][::4096])
    time.sleep(args.pause)
while args.leave and not os.path.exists(args.leave):
    time.sleep(0.05)
print(json.dumps(losses), flush=True)
