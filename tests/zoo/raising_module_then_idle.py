"""Under no_grad, a module call raises (and is caught); then the job idles, calling no
module: its lane must be free for other jobs meanwhile."""

import pathlib
import sys
import time

import torch


class Broken(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("bad batch")


with torch.no_grad():
    try:
        Broken()(torch.zeros(1))
    except RuntimeError:
        pass
pathlib.Path(sys.argv[1]).touch()
deadline = time.time() + 60
while not pathlib.Path(sys.argv[2]).exists() and time.time() < deadline:
    time.sleep(0.05)
print("idle job done")
