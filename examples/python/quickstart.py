"""The README's quick start: a JAX function on virtual NeuronCores, watched live, then profiled.

    python examples/python/quickstart.py [--seconds 30] [--profile quickstart.ntff]

It runs a small transformer-style block (a projection, GELU, a second projection and a
softmax) on two virtual NeuronCores for ``--seconds``, printing its rate once a
second; while it runs, ``neuron-top``, ``neuron-monitor`` and the dashboard show it as
``quickstart.py``. Then it records ten calls into ``--profile``, which
``neuron-profile view -s quickstart.ntff`` and the dashboard open.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import neuron_virt


def block(params, x):
    """Projection, GELU, projection, softmax over the last axis."""
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return jax.nn.softmax(h @ params["w2"] + params["b2"], axis=-1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run before profiling")
    parser.add_argument("--profile", default="quickstart.ntff", help="the NTFF file to write")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(keys[0], (256, 1024), jnp.float32) / 16.0,
        "b1": jnp.zeros((1024,), jnp.float32),
        "w2": jax.random.normal(keys[1], (1024, 256), jnp.float32) / 32.0,
        "b2": jnp.zeros((256,), jnp.float32),
    }
    x = np.asarray(jax.random.normal(keys[2], (args.batch, 256), jnp.float32))
    # A copy of the compiled function on each of two cores; calls alternate between them.
    forward = neuron_virt.jit(block, cores=[0, 1])

    out = forward(params, x)
    reference = np.asarray(jax.jit(block)(params, x))
    print(f"compiled and loaded; max |ours - jax| = {np.abs(out - reference).max():.2e} (bf16 matrix products)")

    started = last = time.perf_counter()
    calls = 0
    while time.perf_counter() - started < args.seconds:
        forward(params, x)
        calls += 1
        now = time.perf_counter()
        if now - last >= 1.0:
            print(f"{calls / (now - last):8.1f} calls/s", flush=True)
            calls, last = 0, now

    with neuron_virt.profile(args.profile):
        for _ in range(10):
            forward(params, x)
    print(f"profiled 10 calls into {args.profile}; open it with: neuron-profile view -s {args.profile}")


if __name__ == "__main__":
    main()
