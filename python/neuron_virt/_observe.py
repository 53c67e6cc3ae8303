"""Observability from Python: profiles of a block of code, and the system trace."""

import json
import os
import threading

from . import _active, _native
from ._runtime import runtime as default_runtime


class profile:
    """Records the executions inside a ``with`` block into an NTFF file::

        with neuron_virt.profile("step.ntff"):
            train_step(params, batch)

    ``neuron-profile view -s step.ntff`` and the dashboard open the file. Every system
    event of the runtime is recorded; ``device_trace`` chooses which executions are also
    traced on the device (each instruction on each engine, each DMA transfer):
    ``"all"`` (the default), ``"nth"`` (only the ``nth`` execution called or scheduled
    inside the block, counting from 1; with several in flight at once the switch may
    also catch a neighbour), or ``"none"``. After the block, ``.summary`` holds the
    file's event counts. One profile at a time per process.
    """

    def __init__(self, path, *, device_trace="all", nth=1, runtime=None):
        if device_trace not in ("all", "nth", "none"):
            raise ValueError(f'device_trace is "all", "nth" or "none", not {device_trace!r}')
        if nth < 1:
            raise ValueError("nth counts executions from 1")
        self.path = os.fspath(path)
        self.device_trace = device_trace
        self.nth = nth
        self.summary = None
        self._runtime = runtime
        self._native = None
        self._executions = 0
        self._device_on = False
        self._lock = threading.Lock()

    def __enter__(self):
        runtime = self._runtime or default_runtime()

        def start():
            device = self.device_trace == "all" or (self.device_trace == "nth" and self.nth == 1)
            self._native = _native.Profile.start(runtime._native, self.path, device)
            self._device_on = device
            self._executions = 0

        _active.activate(self, start)
        return self

    def __exit__(self, *exc):
        _active.deactivate()
        system, device, lost = self._native.stop()
        self.summary = {"system_events": system, "device_events": device, "lost_events": lost}
        return False

    def _execution_starts(self):
        """Called before each execution inside the block (for ``device_trace="nth"``)."""
        if self.device_trace != "nth":
            return
        with self._lock:
            self._executions += 1
            wanted = self._executions == self.nth
            if wanted != self._device_on:
                self._native.set_device_trace(wanted)
                self._device_on = wanted


def sys_trace_start(*, cores=None, event_types=None, max_events_per_nc=None, runtime=None):
    """Starts capturing system trace events (``nrt_sys_trace_start``): of ``cores``
    (instance core indices; all by default) and ``event_types`` (names such as
    ``"nrt_execute"``; all by default), keeping at most ``max_events_per_nc`` per core
    until fetched."""
    runtime = runtime or default_runtime()
    _native.sys_trace_start(runtime._native, cores=cores, event_types=event_types,
                            max_events_per_nc=max_events_per_nc)


def sys_trace_stop(*, runtime=None):
    """Stops the capture; what it recorded can still be fetched."""
    _native.sys_trace_stop((runtime or default_runtime())._native)


def sys_trace_fetch_events(*, core=None, max_events_per_nc=None, runtime=None):
    """The captured events not fetched before, as dicts in the ``nrt_sys_trace_fetch_events``
    shape (``event_type``, ``phase``, ``id``, ``nc_idx``, ``tracking_id``, ``thread_id``,
    ``data``, ``timestamp_ns``, and ``nrta_seq_id`` when there is one). Each event is
    returned once; ``core`` and ``max_events_per_nc`` leave the others for later."""
    runtime = runtime or default_runtime()
    text = _native.sys_trace_fetch_events(runtime._native, core=core, max_events_per_nc=max_events_per_nc)
    return json.loads(text)["events"]
