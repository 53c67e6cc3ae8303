"""torch-neuronx on the Neuron virtual runtime: PyTorch models on virtual NeuronCores.

    import torch, torch_neuronx

    traced = torch_neuronx.trace(model, example_inputs)    # a torch.jit.ScriptModule
    torch.jit.save(traced, "model.pt")
    loaded = torch.jit.load("model.pt")                      # after `import torch_neuronx`
    y = loaded(x)                                            # runs on a NeuronCore

Training and inference scripts written for torch-xla (``xm.xla_device()``,
``xm.mark_step()``, ``xm.optimizer_step``) run unchanged: torch-xla finds the Neuron
PJRT plugin through ``libneuronxla`` and every graph compiles with the virtual
``neuronx-cc`` (flags from ``NEURON_CC_FLAGS``, e.g. ``--auto-cast none``).

This module does not import torch-xla until it is used: torch-xla imports
``torch_neuronx.xla`` while it starts.
"""

from . import experimental
from ._analyze import analyze
from ._ops import FORWARD_OP
from ._trace import trace

__version__ = "2.9.0+neuronvirt"

__all__ = ["FORWARD_OP", "analyze", "experimental", "trace"]
