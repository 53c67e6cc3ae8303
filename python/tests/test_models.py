"""compile, Neff, Runtime.load and Model calls: numerics against XLA's outputs for the
JAX fixtures, in-place arrays, conversions and errors."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import neuron_virt
from neuron_virt._dtypes import numpy_dtype

# Every JAX fixture of tests/data/jax (tests/data/gen_jax_fixtures.py writes them).
CASES = sorted(p.name for p in (pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "jax").iterdir())

TOLERANCE = {"f32": (1e-5, 1e-4), "f16": (1e-3, 2e-3), "bf16": (1e-2, 1.6e-2)}


def run_fixture(rt, fixtures, case):
    directory = fixtures / case
    hlo = (directory / "model.hlo").read_text()
    neff = neuron_virt.compile(hlo, name=case, auto_cast="none", mixed_precision_accumulation=True)
    model = rt.load(neff)
    inputs = [load(path) for path in sorted(directory.glob("input*.npy"), key=lambda p: int(p.stem[5:]))]
    expected = [load(path) for path in sorted(directory.glob("output*.npy"), key=lambda p: int(p.stem[6:]))]
    outputs = model.run(inputs)
    model.unload()
    narrowest = "bf16" if "bf16[" in hlo else "f16" if "f16[" in hlo else "f32"
    return outputs, expected, TOLERANCE[narrowest]


def load(path):
    """An .npy file; JAX saves bfloat16 arrays as two-byte voids, read back as bf16."""
    array = np.load(path)
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:
        return array.view(numpy_dtype("bf16"))
    return array


@pytest.mark.parametrize("case", CASES)
def test_jax_fixtures_match_xla(rt, fixtures, case):
    outputs, expected, (atol, rtol) = run_fixture(rt, fixtures, case)
    assert len(outputs) == len(expected)
    for ours, xla in zip(outputs, expected):
        assert ours.shape == xla.shape and ours.dtype == xla.dtype
        if xla.dtype == numpy_dtype("bf16") or np.issubdtype(xla.dtype, np.floating):
            np.testing.assert_allclose(ours.astype(np.float32), xla.astype(np.float32), atol=atol, rtol=rtol)
        else:
            np.testing.assert_array_equal(ours, xla)


def add_neff():
    hlo = "HloModule add\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  y = f32[4]{0} parameter(1)\n  ROOT s = f32[4]{0} add(x, y)\n}\n"
    return neuron_virt.compile(hlo, name="add")


def test_models_describe_their_tensors_and_neffs_round_trip(rt, tmp_path):
    neff = add_neff()
    path = tmp_path / "add.neff"
    neff.save(path)
    assert neuron_virt.Neff.from_bytes(path.read_bytes()).inputs == neff.inputs
    again = neuron_virt.Neff.load(path)
    assert again.name == "add" and again.inputs == neff.inputs
    model = rt.load(again)
    assert [(i.name, i.dtype, i.shape) for i in model.inputs] == [("input0", "f32", (4,)), ("input1", "f32", (4,))]
    assert [(o.name, o.hlo_name) for o in model.outputs] == [("output0", "s")]
    assert model.core in rt.cores
    np.testing.assert_array_equal(model(np.arange(4, dtype=np.float32), [1, 1, 1, 1]), [1, 2, 3, 4])
    model.unload()


def test_inputs_are_converted_and_checked(rt):
    model = rt.load(add_neff())
    # float64 and a strided view convert (as JAX would cast them); complex does not.
    x = np.arange(8, dtype=np.float64)[::2]
    np.testing.assert_array_equal(model(x, np.ones(4, np.float32)), [1, 3, 5, 7])
    with pytest.raises(ValueError, match=r"input0 \(x\) is f32\[4\], got an array of shape \[3\]"):
        model(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="takes 2 inputs, got 1"):
        model(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="input1 \\(y\\) is f32, got complex128"):
        model(np.zeros(4, np.float32), np.zeros(4, np.complex128))
    model.unload()


def test_the_native_api_refuses_shared_and_object_arrays(rt):
    model = rt.load(add_neff())
    x = np.ones(4, np.float32)
    with pytest.raises(neuron_virt.NrtError, match="share memory"):
        model._native.execute([x, np.ones(4, np.float32)], [x])
    with pytest.raises(neuron_virt.NrtError, match="not the model's 4-byte elements"):
        model._native.execute([x, x], [np.empty(2, np.float64)])
    with pytest.raises(neuron_virt.NrtError, match="not the model's 4-byte elements"):
        model._native.execute([x, x], [np.empty(2, object)])
    model.unload()


def test_runtime_errors_carry_the_status(rt):
    model = rt.load(add_neff())
    model.unload()
    with pytest.raises(neuron_virt.NrtError) as caught:
        model(np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert caught.value.status == "NRT_INVALID_HANDLE" and caught.value.code == 3
    with pytest.raises(neuron_virt.NrtError) as caught:
        rt.load(add_neff(), core=99)
    assert caught.value.code == 2
    with pytest.raises(neuron_virt.NrtError) as caught:
        neuron_virt.Neff.from_bytes(b"not a neff")
    assert caught.value.status == "NRT_INVALID"
    # The runtime goes on after a failure.
    model = rt.load(add_neff())
    np.testing.assert_array_equal(model(np.ones(4), np.ones(4)), [2, 2, 2, 2])
    model.unload()


def test_compile_errors_name_the_operator_and_line():
    hlo = "HloModule bad\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  ROOT y = f32[4]{0} frobnicate(x)\n}\n"
    with pytest.raises(neuron_virt.CompileError, match="frobnicate") as caught:
        neuron_virt.compile(hlo)
    assert "line 5" in str(caught.value) or ":5" in str(caught.value), str(caught.value)
    with pytest.raises(neuron_virt.NrtError, match="auto_cast"):
        neuron_virt.compile(hlo, auto_cast="sometimes")


def test_the_tools_see_this_process_tagged(rt):
    binary = os.environ.get("NEURON_LS")
    if not binary:
        pytest.skip("NEURON_LS (the neuron-ls binary) is not set")
    listed = json.loads(subprocess.run([binary, "--json-output"], check=True, capture_output=True, text=True).stdout)
    text = json.dumps(listed)
    assert f"pytest-{os.getpid()}" in text and str(os.getpid()) in text, text


def test_dtypes_map_to_numpy():
    assert numpy_dtype("f32") == np.float32 and numpy_dtype("pred") == np.bool_ and numpy_dtype("u16") == np.uint16
