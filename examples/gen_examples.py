#!/usr/bin/env python3
"""Export the example models that `neuron-bench demo` runs, as HLO text.

Writes ``examples/mlp.hlo`` (a two-layer MLP with ReLU, batch 64, 512 -> 1024 -> 512)
and ``examples/attention.hlo`` (a causal multi-head self-attention block, 128 tokens,
width 256, 4 heads), exactly as ``jax.jit(f).lower(*args).as_text(dialect="hlo")``
prints them. Weights are parameters, so the demo feeds them like any other input.

How to run (from the repository root):

    pip install "jax[cpu]==0.10.2"
    python3 examples/gen_examples.py
"""

import os

os.environ["JAX_PLATFORMS"] = "cpu"

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

OUT_DIR = Path(__file__).resolve().parent


def mlp(x, w1, b1, w2, b2):
    h = jax.nn.relu(x @ w1 + b1)
    return h @ w2 + b2


def attention(x, wq, wk, wv, wo, heads=4):
    tokens, width = x.shape
    head_dim = width // heads

    def split(t):
        return t.reshape(tokens, heads, head_dim).transpose(1, 0, 2)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    scores = jnp.einsum("htd,hsd->hts", q, k) / np.float32(np.sqrt(head_dim))
    causal = jnp.tril(jnp.ones((tokens, tokens), dtype=bool))
    scores = jnp.where(causal[None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("hts,hsd->htd", probs, v).transpose(1, 0, 2).reshape(tokens, width)
    return out @ wo


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def main():
    models = {
        "mlp": (mlp, [f32(64, 512), f32(512, 1024), f32(1024), f32(1024, 512), f32(512)]),
        "attention": (attention, [f32(128, 256)] + [f32(256, 256)] * 4),
    }
    for name, (fn, args) in models.items():
        text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
        (OUT_DIR / f"{name}.hlo").write_text(text)
        print(f"wrote examples/{name}.hlo ({len(text.splitlines())} lines)")


if __name__ == "__main__":
    main()
