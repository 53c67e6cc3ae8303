"""``torch_neuronx.analyze``: which PyTorch operators of a function compile for a
NeuronCore."""

import re


def analyze(func, example_inputs, compiler_workdir=None, additional_ignored_ops=set(), max_workers=4, is_hf_transformers=False, cleanup=False):
    """Captures one call of `func` and compiles it; returns the report torch-neuronx
    gives: the supported operators with their counts, and the unsupported ones with
    where they are called."""
    import neuron_virt

    from . import __version__
    from ._capture import Capture

    capture = Capture(func, example_inputs)
    operators = {name: count for name, (count, _) in capture.operators().items() if name not in additional_ignored_ops}
    unsupported = []
    try:
        neuron_virt.compile(capture.hlo_text, name="analyze")
    except neuron_virt.CompileError as error:
        found = re.search(r"instruction `%?([^`]+)`", str(error))
        operator, where = capture.operator_of(found.group(1)) if found else (None, None)
        unsupported.append({"kind": operator or "unknown", "failureAt": "neuronx-cc", "call": where, "error": str(error)})
        operators.pop(operator, None)
    total = sum(operators.values()) + len(unsupported)
    return {
        "torch_neuronx_version": __version__,
        "neuronx_cc_version": neuron_virt.__version__,
        "support_percentage": f"{100.0 * sum(operators.values()) / total if total else 100.0:.2f}%",
        "supported_operators": operators,
        "unsupported_operators": unsupported,
    }
