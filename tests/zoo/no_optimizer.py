"""Forward passes with grad enabled and no optimizer at all (feature extraction, say)."""

import torch

model = torch.nn.Linear(8, 8)
total = sum(model(torch.randn(2, 8)).sum().item() for _ in range(50))
print("no optimizer done")
