//! Element types and array types shared by the HLO importer, the NEFF format and the backend.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element types the runtime executes.
///
/// The variant order is part of the NEFF encoding: new types are appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum DType {
    F32,
    S32,
    Pred,
    S8,
    S16,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    /// bfloat16: the upper half of an f32 (8-bit exponent, 7-bit mantissa).
    BF16,
}

/// How the bits of an element are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DTypeClass {
    Pred,
    Signed,
    Unsigned,
    Float,
}

impl DType {
    /// Every element type, in HLO's usual order.
    pub const ALL: [DType; 12] = [
        DType::Pred,
        DType::S8,
        DType::S16,
        DType::S32,
        DType::S64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];

    /// Bytes per element as stored in tensors (`pred` is one byte, 0 or 1).
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::Pred | DType::S8 | DType::U8 => 1,
            DType::S16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::S32 | DType::U32 => 4,
            DType::S64 | DType::U64 => 8,
        }
    }

    pub fn class(self) -> DTypeClass {
        match self {
            DType::Pred => DTypeClass::Pred,
            DType::S8 | DType::S16 | DType::S32 | DType::S64 => DTypeClass::Signed,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => DTypeClass::Unsigned,
            DType::F16 | DType::BF16 | DType::F32 => DTypeClass::Float,
        }
    }

    pub fn is_float(self) -> bool {
        self.class() == DTypeClass::Float
    }

    /// Signed or unsigned integers (not `pred`).
    pub fn is_integer(self) -> bool {
        matches!(self.class(), DTypeClass::Signed | DTypeClass::Unsigned)
    }

    /// The HLO spelling: `f32`, `s32`, `pred`, `bf16`, ...
    pub fn hlo_name(self) -> &'static str {
        self.into()
    }

    pub fn from_hlo_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.hlo_name() == name)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_have_their_hlo_names() {
        let names: Vec<&str> = DType::ALL.iter().map(|t| t.hlo_name()).collect();
        assert_eq!(names, ["pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32"]);
        assert_eq!(DType::from_hlo_name("bf16"), Some(DType::BF16));
    }
}
