"""``torch_neuronx.trace``: a PyTorch function compiled for a NeuronCore, as a
``torch.jit.ScriptModule`` that ``torch.jit.save`` and ``torch.jit.load`` round-trip."""

import os
import shlex

import torch

from . import _ops  # noqa: F401  (registers torch.ops.neuron.forward_v2)
from ._capture import Capture

_FLAGS = {"--auto-cast": "auto_cast", "--auto-cast-type": "auto_cast_type", "--optlevel": "optlevel", "--target": "target"}


def compile_options(compiler_args):
    """The ``neuronx-cc`` flags of `compiler_args` (a string or a list) as the compiler's
    options; flags about the real compiler's internals are ignored."""
    words = shlex.split(compiler_args) if isinstance(compiler_args, str) else list(compiler_args or [])
    options, k = {}, 0
    while k < len(words):
        flag, _, value = words[k].partition("=")
        if flag in ("-O1", "-O2", "-O3"):
            options["optlevel"] = int(flag[2])
        elif flag in _FLAGS:
            if not value:
                k += 1
                if k == len(words):
                    raise ValueError(f"compiler_args: {flag} needs a value")
                value = words[k]
            options[_FLAGS[flag]] = int(value) if flag == "--optlevel" else value
        elif flag == "--enable-mixed-precision-accumulation":
            options["mixed_precision_accumulation"] = True
        elif flag == "--enable-saturate-infinity":
            options["saturate_infinity"] = True
        k += 1
    return options


class _Traced(torch.nn.Module):
    """What the trace records: the graph's parameters in order, then the NEFF call."""

    def __init__(self, neff, order, weights, single):
        super().__init__()
        self.register_buffer("neff", torch.frombuffer(bytearray(neff), dtype=torch.uint8))
        self.order = order
        self.single = single
        for k, weight in enumerate(weights):
            self.register_buffer(f"weight_{k}", weight)

    def forward(self, *inputs):
        parameters = [inputs[k] if kind == "input" else getattr(self, f"weight_{k}") for kind, k in self.order]
        outputs = torch.ops.neuron.forward_v2(parameters, self.neff)
        return outputs[0] if self.single else tuple(outputs)


def trace(func, example_inputs, *_, input_output_aliases={}, compiler_workdir=None, compiler_args=None,
          partitioner_config=None, inline_weights_to_neff=True, cpu_backend=False):
    """Compiles `func` (a module or function of tensors) for a NeuronCore.

    The graph of one call on `example_inputs` is captured with torch-xla and compiled
    with the virtual ``neuronx-cc`` (`compiler_args` are its flags, e.g.
    ``"--auto-cast none"``). `compiler_workdir`, if given, receives the graph
    (``model.hlo_module.pb`` and ``model.hlo``), ``graph.neff`` and ``command.txt``.
    The result is a ``torch.jit.ScriptModule`` that runs the NEFF when called; the
    module's weights ride with it (``inline_weights_to_neff`` makes no difference here).
    """
    import neuron_virt

    if partitioner_config is not None or cpu_backend:
        raise NotImplementedError("trace: partitioner_config and cpu_backend are not supported here")
    if input_output_aliases:
        raise NotImplementedError("trace: input_output_aliases are not supported here")
    capture = Capture(func, example_inputs)
    options = compile_options(compiler_args)
    name = getattr(func, "__name__", None) or type(func).__name__
    try:
        neff = neuron_virt.compile(capture.hlo_text, name=name, **options)
    except neuron_virt.CompileError as error:
        raise _with_origin(error, capture) from None
    if compiler_workdir:
        _write_workdir(compiler_workdir, capture, neff, compiler_args)
    # What the NEFF takes, in its order: which parameter each input is, and its shape
    # (a scalar weight may come back from the device as a 1-element array).
    numbers = capture.parameter_numbers()
    order, weights = [], list(capture.weights)
    for name, hlo_name, _, shape in neff.inputs:
        number = numbers.get(hlo_name.lstrip("%"))
        if number is None:
            raise RuntimeError(f"trace: the compiled graph's input {name} ({hlo_name}) is no parameter of the graph")
        kind, k = capture.order[number]
        if kind == "weight":
            weights[k] = weights[k].reshape(shape)
        order.append((kind, k))
    module = _Traced(neff.to_bytes(), order, weights, capture.single)
    return torch.jit.trace(module, capture.inputs, check_trace=False)


def _with_origin(error, capture):
    """The compiler's error with the PyTorch operator and source line it came from."""
    import re

    found = re.search(r"instruction `%?([^`]+)`", str(error))
    operator, where = capture.operator_of(found.group(1)) if found else (None, None)
    origin = f" ({operator} at {where})" if operator and where else (f" ({operator})" if operator else "")
    return type(error)(f"the graph does not compile{origin}: {error}")


def _write_workdir(workdir, capture, neff, compiler_args):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "model.hlo_module.pb"), "wb") as f:
        f.write(capture.hlo_proto)
    with open(os.path.join(workdir, "model.hlo"), "w") as f:
        f.write(capture.hlo_text)
    neff.save(os.path.join(workdir, "graph.neff"))
    args = compiler_args if isinstance(compiler_args, str) else " ".join(compiler_args or [])
    with open(os.path.join(workdir, "command.txt"), "w") as f:
        f.write(f"neuron-cc compile model.hlo --framework XLA {args} --output graph.neff\n".replace("  ", " "))
