"""The compile cache: a second process running the same script compiles nothing and
says which cached NEFF it used; ``torch.compile(backend="openxla")`` goes through the
same plugin."""

import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch_xla

SCRIPT = """
import torch, torch.nn as nn, torch_xla, torch_xla.core.xla_model as xm
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(torch_xla.device())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 8, device=torch_xla.device())).square().mean().backward()
    optimizer.step()
    xm.mark_step()
print(model[0].weight.sum().item())
"""


def test_a_second_run_compiles_nothing_and_uses_the_cached_neffs(tmp_path):
    env = dict(os.environ)
    env.update(NEURON_CC_FLAGS=f"--auto-cast none --cache_dir={tmp_path / 'cache'}", NEURON_RT_LOG_LEVEL="INFO")

    def run():
        done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout, done.stderr

    first_out, first_log = run()
    compiled = first_log.count("compiled graph `")
    assert compiled >= 2 and "Using a cached neff" not in first_log, first_log
    second_out, second_log = run()
    assert second_out == first_out
    assert "compiled graph `" not in second_log, second_log
    assert second_log.count("Using a cached neff at ") == compiled, second_log


def test_torch_compile_with_the_openxla_backend_runs_on_the_plugin():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = [model(x), model(2 * x)]
        compiled = torch.compile(model.to(torch_xla.device()), backend="openxla")
        got = [compiled(x.to(torch_xla.device())).cpu(), compiled((2 * x).to(torch_xla.device())).cpu()]
    for want, have in zip(expected, got):
        assert ((want - have).abs().max() / want.abs().max()).item() <= 1e-5
