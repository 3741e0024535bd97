"""Weights updated by hand, no optimizer (as pytorch/examples' word_language_model): 40
training batches through a loss module, then 10 evaluation batches: 40 training steps.
Arguments: seconds of host-side work after each update; a start file its loop waits for
once the model is built (its pid noted in START.waiting, as examples/kernel_train.py does)."""

import os
import sys
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
criterion = torch.nn.CrossEntropyLoss()
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
if len(sys.argv) > 2:
    with open(f"{sys.argv[2]}.waiting", "a") as waiting:
        waiting.write(f"{os.getpid()}\n")
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
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
