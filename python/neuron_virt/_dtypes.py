"""The element types of the runtime (HLO names) as NumPy dtypes."""

import numpy as np

try:  # bfloat16 arrays, when the package that defines them is installed
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_BY_HLO_NAME = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8),
    "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32),
    "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
}


def numpy_dtype(hlo_name):
    """The NumPy dtype of an HLO element type (``bf16`` needs ``ml_dtypes``)."""
    if hlo_name == "bf16":
        if _BF16 is None:
            raise TypeError("bf16 tensors need the ml_dtypes package: pip install ml_dtypes")
        return _BF16
    return _BY_HLO_NAME[hlo_name]
