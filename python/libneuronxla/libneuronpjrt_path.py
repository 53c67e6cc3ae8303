"""Where the Neuron PJRT plugin is: ``NEURON_LIBRARY_PATH`` if set, else the extension
module of the ``neuron_virt`` package, which exports ``GetPjrtApi`` (one library, so
that torch-xla and ``neuron_virt`` share one runtime in a process)."""

import glob
import importlib.util
import os


def libneuronpjrt_path():
    """The path of the PJRT plugin library torch-xla should open."""
    path = os.environ.get("NEURON_LIBRARY_PATH")
    if path:
        return path
    spec = importlib.util.find_spec("neuron_virt")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("libneuronxla: the neuron_virt package is not installed; pip install neuron-virt")
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "_native*.so")))
        if found:
            return found[0]
    raise ImportError("libneuronxla: neuron_virt has no extension module (_native*.so); reinstall neuron-virt")
