"""One rank of a data-parallel training job under torchrun: each rank trains on its share
of every batch, ``xm.optimizer_step`` all-reduces the gradients (torch-xla's ``xla``
process group over the Neuron plugin), and the parameters must equal full-batch eager
training on the CPU. Exits 1 when they do not."""

import sys

import torch
import torch.nn as nn
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
import torch_xla.distributed.xla_backend  # the "xla" process group

dist.init_process_group("xla", init_method="xla://")
device = torch_xla.device()
rank, world = xr.global_ordinal(), xr.world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
reference = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
reference.load_state_dict(model.state_dict())
data, targets = torch.randn(6, 16, 8), torch.randn(6, 16, 1)
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(6):
    x, y = data[step], targets[step]
    share = slice(rank * 16 // world, (rank + 1) * 16 // world)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x[share].to(device)), y[share].to(device))
    loss.backward()
    xm.optimizer_step(opt)   # all-reduce of the gradients (mean over the ranks)
    xm.mark_step()
    ref_opt.zero_grad()
    nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()
pairs = zip(model.state_dict().values(), reference.state_dict().values())
worst = max(((a.cpu() - b).abs().max() / b.abs().max()).item() for a, b in pairs)
print(f"rank {rank} of {world}: worst relative difference {worst:.2e}", flush=True)
sys.exit(0 if worst <= 1e-4 else 1)
