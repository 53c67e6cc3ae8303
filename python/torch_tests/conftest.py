"""torch-xla on the Neuron plugin, set up once per test process. torch-xla's device is
made first: PyTorch's autograd engine sizes its device queues at the first backward pass,
and a CPU backward before the XLA device exists leaves none for it."""

import pytest
import torch_xla


@pytest.fixture(scope="session", autouse=True)
def device():
    return torch_xla.device()
