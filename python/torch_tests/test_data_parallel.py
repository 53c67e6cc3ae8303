"""``torchrun --nproc_per_node=2`` with the ``xla`` process group: two processes, one
NeuronCore each, gradients all-reduced across them, equal to full-batch eager training."""

import os
import pathlib
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_data_parallel_training_equals_full_batch_training():
    worker = pathlib.Path(__file__).with_name("data_parallel_worker.py")
    env = dict(os.environ)
    # Cores 2 and 3 (torch-xla gives each local rank its share of the visible cores);
    # this test process holds one of the others.
    env.update(NEURON_RT_VISIBLE_CORES="2-3", NEURON_RT_ROOT_COMM_ID=f"127.0.0.1:{free_port()}")
    env.pop("NEURON_RT_NUM_CORES", None)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(worker)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    for rank in (0, 1):
        assert f"rank {rank} of 2: worst relative difference" in said, said
