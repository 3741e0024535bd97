"""Four threads, each calling a Linear layer 300 times under no_grad (an inference server)."""

import threading

import torch

model = torch.nn.Linear(32, 32)


def serve():
    with torch.no_grad():
        for _ in range(300):
            model(torch.randn(4, 32))


threads = [threading.Thread(target=serve) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("threads done")
