"""``torch.ops.neuron.forward_v2``: a compiled graph (a NEFF, carried as a uint8 tensor)
run on a NeuronCore. Traced modules call it; ``import torch_neuronx`` registers it, so a
module saved with ``torch.jit.save`` runs again after ``torch.jit.load``."""

import hashlib
import threading
import weakref

import numpy as np
import torch
from neuron_virt._dtypes import numpy_dtype

FORWARD_OP = "neuron::forward_v2"

_models = {}
# The model of each NEFF tensor seen, by the tensor's identity, so that a call does not
# copy and hash the NEFF again (a traced module's NEFF buffer is never written). An entry
# holds its tensor weakly and is checked against it (ids are reused once it is gone).
_by_tensor = {}
_lock = threading.Lock()


def _model(neff):
    """The model of these NEFF bytes, loaded once per process on the runtime the PJRT
    plugin shares (so torch-xla and traced modules hold the NeuronCores once)."""
    import neuron_virt
    from neuron_virt import _native

    with _lock:
        seen = _by_tensor.get(id(neff))
        if seen is not None and seen[0]() is neff:
            return seen[1]
        data = neff.contiguous().numpy().tobytes()
        key = hashlib.sha256(data).hexdigest()
        model = _models.get(key)
        if model is None:
            runtime = _native.framework_runtime()
            model = runtime.load(neuron_virt.Neff.from_bytes(data))
            _models[key] = model
        _by_tensor[id(neff)] = (weakref.ref(neff, lambda _, k=id(neff): _by_tensor.pop(k, None)), model)
        return model


@torch.library.custom_op(FORWARD_OP, mutates_args=())
def forward_v2(inputs: list[torch.Tensor], neff: torch.Tensor) -> list[torch.Tensor]:
    """Runs the NEFF on `inputs` (in its parameters' order) and returns its outputs."""
    model = _model(neff)
    arrays = [t.detach().cpu().contiguous().numpy() for t in inputs]
    expected = model.inputs
    if len(arrays) != len(expected):
        raise ValueError(f"the compiled graph takes {len(expected)} inputs; {len(arrays)} were given")
    for k, (array, (name, _, dtype, shape)) in enumerate(zip(arrays, expected)):
        if list(array.shape) != list(shape):
            raise ValueError(f"input {k} ({name}) has shape {list(array.shape)}; the compiled graph takes {list(shape)}")
    outputs = [np.empty(shape, dtype=numpy_dtype(dtype)) for (_, _, dtype, shape) in model.outputs]
    model.execute(arrays, outputs)
    return [torch.from_numpy(o) for o in outputs]


@forward_v2.register_fake
def _(inputs, neff):
    raise NotImplementedError("torch.ops.neuron.forward_v2 runs only on real tensors")
