"""Run JAX functions on virtual NeuronCores, watch them with the Neuron tools.

    import neuron_virt, jax.numpy as jnp

    @neuron_virt.jit
    def mlp(x, w1, w2):
        return jnp.maximum(x @ w1, 0) @ w2

    y = mlp(x, w1, w2)          # NumPy in, NumPy out; compiled and loaded once per signature

The first call with given shapes and dtypes lowers the function with JAX, compiles the
HLO with the runtime's compiler (the ``neuron-cc`` options: ``auto_cast``,
``auto_cast_type``, ``optlevel``, ...), loads it on a virtual NeuronCore and caches it;
later calls only execute. The process is a Neuron runtime like any other: ``neuron-ls``,
``neuron-top``, ``neuron-monitor`` and the dashboard show it (tagged with
``NEURON_PROCESS_TAG`` or ``runtime(tag=...)``).

A ``jax.shard_map`` over :func:`make_mesh` runs under :func:`jit` as one collectives
rank per NeuronCore, in one process or across the processes of a launched job.

Lower level: :func:`compile` (HLO text to a :class:`Neff`), :class:`Runtime`,
:meth:`Runtime.load` and :class:`Model`, called with NumPy arrays, or scheduled
(:meth:`Model.schedule` returns a :class:`Request`).

Observability: ``with neuron_virt.profile("out.ntff"):`` records the executions inside
into an NTFF file; :func:`sys_trace_start` / :func:`sys_trace_fetch_events` return the
system trace as dicts.

Every runtime failure raises :class:`NrtError` with ``.status`` (the public
``NRT_STATUS`` name) and ``.code``; HLO the compiler refuses raises
:class:`CompileError` naming the operator and the line.
"""

from ._native import CompileError, Neff, NrtError, __version__, compile
from ._runtime import Model, Request, Runtime, runtime
from ._jit import jit
from ._shard import ProcessShards, make_mesh
from ._observe import profile, sys_trace_fetch_events, sys_trace_start, sys_trace_stop

__all__ = [
    "CompileError",
    "Model",
    "Neff",
    "NrtError",
    "ProcessShards",
    "Request",
    "Runtime",
    "__version__",
    "compile",
    "jit",
    "make_mesh",
    "profile",
    "runtime",
    "sys_trace_fetch_events",
    "sys_trace_start",
    "sys_trace_stop",
]
