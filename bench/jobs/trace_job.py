"""One trace job made real: an unmodified PyTorch loop of --steps iterations whose forward
pass sleeps --iter-ms (standing in for device time, so a busy CPU does not stretch it).
Prints one JSON line with its startup: seconds from process start to the first iteration."""

import argparse
import json
import time

import psutil
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--iter-ms", type=float, required=True)
args = parser.parse_args()


class Kernel(nn.Module):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.layer = nn.Linear(32, 32)

    def forward(self, x):
        time.sleep(self.seconds)
        return self.layer(x)


torch.set_num_threads(1)
model = nn.Sequential(Kernel(args.iter_ms / 1000), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 32), torch.randn(32, 1)
startup = time.time() - psutil.Process().create_time()
for _ in range(args.steps):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(json.dumps({"startup": startup}), flush=True)
