"""Multi-device functions (``jax.shard_map``) run as collectives ranks, one per
NeuronCore: global arrays are cut into each rank's shard, and the ranks' results are
joined into global arrays, as JAX does over a mesh of devices."""

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def make_mesh(axis_shapes, axis_names):
    """A mesh of NeuronCores for ``jax.shard_map``: ``make_mesh((4,), ("dp",))``, or
    ``make_mesh((2, 2), ("dp", "tp"))``. It is JAX's ``AbstractMesh`` (no JAX devices
    needed); under :func:`neuron_virt.jit`, mesh device ``d`` (in row-major order of
    the axes) is rank ``d``, run on the ``d``-th of the function's cores."""
    from jax.sharding import AbstractMesh

    return AbstractMesh(tuple(axis_shapes), tuple(axis_names))


class ProcessShards:
    """A result of a function whose mesh spans several processes, where this process's
    ranks hold only part of it (JAX calls such an array not fully addressable).

    ``shape`` and ``dtype`` are the global array's; ``shards`` maps each of this
    process's ranks to ``(index, array)``, ``index`` being the tuple of slices of the
    global array that the rank holds. ``np.asarray`` on it raises: the other parts are
    in other processes."""

    def __init__(self, shape, dtype, shards):
        self.shape = shape
        self.dtype = dtype
        self.shards = shards

    def __array__(self, dtype=None, copy=None):
        raise ValueError(
            f"this {self.dtype}{list(self.shape)} result is split over the processes of the job; "
            f"this process holds the parts of ranks {sorted(self.shards)} (see .shards)"
        )

    def __repr__(self):
        return f"<ProcessShards {self.dtype}{list(self.shape)}, ranks {sorted(self.shards)} of it held here>"


class ShardedProgram:
    """One rank's program loaded on each of this process's cores; calling it with the
    global arrays runs every local rank at once, each from its own thread, and returns
    the global results (or :class:`ProcessShards` where other processes hold parts)."""

    def __init__(self, runtime, neff, sharding, cores, ranks):
        mesh = sharding["mesh"]
        self._sizes = dict(mesh)
        self._shape = [size for _, size in mesh]
        self._names = [name for name, _ in mesh]
        self._inputs = sharding["inputs"]
        self._outputs = sharding["outputs"]
        devices = math.prod(self._shape)
        description = ", ".join(f"{name}={size}" for name, size in mesh)
        if ranks is not None:
            ranks = list(ranks)
            if cores is None or len(cores) != len(ranks):
                raise ValueError("ranks=[...] needs as many cores=[...], one core per rank")
        else:
            cores = list(cores) if cores is not None else None
            # In a job its launcher started, each process holds its share of the ranks.
            launched = runtime._native.job_ranks(len(cores) if cores is not None else len(runtime.cores))
            if launched is not None:
                cores = cores if cores is not None else list(runtime.cores)
                ranks, count = launched
                if count != devices:
                    raise ValueError(
                        f"the mesh ({description}) has {devices} devices, but the job's launcher makes "
                        f"{count} ranks of {len(cores)} cores per process"
                    )
            else:
                cores = cores if cores is not None else list(runtime.cores)[:devices]
                ranks = list(range(len(cores)))
                if len(cores) != devices:
                    raise ValueError(
                        f"the mesh ({description}) has {devices} devices: give as many cores (cores=[...]; "
                        f"the runtime holds {list(runtime.cores)}), or, in a job of several processes, "
                        f"the ranks this process's cores hold (ranks=[...])"
                    )
        if any(not 0 <= r < devices for r in ranks):
            raise ValueError(f"ranks {ranks}: the mesh ({description}) has ranks 0 to {devices - 1}")
        if sorted(ranks) == list(range(devices)):
            by_rank = dict(zip(ranks, cores))
            models = runtime.load_collectives(neff, [by_rank[r] for r in range(devices)])
            self._models = list(enumerate(models))
        else:
            self._models = [(r, runtime.load_collectives_across(neff, c, r, devices)) for r, c in zip(ranks, cores)]
        self._devices = devices
        self._pool = ThreadPoolExecutor(max_workers=len(self._models), thread_name_prefix="neuron-rank")

    def _coordinates(self, rank):
        return dict(zip(self._names, np.unravel_index(rank, self._shape)))

    def _index(self, axes, local_shape, rank):
        """The slices of the global array that `rank`'s shard of this value covers."""
        coordinates = self._coordinates(rank)
        index = []
        for dim, size in enumerate(local_shape):
            block = 0
            for axis in axes[dim] if dim < len(axes) else []:
                block = block * self._sizes[axis] + int(coordinates[axis])
            index.append(slice(block * size, (block + 1) * size))
        return tuple(index)

    def _global_shape(self, axes, local_shape):
        return tuple(
            size * math.prod(self._sizes[a] for a in (axes[dim] if dim < len(axes) else []))
            for dim, size in enumerate(local_shape)
        )

    def run(self, arrays):
        if len(arrays) != len(self._inputs):
            raise TypeError(f"the program takes {len(self._inputs)} inputs, got {len(arrays)}")

        # Every rank's shards checked and converted first: a rank that cannot run must
        # not leave the others waiting in their collectives.
        bound = [(rank, model, model._bind(self._shards(arrays, rank, model))) for rank, model in self._models]
        futures = [(rank, self._pool.submit(model._execute, *io)) for rank, model, io in bound]
        results, errors = {}, []
        for rank, future in futures:
            try:
                results[rank] = future.result()
            except Exception as error:  # every rank is waited for; the first failure is raised
                errors.append((rank, error))
        if errors:
            rank, error = errors[0]
            error.add_note(f"raised by rank {rank} of {self._devices}")
            raise error
        return [self._join(k, axes, results) for k, axes in enumerate(self._outputs)]

    def _shards(self, arrays, rank, model):
        """`rank`'s part of each global input (a view)."""
        parts = []
        for array, axes, info in zip(arrays, self._inputs, model.inputs):
            array = np.asarray(array)
            expected = self._global_shape(axes, info.shape)
            if array.shape != expected:
                raise ValueError(
                    f"{info.name} ({info.hlo_name}) is {info.dtype}{list(expected)} over the mesh, "
                    f"got an array of shape {list(array.shape)}"
                )
            parts.append(array[self._index(axes, info.shape, rank)])
        return parts

    def _join(self, k, axes, results):
        """Output `k` as a global array from the ranks' shards (one copy of each part)."""
        local = next(iter(results.values()))[k]
        shape = self._global_shape(axes, local.shape)
        held = {rank: (self._index(axes, local.shape, rank), outputs[k]) for rank, outputs in results.items()}
        # Ranks that differ only along axes the value is not split over hold the same part.
        parts = {tuple((s.start, s.stop) for s in index): (index, part) for index, part in held.values()}
        if len(parts) < math.prod(n // max(m, 1) for n, m in zip(shape, local.shape)):
            return ProcessShards(shape, local.dtype, held)
        if len(parts) == 1:
            return local
        joined = np.empty(shape, local.dtype)
        for index, part in parts.values():
            joined[index] = part
        return joined

