"""An unmodified torch-xla training loop on a NeuronCore equals eager CPU training."""

import copy

import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm

from models import TinyTransformer, batches, relative_difference


def train(model, device, data):
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens, targets in data:
        tokens, targets = tokens.to(device), targets.to(device)
        optimizer.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if device.type == "xla":
            xm.mark_step()
        losses.append(loss.item())
    return losses, {name: value.detach().cpu() for name, value in model.state_dict().items()}


def test_a_transformer_trains_on_a_neuroncore_as_on_the_cpu():
    torch.manual_seed(0)
    model = TinyTransformer()
    data = batches(5)
    device = xm.xla_device()
    assert xm.xla_device_hw(device) == "NEURON"
    cpu_losses, cpu_state = train(copy.deepcopy(model), torch.device("cpu"), data)
    xla_losses, xla_state = train(copy.deepcopy(model), device, data)
    for step, (a, b) in enumerate(zip(cpu_losses, xla_losses)):
        assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: loss {b} on the NeuronCore, {a} on the CPU"
    for name in cpu_state:
        difference = relative_difference(cpu_state[name], xla_state[name])
        assert difference <= 1e-4, f"{name} differs by {difference:.2e} (relative)"


def test_a_graph_with_an_unsupported_operation_names_the_operator_and_the_source_line():
    device = torch_xla.device()
    spectrum = torch.fft.fft(torch.randn(4, 4).to(device))  # complex: not a NeuronCore type
    try:
        spectrum.abs().cpu()
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("a complex graph compiled")
    assert "aten::abs" in message and "test_training.py:" in message, message
    assert "complex element type (c64) is not supported" in message, message


def test_torch_neuronxs_profiler_records_the_graphs_into_a_profile(tmp_path):
    import json
    import os
    import subprocess

    import torch_neuronx

    device = torch_xla.device()
    model = nn.Linear(8, 4).to(device)
    output = tmp_path / "step.ntff"
    with torch_neuronx.experimental.profiler.profile(output=str(output)) as profile:
        for _ in range(3):
            model(torch.ones(2, 8, device=device)).sum().backward()
            xm.mark_step()
    assert profile.summary["device_events"] > 0 and profile.summary["lost_events"] == 0, profile.summary
    view = subprocess.run(
        [os.environ["NEURON_PROFILE"], "view", "-s", str(output), "--output-format", "summary-json"],
        capture_output=True, text=True, timeout=120,
    )
    assert view.returncode == 0, view.stderr
    summary = json.loads(view.stdout)
    assert summary["executions"]["count"] >= 3, summary["executions"]
    assert any(m["name"].startswith("SyncTensorsGraph.") for m in summary["models"]), summary["models"]


def test_a_convolutional_network_has_the_cpus_gradients():
    """Convolutions, batch norm, max pooling and a strided convolution, whose input
    gradient torch-xla writes as a convolution with negative padding."""
    torch.manual_seed(0)
    model = nn.Sequential(
        # No bias before batch norm, which removes it: its gradient is rounding noise.
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 4, 3, stride=2), nn.Flatten(), nn.Linear(36, 10),
    )
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    device = torch_xla.device()
    on_device = copy.deepcopy(model).to(device)
    x_device = x.detach().to(device).requires_grad_()
    model(x).square().mean().backward()
    on_device(x_device).square().mean().backward()
    assert relative_difference(x.grad, x_device.grad.cpu()) <= 1e-4
    for (name, a), b in zip(model.named_parameters(), on_device.parameters()):
        difference = relative_difference(a.grad, b.grad.cpu())
        assert difference <= 1e-4, f"{name}: gradient differs by {difference:.2e} (relative)"


def test_nearest_upsampling_and_its_gradient_match_the_cpu():
    """``F.interpolate(mode="nearest")`` by whole factors: torch-xla's ResizeNearest and
    ResizeNearestGrad custom calls."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    weights = torch.randn(2, 3, 8, 15)
    device = torch_xla.device()
    x_device = x.detach().to(device).requires_grad_()
    value = (nn.functional.interpolate(x, scale_factor=(2, 3), mode="nearest") * weights).sum()
    value.backward()
    on_device = (nn.functional.interpolate(x_device, scale_factor=(2, 3), mode="nearest") * weights.to(device)).sum()
    on_device.backward()
    assert abs(value.item() - on_device.item()) <= 1e-4 * abs(value.item())
    assert relative_difference(x.grad, x_device.grad.cpu()) <= 1e-5


def test_a_graph_recompiled_after_the_first_steps_is_a_finding_of_the_profile(tmp_path):
    import json
    import os
    import subprocess

    import torch_neuronx

    device = torch_xla.device()
    model = nn.Linear(8, 5).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    output = tmp_path / "steps.ntff"
    with torch_neuronx.experimental.profiler.profile(output=str(output)):
        for step in range(6):
            batch = 4 if step < 5 else 3  # a last, smaller batch: a new graph
            optimizer.zero_grad()
            # A batch from the host, as a data loader gives it: a graph parameter.
            model(torch.ones(batch, 8).to(device)).square().mean().backward()
            optimizer.step()
            xm.mark_step()
    view = subprocess.run(
        [os.environ["NEURON_PROFILE"], "view", "-s", str(output), "--output-format", "summary-json"],
        capture_output=True, text=True, timeout=120,
    )
    assert view.returncode == 0, view.stderr
    findings = [f for f in json.loads(view.stdout)["findings"] if f["kind"] == "recompilation"]
    assert any("input shapes differ" in f["text"] and "-> f32[3,8]" in f["text"] for f in findings), findings
    assert all("drop_last=True" in f["suggestion"] for f in findings), findings
