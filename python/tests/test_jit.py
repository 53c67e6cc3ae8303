"""neuron_virt.jit: JAX functions compiled once per signature, run on virtual cores,
with pytrees, scalars and several threads, matching jax.jit on CPU."""

import threading

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import neuron_virt  # noqa: E402


def test_an_mlp_matches_jax(rt):
    def mlp(x, w1, b1, w2, b2):
        return jnp.maximum(x @ w1 + b1, 0.0) @ w2 + b2

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 32), (32, 64), (64,), (64, 16), (16,)]]
    exact = neuron_virt.jit(mlp, auto_cast="none", mixed_precision_accumulation=True)
    np.testing.assert_allclose(exact(*args), jax.jit(mlp)(*args), rtol=1e-4, atol=1e-5)
    # The default options multiply bf16-rounded operands with f32 accumulation, as
    # neuron-cc does: that is what JAX computes with the operands cast to bf16.
    def mlp_bf16(x, w1, b1, w2, b2):
        def dot(a, b):
            return jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)

        return dot(jnp.maximum(dot(x, w1) + b1, 0.0), w2) + b2

    default = neuron_virt.jit(mlp)(*args)
    np.testing.assert_allclose(default, jax.jit(mlp_bf16)(*args), rtol=1e-3, atol=1e-3)
    assert isinstance(default, np.ndarray) and default.dtype == np.float32


def test_pytrees_scalars_and_kwargs_keep_their_structure(rt):
    @neuron_virt.jit(auto_cast="none")
    def step(params, batch, *, scale):
        y = batch["x"] @ params["w"] + params["b"]
        return {"y": y * scale, "stats": (y.sum(), y.max())}

    params = {"w": np.eye(3, dtype=np.float32), "b": np.ones(3, np.float32)}
    batch = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    out = step(params, batch, scale=2.0)
    expected = jax.jit(step.__wrapped__)(params, batch, scale=2.0)
    assert set(out) == {"y", "stats"} and isinstance(out["stats"], tuple)
    np.testing.assert_allclose(out["y"], expected["y"])
    np.testing.assert_allclose(out["stats"][0], expected["stats"][0])
    # JAX arrays are accepted too.
    out = step(jax.tree_util.tree_map(jnp.asarray, params), batch, scale=3.0)
    np.testing.assert_allclose(out["y"], (batch["x"] + 1) * 3)


def test_one_compilation_per_signature(rt):
    calls = []

    def double(x):
        calls.append(x.shape)  # runs only while JAX traces
        return x * 2

    f = neuron_virt.jit(double)
    for _ in range(3):
        np.testing.assert_array_equal(f(np.ones(4, np.float32)), 2 * np.ones(4))
    np.testing.assert_array_equal(f(np.ones((2, 2), np.float32)), 2 * np.ones((2, 2)))
    assert calls == [(4,), (2, 2)], "traced once per signature"
    assert "multiply" in f.lower(np.ones(4, np.float32))


def test_threads_call_copies_on_different_cores(rt):
    if len(rt.cores) < 2:
        pytest.skip("needs two cores")
    f = neuron_virt.jit(lambda x: jnp.tanh(x @ x.T), cores=rt.cores[:2], auto_cast="none")
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    expected = np.asarray(jax.jit(lambda x: jnp.tanh(x @ x.T))(x))
    failures = []

    def worker():
        for _ in range(20):
            if not np.allclose(f(x), expected, rtol=1e-4, atol=1e-5):
                failures.append("mismatch")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
