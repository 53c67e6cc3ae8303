"""Where ``libneuronpjrt.so`` is: ``NEURON_LIBRARY_PATH`` if set, else the copy installed
beside this module."""

import os

_LIBRARY = "libneuronpjrt.so"


def libneuronpjrt_path():
    """The path of the PJRT plugin library torch-xla should open."""
    path = os.environ.get("NEURON_LIBRARY_PATH")
    if path:
        return path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY)
