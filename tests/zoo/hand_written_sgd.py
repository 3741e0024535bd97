"""Weights updated by hand, no optimizer (as pytorch/examples' word_language_model): 40
training batches through a loss module, then 10 evaluation batches: 40 training steps.
An argument: seconds of host-side work after each update."""

import sys
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
criterion = torch.nn.CrossEntropyLoss()
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
for batch in range(40):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    model.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
    time.sleep(pause)
with torch.no_grad():
    for batch in range(10):
        criterion(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
print(f"hand-written sgd done {loss.item():.4f}")
