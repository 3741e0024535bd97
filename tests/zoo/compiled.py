"""A compiled model (torch.compile, eager backend: no C compiler needed) trained 20 steps."""

import torch

torch.manual_seed(0)
model = torch.compile(torch.nn.Linear(8, 1), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(20):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
print("compiled done")
