"""jit: a JAX function compiled for, and run on, virtual NeuronCores."""

import functools
import itertools
import threading

import numpy as np

from . import _native
from ._runtime import runtime as default_runtime
from ._shard import ShardedProgram


def jit(fn=None, *, cores=None, ranks=None, runtime=None, auto_cast="matmult", auto_cast_type="bf16", optlevel=2,
        mixed_precision_accumulation=False, saturate_infinity=False, target=None):
    """Compiles ``fn`` for virtual NeuronCores on its first call with given argument
    shapes and dtypes, and runs it there on every call.

    Arguments are NumPy or JAX arrays, Python scalars, and pytrees of them (as
    ``jax.jit`` takes them); the result has ``fn``'s pytree structure with NumPy arrays
    as leaves. The compile options are those of ``neuron-cc``: ``auto_cast``
    (``none``, ``matmult``, ``all``), ``auto_cast_type`` (``bf16``, ``fp16``, ``tf32``,
    ``fp8_e4m3``), ``optlevel`` (1 to 3), ``mixed_precision_accumulation``,
    ``saturate_infinity``, ``target`` (default: the runtime's NeuronCore generation).
    ``cores`` loads a copy on each of these cores (an index or a list) and spreads calls
    over them; by default the runtime picks one. ``runtime`` defaults to
    :func:`neuron_virt.runtime`. JAX is imported on the first call only.

    A function written with ``jax.shard_map`` over a mesh (:func:`neuron_virt.make_mesh`,
    or any JAX mesh) runs as one collectives rank per mesh device, mesh device ``d``
    on ``cores[d]`` (default: the runtime's first cores): it takes and returns global
    arrays, cut into each rank's shard and joined back as JAX does. In a job of
    several processes (torchrun, ``mpirun``, Slurm, with ``NEURON_RT_ROOT_COMM_ID``),
    each process runs the ranks its cores hold (from the launcher's variables, or
    ``ranks=[...]``, one per core); a result split over other processes' ranks comes
    back as :class:`neuron_virt.ProcessShards`.
    """
    options = dict(auto_cast=auto_cast, auto_cast_type=auto_cast_type, optlevel=optlevel,
                   mixed_precision_accumulation=mixed_precision_accumulation,
                   saturate_infinity=saturate_infinity)
    if fn is None:
        return functools.partial(jit, cores=cores, ranks=ranks, runtime=runtime, target=target, **options)
    return JitFunction(fn, cores=cores, ranks=ranks, runtime=runtime, target=target, options=options)


class JitFunction:
    """The callable :func:`jit` returns; ``.lower(*args)`` gives the HLO text it compiles."""

    def __init__(self, fn, *, cores, ranks, runtime, target, options):
        self._fn = fn
        self._cores = [cores] if isinstance(cores, int) else cores
        self._ranks = ranks
        self._runtime = runtime
        self._target = target
        self._options = options
        self._cache = {}
        # Reentrant: a function may call its own jit wrapper while JAX traces it.
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def lower(self, *args, **kwargs):
        """The HLO text JAX lowers ``fn`` to for these arguments."""
        import jax

        return jax.jit(self._fn, keep_unused=True).lower(*args, **kwargs).as_text(dialect="hlo")

    def __call__(self, *args, **kwargs):
        # The common case first: NumPy arrays only, no keyword arguments. Its cache key
        # needs no pytree flattening.
        if not kwargs and all(type(a) is np.ndarray for a in args):
            key = tuple((a.shape, a.dtype) for a in args)
            arrays = args
        else:
            import jax

            leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
            arrays = [np.asarray(leaf) for leaf in leaves]
            # The leaves' types too: JAX lowers a Python float weakly typed, unlike a
            # NumPy float64 of the same shape and dtype.
            key = (in_tree, tuple((type(leaf), a.shape, a.dtype) for leaf, a in zip(leaves, arrays)))
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._compile(args, kwargs)
                    self._cache[key] = entry
        models, next_model, out_tree, single = entry
        model = models[next(next_model) % len(models)] if len(models) > 1 else models[0]
        outputs = model.run(arrays)
        if single:
            return outputs[0]
        import jax

        return jax.tree_util.tree_unflatten(out_tree, outputs)

    def _compile(self, args, kwargs):
        import jax

        lowered = jax.jit(self._fn, keep_unused=True).lower(*args, **kwargs)
        runtime = self._runtime or default_runtime()
        target = self._target or {"trn2.48xlarge": "trn2"}.get(runtime.instance_type, "trn1")
        name = getattr(self._fn, "__name__", "function")
        neff = _native.compile(lowered.as_text(dialect="hlo"), name=name, target=target, **self._options)
        if neff.sharding is not None:
            # One program whose ranks run together: it takes and gives global arrays.
            models = [ShardedProgram(runtime, neff, neff.sharding, self._cores, self._ranks)]
        else:
            models = [runtime.load(neff, core=core) for core in self._cores or [None]]
        # A function returning one array gives that array back without a pytree step.
        single = lowered.out_tree.num_leaves == 1 and lowered.out_tree.num_nodes == 1
        return models, itertools.count(), lowered.out_tree, single
