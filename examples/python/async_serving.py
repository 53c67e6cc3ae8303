"""Serving many requests from one thread with scheduled executions on two NeuronCores,
against a synchronous loop.

    python examples/python/async_serving.py [--requests 600] [--inflight 4] [--rounds 3]

A small MLP (a batch of 64 rows per request through 20 layers of 224; each matrix
product stays under the size at which one execution spreads over several host CPUs,
and the weights of both cores' copies stay in the host's cache) is loaded on every
core of the runtime. The synchronous loop calls it on one core, one request after the other. The asynchronous
server keeps up to --inflight requests scheduled on each core's compute unit
(Model.schedule), collecting results as they complete, all from this one thread. The
two alternate for --rounds rounds; it prints the median throughputs and the median of
the rounds' ratios.
"""

import argparse
import collections
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import neuron_virt

BATCH, SIZES = 64, [224] * 20 + [64]


def mlp(params, x):
    for w in params[:-1]:
        x = jnp.maximum(x @ w, 0.0)
    return x @ params[-1]


def load_everywhere(runtime, params):
    """The MLP with its weights as constants, loaded once per core of `runtime`."""
    forward = lambda x: mlp(params, x)
    hlo = jax.jit(forward).lower(np.zeros((BATCH, SIZES[0]), np.float32)).as_text(dialect="hlo")
    neff = neuron_virt.compile(hlo, name="serving_mlp")
    return [runtime.load(neff, core=core) for core in runtime.cores]


def serve_sync(model, requests):
    return [model(x) for x in requests]


def serve_async(models, requests, inflight):
    """All requests through every model's queue, from this thread; results in order."""
    results = [None] * len(requests)
    pending = collections.deque()
    queued = {id(model): 0 for model in models}
    next_request = 0
    while next_request < len(requests) or pending:
        for model in models:
            while next_request < len(requests) and queued[id(model)] < inflight:
                pending.append((next_request, model, model.schedule(requests[next_request])))
                queued[id(model)] += 1
                next_request += 1
        index, model, request = pending.popleft()
        results[index] = request.result()
        queued[id(model)] -= 1
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    keys = jax.random.split(jax.random.PRNGKey(0), len(SIZES) - 1)
    params = [np.asarray(jax.random.normal(k, (a, b)) / np.sqrt(a), np.float32)
              for k, a, b in zip(keys, SIZES[:-1], SIZES[1:])]
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((BATCH, SIZES[0])).astype(np.float32) for _ in range(args.requests)]

    runtime = neuron_virt.runtime()
    models = load_everywhere(runtime, params)
    serve_sync(models[0], requests[:50])  # warm up
    sync_rates, async_rates = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        expected = serve_sync(models[0], requests)
        sync_rates.append(len(requests) / (time.perf_counter() - started))
        started = time.perf_counter()
        results = serve_async(models, requests, args.inflight)
        async_rates.append(len(requests) / (time.perf_counter() - started))
        assert all(np.array_equal(a, b) for a, b in zip(results, expected)), "results differ"
    ratio = statistics.median(a / s for a, s in zip(async_rates, sync_rates))
    print(f"synchronous, one core:             {statistics.median(sync_rates):9.1f} requests/s")
    print(f"scheduled, {len(models)} cores, {args.inflight} in flight each: {statistics.median(async_rates):9.1f} requests/s"
          f"  ({ratio:.2f}x, median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
