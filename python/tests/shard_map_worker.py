"""Run by test_multi_device.py as one process of a job started with torchrun's
variables (RANK, WORLD_SIZE) and NEURON_RT_ROOT_COMM_ID: runs the data-parallel step of
tests/data/jax_multi (a jax.shard_map over a mesh of 4 NeuronCores) through
neuron_virt.jit for ten steps, on the two ranks its two cores hold, then a function
whose result is split over the ranks; prints what it got as JSON."""

import json
import pathlib
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import neuron_virt
from test_multi_device import data_parallel_step

case = pathlib.Path(sys.argv[1])
first_core = int(sys.argv[2])
w, x, y = (np.load(case / f"input{i}.npy") for i in range(3))
mesh = neuron_virt.make_mesh((4,), ("dp",))
with neuron_virt.Runtime(cores=f"{first_core}-{first_core + 1}", instance_type="trn1.32xlarge") as rt:
    # The launcher's variables say which ranks this process's cores hold.
    step = neuron_virt.jit(data_parallel_step(jax, mesh), runtime=rt, auto_cast="none")
    for _ in range(10):
        w = step(w, x, y)
    double = neuron_virt.jit(jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")), runtime=rt)
    doubled = double(x)
    assert isinstance(doubled, neuron_virt.ProcessShards), doubled
    parts = {rank: (index[0].start, index[0].stop, part.tolist()) for rank, (index, part) in doubled.shards.items()}
print(json.dumps({"params": w.tolist(), "doubled": parts}))
