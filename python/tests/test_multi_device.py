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
import pytest

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


def run_two_processes(worker, case, first_core):
    """Runs python/tests/`worker` as the two processes of a job started with torchrun's
    variables (process p on cores first_core + 2p and the next); returns each one's
    JSON result (its last line of output) with its stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        root = f"127.0.0.1:{s.getsockname()[1]}"
    processes = [
        subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).with_name(worker)), str(case), str(first_core + 2 * process)],
            env={**os.environ, "RANK": str(process), "WORLD_SIZE": "2", "NEURON_RT_ROOT_COMM_ID": root},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for process in range(2)
    ]
    results = [p.communicate(timeout=180) for p in processes]
    for p, (out, err) in zip(processes, results):
        assert p.returncode == 0, err
    return [(json.loads(out.strip().splitlines()[-1]), err) for out, err in results]


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
    results = run_two_processes("ranks_worker.py", case, first_core=8)
    ten_steps = np.load(case / "steps.npy")
    for result, err in results:
        assert not result["errors"], (result["errors"], err)
        assert len(result["params"]) == 2
        for rank, params in result["params"].items():
            np.testing.assert_allclose(np.array(params, dtype=np.float32), ten_steps, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}")


def data_parallel_step(jax, mesh):
    """The step of tests/data/jax_multi/data_parallel_step (gen_jax_multi_fixtures.py)."""
    from jax.sharding import PartitionSpec as P

    jnp = jax.numpy

    def step(w, x, y):
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.1 * jax.lax.pmean(grad, "dp")

    return jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P())


def test_jit_runs_a_shard_map_step_on_a_mesh_of_cores_for_ten_steps():
    """neuron_virt.jit of a shard_map over make_mesh: global arrays in, global arrays out,
    each rank on a core of its own; ten steps end where XLA ended on 4 CPU devices."""
    jax = pytest.importorskip("jax")
    case = MULTI / "data_parallel_step"
    w, x, y = (np.load(case / f"input{i}.npy") for i in range(3))
    with neuron_virt.Runtime(cores="4-7", instance_type="trn1.32xlarge", tag="pytest-jit-mesh") as rt:
        step = neuron_virt.jit(data_parallel_step(jax, neuron_virt.make_mesh((4,), ("dp",))), runtime=rt,
                               cores=[4, 5, 6, 7], auto_cast="none")
        for _ in range(10):
            w = step(w, x, y)
        assert isinstance(w, np.ndarray) and w.shape == (8, 2)
        np.testing.assert_allclose(w, np.load(case / "steps.npy"), rtol=1e-4, atol=1e-5)
        # A global array that does not split over the mesh is refused (by JAX, lowering it).
        with pytest.raises(ValueError, match="not evenly divisible"):
            step(w, x[:15], y[:15])


def test_jit_cuts_and_joins_arrays_over_a_two_dimensional_mesh():
    """A 2 × 2 mesh (dp, tp): each value is cut along the axes its spec names, results are
    joined from the ranks' parts, and a value replicated over an axis comes back once."""
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec as P

    mesh = neuron_virt.make_mesh((2, 2), ("dp", "tp"))

    def layer(w, x):
        # x: rows over dp, columns over tp; w: rows over tp. Partial products summed over tp.
        return jax.lax.psum(x @ w, "tp"), x * 2

    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    with neuron_virt.Runtime(cores="4-7", instance_type="trn1.32xlarge", tag="pytest-jit-2d") as rt:
        f = neuron_virt.jit(
            jax.shard_map(layer, mesh=mesh, in_specs=(P("tp", None), P("dp", "tp")), out_specs=(P("dp"), P("dp", "tp"))),
            runtime=rt, auto_cast="none",
        )
        y, doubled = f(w, x)
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(doubled, x * 2)
        # Three cores for a mesh of four devices: refused, saying what to give.
        few = neuron_virt.jit(jax.shard_map(layer, mesh=mesh, in_specs=(P("tp", None), P("dp", "tp")),
                                            out_specs=(P("dp"), P("dp", "tp"))), runtime=rt, cores=[4, 5, 6])
        with pytest.raises(ValueError, match=r"the mesh \(dp=2, tp=2\) has 4 devices: give as many cores"):
            few(w, x)


def test_axis_index_gives_each_rank_its_mesh_coordinates():
    """jax.lax.axis_index (HLO partition-id) in a shard_map over a 2 × 2 mesh: each rank
    sees its own coordinates, as on XLA's devices."""
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec as P

    mesh = neuron_virt.make_mesh((2, 2), ("dp", "tp"))

    def tag(a):
        return a + 100 * jax.lax.axis_index("dp") + 10 * jax.lax.axis_index("tp")

    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    with neuron_virt.Runtime(cores="4-7", instance_type="trn1.32xlarge", tag="pytest-axis-index") as rt:
        f = neuron_virt.jit(jax.shard_map(tag, mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp")), runtime=rt)
        # Rows over dp, column pairs over tp: block (i, j) gets 100 i + 10 j.
        expected = a + np.array([[0, 0, 10, 10], [100, 100, 110, 110]], dtype=np.int32)
        np.testing.assert_array_equal(f(a), expected)


def test_jit_runs_a_shard_map_as_ranks_of_two_processes():
    """Two processes started with torchrun's variables each run the ranks their two cores
    hold: ten steps of the replicated parameters end where XLA ended, and a result split
    over both processes comes back as ProcessShards holding this process's parts."""
    pytest.importorskip("jax")
    case = MULTI / "data_parallel_step"
    results = run_two_processes("shard_map_worker.py", case, first_core=12)
    x = np.load(case / "input1.npy")
    for process, (result, err) in enumerate(results):
        np.testing.assert_allclose(np.array(result["params"], dtype=np.float32), np.load(case / "steps.npy"),
                                   rtol=1e-4, atol=1e-5)
        # The rows of x doubled, split over dp = 4 ranks: this process holds two of them.
        held = {int(rank): part for rank, part in result["doubled"].items()}
        assert sorted(held) == [2 * process, 2 * process + 1]
        for rank, (start, stop, part) in held.items():
            assert (start, stop) == (4 * rank, 4 * rank + 4)
            np.testing.assert_array_equal(np.array(part, dtype=np.float32), x[start:stop] * 2)
