"""Programs of several devices: a ``jax.shard_map`` step loaded as collectives ranks
with :meth:`Runtime.load_collectives`, each rank executed from its own thread with its
shard, against what XLA computed on 4 CPU devices (``tests/data/jax_multi``)."""

import json
import os
import pathlib
import socket
import subprocess
import sys
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


def test_a_shard_map_step_runs_as_ranks_of_two_processes_for_ten_steps():
    """Two Python processes started as torchrun starts them, each holding two of the
    four ranks, train for ten steps and end where XLA ended on 4 CPU devices."""
    case = MULTI / "data_parallel_step"
    worker = pathlib.Path(__file__).with_name("ranks_worker.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        root = f"127.0.0.1:{s.getsockname()[1]}"
    processes = [
        subprocess.Popen(
            [sys.executable, str(worker), str(case), str(8 + 2 * process)],
            env={**os.environ, "RANK": str(process), "WORLD_SIZE": "2", "NEURON_RT_ROOT_COMM_ID": root},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for process in range(2)
    ]
    results = [p.communicate(timeout=120) for p in processes]
    for p, (out, err) in zip(processes, results):
        assert p.returncode == 0, err
    ten_steps = np.load(case / "steps.npy")
    for out, err in results:
        result = json.loads(out.strip().splitlines()[-1])
        assert not result["errors"], (result["errors"], err)
        assert len(result["params"]) == 2
        for rank, params in result["params"].items():
            np.testing.assert_allclose(np.array(params, dtype=np.float32), ten_steps, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}")
