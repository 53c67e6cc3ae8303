"""Runtime and Model: the runtime's calls on NumPy arrays."""

import threading

import numpy as np

from . import _native
from ._dtypes import numpy_dtype
from ._active import execution_starts


class TensorInfo(tuple):
    """One input or output of a model: ``name``, ``hlo_name``, ``dtype``, ``shape``."""

    __slots__ = ()

    def __new__(cls, name, hlo_name, dtype, shape):
        return super().__new__(cls, (name, hlo_name, dtype, tuple(shape)))

    name = property(lambda self: self[0], doc="The name tensors are bound by (input0, output0, ...).")
    hlo_name = property(lambda self: self[1], doc="The HLO parameter or result it came from.")
    dtype = property(lambda self: self[2], doc="The element type's HLO name (f32, bf16, s32, pred, ...).")
    shape = property(lambda self: self[3], doc="The dimensions, outermost first.")

    def __repr__(self):
        return f"TensorInfo({self.name}: {self.dtype}{list(self.shape)} from {self.hlo_name})"


def _infos(raw):
    return [TensorInfo(*entry) for entry in raw]


class Model:
    """A model loaded on a NeuronCore: call it with NumPy (or JAX) arrays.

    ``model(*arrays)`` runs it once and returns its output (a tuple when it has
    several). Inputs are converted to the model's dtypes and C order when they are not
    already (arrays that are, are read in place); outputs are new NumPy arrays the
    runtime writes directly. The GIL is released while it runs, so threads calling
    models on different cores run in parallel.
    """

    def __init__(self, native):
        self._native = native
        self.inputs = _infos(native.inputs)
        self.outputs = _infos(native.outputs)
        self._input_types = [(info, numpy_dtype(info.dtype)) for info in self.inputs]
        self._output_types = [(info.shape, numpy_dtype(info.dtype)) for info in self.outputs]

    name = property(lambda self: self._native.name, doc="The NEFF's name.")
    core = property(lambda self: self._native.core, doc="The NeuronCore it is loaded on.")
    id = property(lambda self: self._native.id, doc="The runtime's model id (as the tools show it).")

    def __call__(self, *arrays):
        outputs = self.run(arrays)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def run(self, arrays):
        """Runs the model on the list of input arrays; returns the list of outputs."""
        return self._execute(*self._bind(arrays))

    def _execute(self, inputs, outputs):
        """Runs the model on inputs and outputs already bound (:meth:`_bind`)."""
        execution_starts()
        self._native.execute(inputs, outputs)
        return outputs

    def schedule(self, *arrays):
        """Schedules one execution on the core's compute unit and returns a
        :class:`Request` at once. The input arrays must not change until it completes
        (the same holds after a Ctrl-C during a call: the execution goes on).
        Raises :class:`NrtError` ``NRT_QUEUE_FULL`` when the unit already holds
        ``NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS`` (8) requests."""
        inputs, outputs = self._bind(arrays)
        execution_starts()
        return Request(self._native.schedule(inputs, outputs), outputs)

    def _bind(self, arrays):
        if len(arrays) != len(self._input_types):
            raise TypeError(f"model {self.name} takes {len(self._input_types)} inputs, got {len(arrays)}")
        inputs = [
            array
            if type(array) is np.ndarray
            and array.dtype is dtype
            and array.shape == info.shape
            and array.flags.c_contiguous
            else _input(array, info, dtype)
            for array, (info, dtype) in zip(arrays, self._input_types)
        ]
        outputs = [np.empty(shape, dtype) for shape, dtype in self._output_types]
        return inputs, outputs

    def unload(self):
        """Unloads the model; later calls fail with NRT_INVALID_HANDLE."""
        self._native.unload()

    def __repr__(self):
        return f"<Model {self.name} (id {self.id}) on nc{self.core}>"


class Request:
    """A scheduled execution (:meth:`Model.schedule`)."""

    def __init__(self, native, outputs):
        self._native = native
        self._outputs = outputs

    seq = property(lambda self: self._native.seq, doc="The request's sequence id (nrta_seq_t).")

    def done(self):
        """Whether the request has completed, successfully or not."""
        return self._native.done()

    def result(self, timeout=None):
        """Waits for the request (at most ``timeout`` seconds: ``TimeoutError``) and returns
        the model's output (a tuple when it has several); raises :class:`NrtError` with
        the request's status if it failed. Ctrl-C interrupts the wait."""
        self._native.wait(timeout)
        return self._outputs[0] if len(self._outputs) == 1 else tuple(self._outputs)

    def __repr__(self):
        return f"<Request {self.seq:#x} {'done' if self.done() else 'pending'}>"


def _input(array, info, dtype):
    value = np.asarray(array)
    if value.shape != info.shape:
        raise ValueError(
            f"{info.name} ({info.hlo_name}) is {info.dtype}{list(info.shape)}, got an array of shape {list(value.shape)}"
        )
    if value.dtype != dtype:
        if not np.can_cast(value.dtype, dtype, casting="same_kind"):
            raise TypeError(f"{info.name} ({info.hlo_name}) is {info.dtype}, got {value.dtype}")
        return np.ascontiguousarray(value, dtype=dtype)
    return np.ascontiguousarray(value)


class Runtime:
    """A Neuron runtime on virtual NeuronCores.

    Configured by the ``NEURON_RT_*`` / ``NEURON_VIRT_*`` environment, with these
    overrides: ``cores`` (a count, a list of core indices, or text as
    ``NEURON_RT_VISIBLE_CORES`` takes it), ``instance_type`` (``trn1.2xlarge``, ...)
    and ``tag`` (how ``neuron-ls``, ``neuron-top``, ``neuron-monitor`` and the dashboard
    label this process). Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, *, cores=None, instance_type=None, tag=None):
        self._native = _native.Runtime(cores=cores, instance_type=instance_type, tag=tag)

    def load(self, neff, *, core=None):
        """Loads a :class:`Neff` on NeuronCore ``core`` (an instance core index), or on
        the held core with the fewest models."""
        return Model(self._native.load(neff, core=core))

    def load_collectives(self, neff, cores):
        """Loads a :class:`Neff` whose program has collectives (``all-reduce``, ...,
        or a ``jax.shard_map`` / ``jax.pmap`` program, which compiles to one rank's
        program) once per core of ``cores``, as ranks 0, 1, ... in that order; returns
        the ranks' models in rank order. Call every rank at once, each from its own
        thread, with its shard: in each collective a rank waits for the others."""
        return [Model(native) for native in self._native.load_collectives(neff, list(cores))]

    def load_collectives_across(self, neff, core, rank, count):
        """Loads a :class:`Neff` with collectives on NeuronCore ``core`` as rank
        ``rank`` of ``count`` ranks spread over the processes of a job (torchrun,
        ``mpirun``, ...): each process loads the ranks it holds, with
        ``NEURON_RT_ROOT_COMM_ID`` set to rank 0's address in every process. The ranks'
        collectives meet once all are loaded; a rank missing at the timeout, a process
        gone or a mismatched call raises :class:`NrtError` naming the rank."""
        return Model(self._native.load_collectives_across(neff, core, rank, count))

    cores = property(lambda self: self._native.cores, doc="The NeuronCores this runtime holds.")
    instance_type = property(lambda self: self._native.instance_type, doc="The virtual instance type.")
    datastore_path = property(lambda self: self._native.datastore_path, doc="Where the tools read it from.")

    def close(self):
        """Unloads every model and releases the NeuronCores. Closing a closed runtime
        does nothing, so ``close()`` inside a ``with`` block is fine."""
        if not getattr(self, "_closed", False):
            self._native.close()
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        native = getattr(self, "_native", None)
        return repr(native) if native is not None else "<Runtime (not started)>"


_default = None
_default_lock = threading.Lock()


def runtime(**options):
    """The process's default runtime (the one :func:`jit` uses), started on first use
    with ``options`` (see :class:`Runtime`); later calls return it as it is."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime(**options)
        return _default
