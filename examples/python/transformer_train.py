"""A small transformer trained for a few steps on virtual NeuronCores, with a profile of
one step.

    python examples/python/transformer_train.py [--steps 30] [--profile train_step.ntff]

The whole training step (forward, loss, gradients, the SGD update) is one function
compiled by neuron_virt.jit; the task is to predict the next token of sequences that
count upwards modulo the vocabulary, so the loss goes down within a few steps. Step
STEPS // 2 runs inside neuron_virt.profile: open the file with
`neuron-profile view -s train_step.ntff` (or in the dashboard) to see where its time went.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import neuron_virt

VOCAB, SEQ, DIM, HEADS, BATCH = 32, 16, 64, 4, 8


def init_params(key):
    keys = jax.random.split(key, 6)
    scale = 1.0 / np.sqrt(DIM)
    return {
        "embed": jax.random.normal(keys[0], (VOCAB, DIM)) * 0.1,
        "pos": jax.random.normal(keys[1], (SEQ, DIM)) * 0.1,
        "qkv": jax.random.normal(keys[2], (DIM, 3 * DIM)) * scale,
        "proj": jax.random.normal(keys[3], (DIM, DIM)) * scale,
        "ff1": jax.random.normal(keys[4], (DIM, 4 * DIM)) * scale,
        "ff2": jax.random.normal(keys[5], (4 * DIM, DIM)) * (scale / 2),
    }


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def logits_of(params, tokens):
    x = params["embed"][tokens] + params["pos"]
    q, k, v = jnp.split(layer_norm(x) @ params["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(t.shape[0], SEQ, HEADS, DIM // HEADS).transpose(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(DIM // HEADS)
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    attention = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1) @ v
    x = x + attention.transpose(0, 2, 1, 3).reshape(x.shape) @ params["proj"]
    x = x + jax.nn.gelu(layer_norm(x) @ params["ff1"], approximate=False) @ params["ff2"]
    return layer_norm(x) @ params["embed"].T


def loss_of(params, tokens, targets):
    logits = logits_of(params, tokens)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1).mean()


def train_step(params, tokens, targets, learning_rate):
    loss, grads = jax.value_and_grad(loss_of)(params, tokens, targets)
    params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return params, loss


def batch_of(rng):
    """Sequences counting upwards modulo VOCAB from random starts; targets are the next tokens."""
    starts = rng.integers(0, VOCAB, size=(BATCH, 1))
    sequence = (starts + np.arange(SEQ + 1)) % VOCAB
    return sequence[:, :-1].astype(np.int32), sequence[:, 1:].astype(np.int32)


def train(steps, profile_path=None, options=None):
    """Trains for `steps` steps; returns the losses (and profiles step steps // 2)."""
    step = neuron_virt.jit(train_step, **(options or {}))
    params = jax.tree_util.tree_map(np.asarray, init_params(jax.random.PRNGKey(0)))
    rng = np.random.default_rng(0)
    losses = []
    for number in range(steps):
        tokens, targets = batch_of(rng)
        if profile_path and number == steps // 2:
            with neuron_virt.profile(profile_path) as recorded:
                params, loss = step(params, tokens, targets, 0.5)
            print(f"step {number} profiled into {profile_path}: {recorded.summary}")
        else:
            params, loss = step(params, tokens, targets, 0.5)
        losses.append(float(loss))
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", default="train_step.ntff")
    args = parser.parse_args()
    losses = train(args.steps, args.profile)
    for number in range(0, len(losses), max(1, len(losses) // 10)):
        print(f"step {number:3d}  loss {losses[number]:.4f}")
    print(f"step {len(losses) - 1:3d}  loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
