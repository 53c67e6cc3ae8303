"""Run by test_multi_device.py as one process of a job started with torchrun's
variables (RANK, WORLD_SIZE) and NEURON_RT_ROOT_COMM_ID: holds two NeuronCores, loads
the data-parallel step as this process's two ranks of the job
(:meth:`Runtime.load_collectives_across`), runs ten steps with each rank's shard, and
prints each rank's parameters after them as JSON."""

import json
import os
import pathlib
import sys
import threading

import numpy as np

import neuron_virt

case = pathlib.Path(sys.argv[1])
process, processes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
per_process = 2
ranks = processes * per_process
first_core = int(sys.argv[2])

neff = neuron_virt.compile((case / "model.hlo").read_text(), name="dp_step", auto_cast="none")
w, x, y = (np.load(case / f"input{i}.npy") for i in range(3))
rows = x.shape[0] // ranks
cores = f"{first_core}-{first_core + per_process - 1}"
with neuron_virt.Runtime(cores=cores, instance_type="trn1.32xlarge", tag=f"pytest-rank-{process}") as rt:
    mine = [process * per_process + k for k in range(per_process)]
    models = [rt.load_collectives_across(neff, first_core + k, rank, ranks) for k, rank in enumerate(mine)]
    params = {rank: w for rank in mine}
    errors = []

    def step(model, rank):
        try:
            shard = slice(rank * rows, (rank + 1) * rows)
            params[rank] = model(params[rank], x[shard], y[shard])
        except Exception as error:  # reported in the output, with the rank
            errors.append(f"rank {rank}: {error}")

    for _ in range(10):
        threads = [threading.Thread(target=step, args=(m, r)) for m, r in zip(models, mine)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        if errors:
            break
print(json.dumps({"errors": errors, "params": {r: p.tolist() for r, p in params.items()}}))
