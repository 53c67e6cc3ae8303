"""A JAX MLP run on virtual NeuronCores with neuron_virt.jit, checked against jax.jit.

    python examples/python/mlp_inference.py [--batch 64] [--calls 200]

The first call lowers, compiles and loads the function; the others only execute.
With the default options (matrix products in bf16 with f32 accumulation, as neuron-cc
compiles for trn1) the outputs match JAX given the same bf16 rounding; with
auto_cast="none" they match jax.jit's f32 results.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import neuron_virt

SIZES = [512, 1024, 1024, 10]


def init_params(key, sizes=SIZES):
    """Weights and biases of a dense layer per pair of sizes."""
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out), jnp.float32) / np.sqrt(fan_in),
                       "b": jnp.zeros((fan_out,), jnp.float32)})
    return params


def mlp(params, x):
    """ReLU layers, then logits."""
    for layer in params[:-1]:
        x = jnp.maximum(x @ layer["w"] + layer["b"], 0.0)
    return x @ params[-1]["w"] + params[-1]["b"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    params = init_params(jax.random.PRNGKey(0))
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (args.batch, SIZES[0]), jnp.float32))
    forward = neuron_virt.jit(mlp)
    exact = neuron_virt.jit(mlp, auto_cast="none")

    started = time.perf_counter()
    logits = forward(params, x)
    print(f"first call (lower, compile, load, run): {time.perf_counter() - started:.3f} s")
    times = []
    for _ in range(args.calls):
        started = time.perf_counter()
        logits = forward(params, x)
        times.append(time.perf_counter() - started)
    print(f"{args.calls} calls: median {np.median(times) * 1e3:.3f} ms, p99 {np.percentile(times, 99) * 1e3:.3f} ms")

    reference = np.asarray(jax.jit(mlp)(params, x))
    print(f"bf16 matrix products: max |ours - jax f32| = {np.abs(logits - reference).max():.4f}")
    print(f"auto_cast='none':     max |ours - jax f32| = {np.abs(exact(params, x) - reference).max():.2e}")
    print(f"predicted classes of the first 8 rows: {logits.argmax(axis=1)[:8].tolist()}")


if __name__ == "__main__":
    main()
