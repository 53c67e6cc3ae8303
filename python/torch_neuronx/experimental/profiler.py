"""``torch_neuronx.experimental.profiler.profile``, mapped onto this runtime's profiles: the
executions of the graphs that run inside the block are recorded into an NTFF file, which
``neuron-profile view -s FILE`` and the dashboard open (tables, timeline, findings)."""

import os


class _FrameworkRuntime:
    """What ``neuron_virt.profile`` needs of a runtime: the plugin's, which runs the graphs."""

    def __init__(self):
        from neuron_virt import _native

        self._native = _native.framework_runtime()


class profile:
    """Records what runs inside the ``with`` block::

        with torch_neuronx.experimental.profiler.profile(output="step.ntff"):
            train_step()
            xm.mark_step()

    ``output`` is the NTFF file (default ``neuron_profile/<pid>.ntff``);
    ``profile_type="operator"`` (the default) traces every execution on the device,
    ``"trace"`` too. torch-neuronx's ``port``, ``ms_duration`` and TensorBoard options
    have no meaning here and are accepted for scripts that pass them. The block waits
    for the graphs it started before it ends.
    """

    def __init__(self, port=9012, ms_duration=60000, profile_type="operator", output=None, **_options):
        if profile_type not in ("operator", "trace"):
            raise ValueError(f'profile_type is "operator" or "trace", not {profile_type!r}')
        self.output = output or os.path.join("neuron_profile", f"{os.getpid()}.ntff")
        self.summary = None
        self._profile = None

    def __enter__(self):
        import neuron_virt

        folder = os.path.dirname(self.output)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._profile = neuron_virt.profile(self.output, runtime=_FrameworkRuntime())
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        import torch_xla.core.xla_model as xm

        try:
            xm.wait_device_ops()
        finally:
            self._profile.__exit__(*exc)
            self.summary = self._profile.summary
        return False
