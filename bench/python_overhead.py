#!/usr/bin/env python3
"""What a Python call costs on top of the runtime, and against JAX's own dispatch.

    pip install ./python "jax[cpu]"      # a release build of the package
    python3 bench/python_overhead.py [--calls 20000] [--rounds 5]

For one tiny function (negate f32[1]) it measures, in alternating rounds of the same
run, the median time of:
- the same model executed straight through the Rust API, without Python
  (`Model.time_executions`, on tensors bound once): the baseline;
- `model(x)`, the low-level call on a NumPy array;
- a cached `neuron_virt.jit` function called on a NumPy array;
- `jax.jit` of the same function on CPU, on a NumPy array.
and prints the medians over the rounds, what each Python path adds to the Rust API,
and the jit call against jax.jit.
"""

import argparse
import statistics
import time

import numpy as np


def median_call(fn, calls):
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import jax
    import neuron_virt

    negate = lambda x: -x
    x = np.ones(1, np.float32)
    ours = neuron_virt.jit(negate)
    ours(x)
    theirs = jax.jit(negate)
    theirs(x)
    model = neuron_virt.runtime().load(neuron_virt.compile(ours.lower(x), name="negate"))
    model(x)

    rounds = {"rust": [], "model": [], "jit": [], "jax": []}
    for _ in range(args.rounds):
        rounds["rust"].append(statistics.median(model._native.time_executions(args.calls)))
        rounds["model"].append(median_call(lambda: model(x), args.calls))
        rounds["jit"].append(median_call(lambda: ours(x), args.calls))
        rounds["jax"].append(median_call(lambda: theirs(x), args.calls))
    med = {name: statistics.median(values) * 1e6 for name, values in rounds.items()}
    print(f"one call of negate f32[1], medians over {args.rounds} rounds of {args.calls} calls")
    print(f"  Rust API (no Python)       {med['rust']:7.2f} us")
    print(f"  model(x)                   {med['model']:7.2f} us   (+{med['model'] - med['rust']:.2f} us)")
    print(f"  neuron_virt.jit(f)(x)      {med['jit']:7.2f} us   (+{med['jit'] - med['rust']:.2f} us)")
    print(f"  jax.jit(f)(x) on CPU       {med['jax']:7.2f} us   (jit / jax.jit = {med['jit'] / med['jax']:.3f})")


if __name__ == "__main__":
    main()
