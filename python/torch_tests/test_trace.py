"""``torch_neuronx.trace`` → ``torch.jit.save`` → ``torch.jit.load`` (in a fresh process,
after ``import torch_neuronx``) → call equals eager inference; ``analyze`` reports the
operators."""

import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch_neuronx

from models import TinyTransformer, batches, relative_difference


def test_a_traced_model_saves_loads_and_runs_as_eager(tmp_path):
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    tokens, _ = batches(1)[0]
    work = tmp_path / "work"
    traced = torch_neuronx.trace(model, tokens, compiler_workdir=str(work), compiler_args="--auto-cast none")
    assert isinstance(traced, torch.jit.ScriptModule)
    assert sorted(os.listdir(work)) == ["command.txt", "graph.neff", "model.hlo", "model.hlo_module.pb"]
    assert (work / "command.txt").read_text().startswith("neuron-cc compile model.hlo --framework XLA --auto-cast none")
    with torch.no_grad():
        expected = model(tokens)
    assert relative_difference(expected, traced(tokens)) <= 1e-5
    path = tmp_path / "model.pt"
    torch.jit.save(traced, str(path))
    torch.save({"tokens": tokens, "expected": expected}, str(tmp_path / "io.pt"))
    check = (
        "import sys, torch, torch_neuronx\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"loaded = torch.jit.load({str(path)!r})\n"
        "got = loaded(io['tokens'])\n"
        "difference = ((got - io['expected']).abs().max() / io['expected'].abs().max()).item()\n"
        "print(difference)\n"
        "sys.exit(0 if difference <= 1e-5 else 1)\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_function_of_several_inputs_and_outputs_traces():
    def f(x, y):
        return x @ y, (x.sum(0) - y.sum(1)).relu()

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    traced = torch_neuronx.trace(f, (x, y), compiler_args=["--auto-cast", "none"])
    for got, want in zip(traced(x, y), f(x, y)):
        assert relative_difference(want, got) <= 1e-5
    # Other inputs of the same shapes, through the same compiled graph.
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    for got, want in zip(traced(a, b), f(a, b)):
        assert relative_difference(want, got) <= 1e-5


def test_analyze_lists_the_operators_and_their_support():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    report = torch_neuronx.analyze(model, torch.randn(2, 8))
    assert report["support_percentage"] == "100.00%", report
    assert {"aten::addmm", "aten::gelu"} <= set(report["supported_operators"]), report
    assert report["unsupported_operators"] == []
