//! Element types and array types shared by the HLO importer, the NEFF format and the backend.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element types the runtime executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    S32,
    Pred,
}

impl DType {
    /// Bytes per element as stored in tensors (`pred` is one byte, 0 or 1).
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::S32 => 4,
            DType::Pred => 1,
        }
    }

    /// The HLO spelling: `f32`, `s32`, `pred`.
    pub fn hlo_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::S32 => "s32",
            DType::Pred => "pred",
        }
    }

    pub fn from_hlo_name(name: &str) -> Option<DType> {
        match name {
            "f32" => Some(DType::F32),
            "s32" => Some(DType::S32),
            "pred" => Some(DType::Pred),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hlo_name())
    }
}

/// The type of a dense array: element type and dimensions (row-major).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArrayType {
    pub dtype: DType,
    pub dims: Vec<u64>,
}

impl ArrayType {
    pub fn new(dtype: DType, dims: Vec<u64>) -> Self {
        ArrayType { dtype, dims }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements, or `None` if it overflows `u64`.
    pub fn element_count(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Whether arrays of this type can be indexed on this host: the product of the
    /// non-zero dimensions (what strides span, even when another dimension is zero)
    /// must fit in `isize`.
    pub fn is_addressable(&self) -> bool {
        self.dims.iter().try_fold(1isize, |acc, &d| acc.checked_mul(isize::try_from(d.max(1)).ok()?)).is_some()
    }

    /// Size in bytes, or `None` if it overflows `u64`.
    pub fn size_bytes(&self) -> Option<u64> {
        self.element_count()?.checked_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for ArrayType {
    /// Formats as HLO does: `f32[8,32]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(u64::to_string).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(","))
    }
}
