"""What a Python user reads when something is asked wrongly: a sentence naming the
argument, never an internal structure or another process that is in fact this one."""

import pytest

import neuron_virt
from neuron_virt import _runtime


def test_zero_cores_is_refused_by_name():
    with pytest.raises(neuron_virt.NrtError) as e:
        neuron_virt.Runtime(cores=0)
    message = str(e.value)
    assert "cores=0" in message and "{" not in message, message


def test_a_tag_with_control_characters_is_refused():
    with pytest.raises(neuron_virt.NrtError, match="control character"):
        neuron_virt.Runtime(tag="job\x1b[2J")
    with pytest.raises(neuron_virt.NrtError, match="at most 255 bytes"):
        neuron_virt.Runtime(tag="x" * 1000)


def test_a_second_runtime_on_held_cores_names_this_process(rt):
    with pytest.raises(neuron_virt.NrtError) as e:
        neuron_virt.Runtime(instance_type="trn1.2xlarge", cores=[0])
    message = str(e.value)
    assert "another runtime in this process" in message, message


class _Native:
    """Stands in for the native runtime: closing twice fails, as the native one does."""

    def __init__(self):
        self.closes = 0

    def close(self):
        self.closes += 1
        if self.closes > 1:
            raise neuron_virt.NrtError("NRT_CLOSED: the runtime is closed")


def test_close_inside_with_is_fine():
    runtime = _runtime.Runtime.__new__(_runtime.Runtime)
    runtime._native = _Native()
    with runtime:
        runtime.close()
    assert runtime._native.closes == 1


def test_a_complex_number_is_named(rt):
    jax = pytest.importorskip("jax")

    with pytest.raises(neuron_virt.CompileError, match="complex numbers"):
        neuron_virt.jit(lambda x: (x * (1 + 2j)).real)(jax.numpy.ones(4, dtype="float32"))
