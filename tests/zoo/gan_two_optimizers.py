"""A GAN's loop as pytorch/examples' dcgan has it: per iteration the discriminator's
backward twice and its step, then the generator's forward through the discriminator, its
backward and step. 25 iterations."""

import torch

torch.manual_seed(0)
netG = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh())
netD = torch.nn.Sequential(torch.nn.Linear(16, 1), torch.nn.Sigmoid())
criterion = torch.nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
for i in range(25):
    real = torch.randn(8, 16)
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(8, 1))
    errD_real.backward()
    fake = netG(torch.randn(8, 4))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(8, 1))
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(8, 1))
    errG.backward()
    optimizerG.step()
print(f"gan done {errG.item():.4f}")
