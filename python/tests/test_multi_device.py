"""Programs of several devices: a ``jax.shard_map`` step loaded as collectives ranks
with :meth:`Runtime.load_collectives`, each rank executed from its own thread with its
shard, against what XLA computed on 4 CPU devices (``tests/data/jax_multi``)."""

import pathlib
import threading

import numpy as np

import neuron_virt

MULTI = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "jax_multi"


def run_ranks(models, inputs):
    """Calls every rank at once, each from its own thread (a rank waits for the others
    in each collective); returns each rank's output."""
    outputs = [None] * len(models)
    errors = []

    def rank(r):
        try:
            outputs[r] = models[r](*inputs[r])
        except Exception as error:  # reported below, with the rank
            errors.append((r, error))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return outputs


def test_a_shard_map_step_runs_as_four_ranks_from_python():
    case = MULTI / "data_parallel_step"
    neff = neuron_virt.compile((case / "model.hlo").read_text(), name="dp_step", auto_cast="none")
    w, x, y = (np.load(case / f"input{i}.npy") for i in range(3))
    expected = np.load(case / "output0.npy")
    # Cores of their own: the session's runtime holds those of a trn1.2xlarge.
    with neuron_virt.Runtime(cores="4-7", instance_type="trn1.32xlarge", tag="pytest-multi") as rt:
        models = rt.load_collectives(neff, [4, 5, 6, 7])
        assert [m.core for m in models] == [4, 5, 6, 7]
        # w is replicated; x and y are split by rows over the mesh's 4 devices.
        shards = [(w, x[4 * r : 4 * r + 4], y[4 * r : 4 * r + 4]) for r in range(4)]
        for output in run_ranks(models, shards):
            np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)
