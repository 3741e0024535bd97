"""LBFGS with a closure: the optimizer calls the model several times per step."""

import torch

torch.manual_seed(0)
x, y = torch.randn(64, 4), torch.randn(64, 1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.LBFGS(model.parameters(), max_iter=5)


def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for _ in range(12):
    loss = optimizer.step(closure)
print(f"lbfgs done {loss.item():.4f}")
