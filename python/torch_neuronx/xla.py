"""What torch-xla calls while it starts when ``torch_neuronx`` is installed
(``from torch_neuronx import xla; xla.init()``): the Neuron environment for the plugin."""


def init():
    """Sets the plugin's environment, as torch-xla does itself without torch-neuronx."""
    import libneuronxla
    from torch_xla._internal import neuron

    libneuronxla.configure_environment()
    neuron.set_envvar_defaults()
    neuron.configure_pjrt_environment()
