"""The examples of examples/python/ compute what JAX computes, train, and serve."""

import importlib.util
import os
import pathlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import neuron_virt  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mlp_inference_matches_jax(rt):
    mlp = example("mlp_inference")
    params = mlp.init_params(jax.random.PRNGKey(0))
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (8, mlp.SIZES[0])), np.float32)
    expected = np.asarray(jax.jit(mlp.mlp)(params, x))
    exact = neuron_virt.jit(mlp.mlp, auto_cast="none", mixed_precision_accumulation=True)(params, x)
    np.testing.assert_allclose(exact, expected, rtol=1e-4, atol=1e-5)
    default = neuron_virt.jit(mlp.mlp)(params, x)
    assert np.abs(default - expected).max() < 0.05 * np.abs(expected).max()


def test_transformer_training_step_matches_jax_and_the_loss_goes_down(rt, tmp_path):
    train = example("transformer_train")
    params = jax.tree_util.tree_map(np.asarray, train.init_params(jax.random.PRNGKey(0)))
    tokens, targets = train.batch_of(np.random.default_rng(0))
    exact = neuron_virt.jit(train.train_step, auto_cast="none", mixed_precision_accumulation=True)
    ours, our_loss = exact(params, tokens, targets, 0.5)
    theirs, their_loss = jax.jit(train.train_step)(params, tokens, targets, 0.5)
    np.testing.assert_allclose(our_loss, their_loss, rtol=1e-4)
    for name in params:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-3, atol=1e-5)

    path = tmp_path / "step.ntff"
    losses = train.train(8, str(path))
    assert losses[-1] < 0.7 * losses[0], losses
    assert path.stat().st_size > 0
    binary = os.environ.get("NEURON_PROFILE")
    if binary:
        import json
        import subprocess

        out = subprocess.run([binary, "view", "--output-format", "summary-json", "-s", str(path)],
                             check=True, capture_output=True, text=True).stdout
        summary = json.loads(out)
        assert summary["executions"]["count"] == 1 and summary["events"]["device"] > 0


def test_async_serving_gives_the_synchronous_results(rt):
    serving = example("async_serving")
    keys = jax.random.split(jax.random.PRNGKey(0), len(serving.SIZES) - 1)
    params = [np.asarray(jax.random.normal(k, (a, b)) / np.sqrt(a), np.float32)
              for k, a, b in zip(keys, serving.SIZES[:-1], serving.SIZES[1:])]
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((serving.BATCH, serving.SIZES[0])).astype(np.float32) for _ in range(24)]
    models = serving.load_everywhere(rt, params)
    try:
        expected = serving.serve_sync(models[0], requests)
        results = serving.serve_async(models, requests, inflight=4)
    finally:
        for model in models:
            model.unload()
    assert all(np.array_equal(a, b) for a, b in zip(results, expected))
