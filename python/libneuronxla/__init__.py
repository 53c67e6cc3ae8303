"""The module torch-xla imports to find the Neuron PJRT plugin (``PJRT_DEVICE=NEURON``).

Here it points at ``libneuronpjrt.so``, the plugin of the Neuron virtual runtime, so that
a torch-xla script runs unchanged on virtual NeuronCores: ``xm.xla_device()`` is a
NeuronCore, its graphs compile with the virtual ``neuronx-cc`` and run through the
runtime, watched by ``neuron-top``, ``neuron-monitor`` and ``neuron-profile``.
"""

import os

from .libneuronpjrt_path import libneuronpjrt_path

__all__ = ["configure_environment", "libneuronpjrt_path"]


def configure_environment():
    """Sets what the plugin needs before torch-xla starts it, leaving what is set alone.

    ``XLA_IR_DEBUG`` and ``XLA_HLO_DEBUG`` make torch-xla record each operation's Python
    source file and line in the graphs, so that profiles can name them.
    """
    os.environ.setdefault("XLA_IR_DEBUG", "1")
    os.environ.setdefault("XLA_HLO_DEBUG", "1")
    os.environ.setdefault("NEURON_LIBRARY_PATH", libneuronpjrt_path())
