"""A PyTorch function's graph captured with torch-xla: its HLO (text and proto), which of
its parameters are the example inputs and which are weights, and its outputs' shape."""

import copy
import re

import torch


class Capture:
    """One forward pass of `func` on `example_inputs`, as one XLA graph."""

    def __init__(self, func, example_inputs):
        import torch_xla

        self.inputs = example_inputs if isinstance(example_inputs, tuple) else (
            tuple(example_inputs) if isinstance(example_inputs, list) else (example_inputs,))
        for k, t in enumerate(self.inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"example input {k} is a {type(t).__name__}; trace takes tensors")
        device = torch_xla.device()
        module = func
        if isinstance(func, torch.nn.Module):
            module = copy.deepcopy(func).to(device)
        xla_inputs = [t.to(device) for t in self.inputs]
        with torch.no_grad():
            outputs = module(*xla_inputs)
        if isinstance(outputs, torch.Tensor):
            self.single, flat = True, [outputs]
        elif isinstance(outputs, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outputs):
            self.single, flat = False, list(outputs)
        else:
            raise TypeError(f"the function returns a {type(outputs).__name__}; trace takes a tensor or a tuple of tensors")
        self.hlo_text = torch_xla._XLAC._get_xla_tensors_hlo(flat)
        self.hlo_proto = torch_xla._XLAC._get_xla_tensors_hlo_proto(flat)
        ids, values = torch_xla._XLAC._get_tensors_xla_device_data_node(flat)
        input_ids = [torch_xla._XLAC._xla_get_tensor_id(t) for t in xla_inputs]
        # For each HLO parameter, in order: ("input", k) or ("weight", k).
        self.order, self.weights = [], []
        for tensor_id, value in zip(ids, values):
            if tensor_id in input_ids:
                self.order.append(("input", input_ids.index(tensor_id)))
            else:
                self.order.append(("weight", len(self.weights)))
                self.weights.append(value.cpu())
        self.outputs = [o.cpu() for o in flat]

    def parameter_numbers(self):
        """The entry computation's parameters: instruction name -> parameter number."""
        entry = self.hlo_text[self.hlo_text.index("ENTRY"):]
        found = re.findall(r"%?([\w.\-]+) = [^=]*? parameter\((\d+)\)", entry)
        return {name: int(number) for name, number in found}

    def operators(self):
        """Each PyTorch operator of the graph (``aten::addmm``) with how many times it is
        called (its distinct ``op_name``s) and its first source location."""
        calls, first = {}, {}
        for line in self.hlo_text.splitlines():
            kind = re.search(r'op_type="(\w+)" op_name="([^"]*)"', line)
            if not kind or not kind.group(1).startswith("aten__"):
                continue
            name = "aten::" + kind.group(1)[len("aten__"):]
            calls.setdefault(name, set()).add(kind.group(2))
            where = re.search(r'source_file="([^"]*)" source_line=(\d+)', line)
            if where and name not in first:
                first[name] = f"{where.group(1)}:{where.group(2)}"
        return {name: (len(names), first.get(name)) for name, names in calls.items()}

    def operator_of(self, instruction):
        """The PyTorch operator and source location an HLO instruction came from."""
        for line in self.hlo_text.splitlines():
            if re.match(rf"\s*(ROOT )?%?{re.escape(instruction)} = ", line):
                kind = re.search(r'op_type="(\w+)"', line)
                where = re.search(r'source_file="([^"]*)" source_line=(\d+)', line)
                name = kind.group(1).replace("__", "::", 1) if kind else None
                return name, (f"{where.group(1)}:{where.group(2)}" if where else None)
        return None, None
