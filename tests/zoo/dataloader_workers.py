"""A DataLoader with two worker processes, started by fork or spawn (argv[1]), kept across
its two epochs (each worker started anew imports torch: about 2 s of CPU)."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.tensor([float(index)]), torch.tensor([float(index * index)])


if __name__ == "__main__":
    loader = DataLoader(
        Squares(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context=sys.argv[1],
        persistent_workers=True,
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    print(f"dataloader {sys.argv[1]} done")
