"""Every element type goes in and comes out as its NumPy dtype (bf16 as
ml_dtypes.bfloat16), with the values the program computes."""

import numpy as np
import pytest

import neuron_virt
from neuron_virt._dtypes import numpy_dtype

CASES = [
    ("f32", "add", [1.5, -2.0, 3.25]),
    ("f16", "add", [1.5, -2.0, 3.25]),
    ("bf16", "add", [1.5, -2.0, 3.25]),
    ("s8", "add", [1, -2, 60]),
    ("s16", "add", [1, -2, 3000]),
    ("s32", "add", [1, -2, 70000]),
    ("s64", "add", [1, -2, 1 << 40]),
    ("u8", "add", [1, 2, 100]),
    ("u16", "add", [1, 2, 30000]),
    ("u32", "add", [1, 2, 1 << 30]),
    ("u64", "add", [1, 2, 1 << 60]),
    ("pred", "or", [True, False, True]),
]


@pytest.mark.parametrize("dtype, op, values", CASES)
def test_element_types_round_trip(rt, dtype, op, values):
    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")
    hlo = f"HloModule {dtype}\n\nENTRY main {{\n  x = {dtype}[3]{{0}} parameter(0)\n  ROOT y = {dtype}[3]{{0}} {op}(x, x)\n}}\n"
    model = rt.load(neuron_virt.compile(hlo, name=dtype, auto_cast="none"))
    x = np.array(values, dtype=numpy_dtype(dtype))
    y = model(x)
    model.unload()
    assert y.dtype == numpy_dtype(dtype)
    expected = x if dtype == "pred" else (x.astype(np.float64) * 2).astype(numpy_dtype(dtype))
    np.testing.assert_array_equal(y, expected)
