#!/usr/bin/env python3
"""Generate the multi-device HLO fixtures: JAX programs written with ``jax.shard_map``
over a mesh of 4 devices (XLA's CPU backend, forced to 4 host devices).

For each case this writes ``tests/data/jax_multi/<case>/``:

  model.hlo        ``jax.jit(jax.shard_map(f, ...)).lower(...).as_text(dialect="hlo")``:
                   Shardy's ``xla.sdy`` custom calls around the per-device computation.
  input<i>.npy     the global arrays, in parameter order.
  output<i>.npy    XLA's results for one step, global.
  steps.npy        (training cases) the parameters after ``STEPS`` steps, each step's
                   output fed back as the next step's parameters.

Run with JAX 0.10 (``pip install "jax==0.10.*"``); rerunning rewrites the same files.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

OUT = pathlib.Path(__file__).resolve().parent / "jax_multi"
STEPS = 10


def data_parallel_step():
    """A linear model's SGD step: each device takes a quarter of the batch, and the
    gradients are averaged across devices with ``pmean``."""
    mesh = jax.make_mesh((4,), ("dp",))

    def step(w, x, y):
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.1 * jax.lax.pmean(grad, "dp")

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P()))
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 2)).astype(np.float32)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    args = (put(w, P()), put(x, P("dp")), put(y, P("dp")))
    hlo = f.lower(*args).as_text(dialect="hlo")
    out = np.asarray(f(*args))
    trained = args[0]
    for _ in range(STEPS):
        trained = f(trained, args[1], args[2])
    return hlo, [w, x, y], [out], np.asarray(trained)


def pmap_psum():
    """``jax.pmap``, which JAX 0.10 lowers through the same manual computation: each
    device takes one row, and the doubled rows are summed across devices."""
    f = jax.pmap(lambda x: jax.lax.psum(x * 2, "i"), axis_name="i")
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    return f.lower(x).as_text(dialect="hlo"), [x], [np.asarray(f(x))], None


CASES = {"data_parallel_step": data_parallel_step, "pmap_psum": pmap_psum}


def main():
    assert jax.__version__.startswith("0.10"), f"JAX 0.10 expected, found {jax.__version__}"
    for name, make in CASES.items():
        directory = OUT / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        hlo, inputs, outputs, steps = make()
        assert "xla.sdy.GlobalToLocalShape" in hlo, "JAX no longer emits Shardy's custom calls"
        (directory / "model.hlo").write_text(hlo)
        for i, a in enumerate(inputs):
            np.save(directory / f"input{i}.npy", a)
        for i, a in enumerate(outputs):
            np.save(directory / f"output{i}.npy", a)
        if steps is not None:
            np.save(directory / "steps.npy", steps)
        print(f"{name}: {len(inputs)} inputs, {len(outputs)} outputs")


if __name__ == "__main__":
    main()
