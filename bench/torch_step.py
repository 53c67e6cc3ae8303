"""Time per training step through torch-xla on the Neuron plugin, against torch-xla's own
CPU device (XLA:CPU, ``PJRT_DEVICE=CPU``) and eager CPU PyTorch, in one run.

    python bench/torch_step.py                 # the tests' transformer and a larger one
    python bench/torch_step.py --steps 50

Each device runs in its own process (torch-xla takes one PJRT device per process):
warm-up steps first (the graphs compile), then the median of the timed steps, each
ending with ``xm.mark_step()`` and waiting for the device. Needs the neuron-virt wheel
with the ``torch`` extra in the running Python; use a release build of the wheel
(``pip install ./python[torch]``) for figures worth recording.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

SIZES = {
    # The tests' model (python/torch_tests/models.py).
    "test": dict(vocab=32, dim=16, heads=2, seq=8, batch=4),
    "larger": dict(vocab=512, dim=128, heads=4, seq=64, batch=8),
}


def child(mode, size, steps, warmup):
    if mode != "eager":
        os.environ["PJRT_DEVICE"] = mode
    import torch
    import torch.nn as nn

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "torch_tests"))
    from models import TinyTransformer

    shape = SIZES[size]
    if mode == "eager":
        device, sync = torch.device("cpu"), (lambda: None)
    else:
        import torch_xla
        import torch_xla.core.xla_model as xm

        device = torch_xla.device()

        def sync():
            xm.mark_step()
            xm.wait_device_ops()

    torch.manual_seed(0)
    model = TinyTransformer(shape["vocab"], shape["dim"], shape["heads"], shape["seq"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"])).to(device)
    targets = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"])).to(device)
    times = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    print(json.dumps({"median_ms": 1e3 * statistics.median(times)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per device (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="steps before timing (default 5)")
    parser.add_argument("--size", choices=[*SIZES, "all"], default="all")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.warmup)
        return
    env = dict(os.environ, NEURON_CC_FLAGS=os.environ.get("NEURON_CC_FLAGS", "--auto-cast none --no-cache"))
    print(f"{'model':8} {'NEURON ms':>10} {'XLA:CPU ms':>11} {'eager ms':>9} {'NEURON/XLA:CPU':>15}")
    for size in SIZES if args.size == "all" else [args.size]:
        figures = {}
        for mode in ("NEURON", "CPU", "eager"):
            command = [sys.executable, __file__, "--child", mode, size, "--steps", str(args.steps), "--warmup", str(args.warmup)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                sys.exit(f"{mode} on {size} failed:\n{done.stderr[-3000:]}")
            figures[mode] = json.loads(done.stdout.strip().splitlines()[-1])["median_ms"]
        ratio = figures["NEURON"] / figures["CPU"]
        print(f"{size:8} {figures['NEURON']:10.2f} {figures['CPU']:11.2f} {figures['eager']:9.2f} {ratio:15.2f}")


if __name__ == "__main__":
    main()
