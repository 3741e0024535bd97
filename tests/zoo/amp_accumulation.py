"""Mixed precision with a GradScaler and gradient accumulation: 50 optimizer steps, with 20
evaluation forwards (no_grad) along the way, 4 of them before the first step."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
ACCUMULATE = 2


def evaluate():
    with torch.no_grad():
        model(torch.randn(8, 16))


for _ in range(4):
    evaluate()
for micro in range(100):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 16)).float().pow(2).mean() / ACCUMULATE
    scaler.scale(loss).backward()
    if (micro + 1) % ACCUMULATE == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    if micro % 6 == 5 and micro < 96:
        evaluate()
print("amp done")
