//! The Rust type behind each element type, the arithmetic HLO defines on it, and
//! dispatch from a runtime [`DType`] to generic code.
//!
//! `f16` and `bf16` compute through `f32`: each operation widens its operands, computes
//! in single precision and rounds the result to nearest even, as XLA's CPU backend
//! does. Integers wrap; the corner cases HLO defines (division by zero, shifts past
//! the bit width, negative exponents) follow XLA.

use std::cmp::Ordering;

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD};

use super::{Value, ValueRef};
use crate::dtype::DType;

/// A host element type.
pub(crate) trait Element:
    Copy + Default + PartialEq + PartialOrd + Send + Sync + std::fmt::Debug + 'static
{
    const DTYPE: DType;

    fn wrap(a: ArrayD<Self>) -> Value;
    fn wrap_view(a: ArrayViewD<'_, Self>) -> ValueRef<'_>;
    fn unwrap<'v, 'a>(v: &'v ValueRef<'a>) -> Option<&'v ArrayViewD<'a, Self>>;

    /// Elements read in place from little-endian bytes, when the host allows it.
    fn view_le(bytes: &[u8]) -> Option<&[Self]>;
    /// Elements decoded from little-endian bytes (exactly a whole number of them).
    fn decode_le(bytes: &[u8]) -> Vec<Self>;
    /// The elements' memory as little-endian bytes to write, when the host allows it.
    fn bytes_le_mut(elements: &mut [Self]) -> Option<&mut [u8]>;
    /// Writes elements as little-endian bytes.
    fn encode_le<'e>(elements: impl Iterator<Item = &'e Self>, out: &mut [u8]);

    /// The value as HLO `convert` reads it: floats widen exactly, integers and
    /// predicates keep their value (`to_i64` wraps unsigned values past `i64::MAX`).
    fn to_f32(self) -> f32;
    fn to_i64(self) -> i64;
    fn to_u64(self) -> u64;
    /// The value as HLO `convert` writes it: floats round to nearest even, floats
    /// become integers by truncation toward zero, saturating (NaN becomes 0),
    /// integers wrap, and anything non-zero becomes `true`.
    fn from_f32(x: f32) -> Self;
    fn from_i64(x: i64) -> Self;
    fn from_u64(x: u64) -> Self;

    /// A total order: IEEE `totalOrder` for floats, the natural order otherwise.
    fn total_cmp(&self, other: &Self) -> Ordering;
    fn is_finite(self) -> bool {
        true
    }
}

/// Converts between element types as HLO `convert` does.
pub(crate) fn cast<S: Element, D: Element>(x: S) -> D {
    match S::DTYPE.class() {
        crate::dtype::DTypeClass::Float => D::from_f32(x.to_f32()),
        crate::dtype::DTypeClass::Unsigned => D::from_u64(x.to_u64()),
        crate::dtype::DTypeClass::Signed | crate::dtype::DTypeClass::Pred => D::from_i64(x.to_i64()),
    }
}

fn view_pod<T: bytemuck::Pod>(bytes: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    bytemuck::try_cast_slice(bytes).ok()
}

fn decode_pod<T: bytemuck::Pod + Default>(bytes: &[u8]) -> Vec<T> {
    let size = size_of::<T>();
    let mut out = vec![T::default(); bytes.len() / size];
    let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    raw.copy_from_slice(&bytes[..raw.len()]);
    if cfg!(target_endian = "big") {
        raw.chunks_exact_mut(size).for_each(<[u8]>::reverse);
    }
    out
}

fn encode_pod<'e, T: bytemuck::Pod>(elements: impl Iterator<Item = &'e T>, out: &mut [u8]) {
    let size = size_of::<T>();
    for (chunk, x) in out.chunks_exact_mut(size).zip(elements) {
        chunk.copy_from_slice(bytemuck::bytes_of(x));
        if cfg!(target_endian = "big") {
            chunk.reverse();
        }
    }
}

macro_rules! value_variant {
    ($t:ty, $variant:ident) => {
        const DTYPE: DType = DType::$variant;

        fn wrap(a: ArrayD<$t>) -> Value {
            Value::$variant(a)
        }

        fn wrap_view(a: ArrayViewD<'_, $t>) -> ValueRef<'_> {
            ValueRef::$variant(a)
        }

        fn unwrap<'v, 'a>(v: &'v ValueRef<'a>) -> Option<&'v ArrayViewD<'a, $t>> {
            match v {
                ValueRef::$variant(a) => Some(a),
                _ => None,
            }
        }
    };
}

macro_rules! pod_bytes {
    ($t:ty) => {
        fn view_le(bytes: &[u8]) -> Option<&[$t]> {
            view_pod(bytes)
        }

        fn decode_le(bytes: &[u8]) -> Vec<$t> {
            decode_pod(bytes)
        }

        fn bytes_le_mut(elements: &mut [$t]) -> Option<&mut [u8]> {
            cfg!(target_endian = "little").then(|| bytemuck::cast_slice_mut(elements))
        }

        fn encode_le<'e>(elements: impl Iterator<Item = &'e $t>, out: &mut [u8]) {
            encode_pod(elements, out)
        }
    };
}

macro_rules! integer_element {
    ($($t:ty => $variant:ident),*) => {$(
        impl Element for $t {
            value_variant!($t, $variant);
            pod_bytes!($t);

            fn to_f32(self) -> f32 {
                self as f32
            }

            fn to_i64(self) -> i64 {
                self as i64
            }

            fn to_u64(self) -> u64 {
                self as u64
            }

            fn from_f32(x: f32) -> $t {
                x as $t
            }

            fn from_i64(x: i64) -> $t {
                x as $t
            }

            fn from_u64(x: u64) -> $t {
                x as $t
            }

            fn total_cmp(&self, other: &$t) -> Ordering {
                self.cmp(other)
            }
        }
    )*};
}

integer_element!(i8 => S8, i16 => S16, i32 => S32, i64 => S64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

impl Element for f32 {
    value_variant!(f32, F32);
    pod_bytes!(f32);

    fn to_f32(self) -> f32 {
        self
    }

    fn to_i64(self) -> i64 {
        self as i64
    }

    fn to_u64(self) -> u64 {
        self as u64
    }

    fn from_f32(x: f32) -> f32 {
        x
    }

    fn from_i64(x: i64) -> f32 {
        x as f32
    }

    fn from_u64(x: u64) -> f32 {
        x as f32
    }

    fn total_cmp(&self, other: &f32) -> Ordering {
        f32::total_cmp(self, other)
    }

    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

macro_rules! half_element {
    ($($t:ty => $variant:ident),*) => {$(
        impl Element for $t {
            value_variant!($t, $variant);
            pod_bytes!($t);

            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }

            fn to_i64(self) -> i64 {
                <$t>::to_f32(self) as i64
            }

            fn to_u64(self) -> u64 {
                <$t>::to_f32(self) as u64
            }

            fn from_f32(x: f32) -> $t {
                <$t>::from_f32(x)
            }

            // Through f64, which holds every integer up to 2^53 exactly, so that the
            // one rounding that matters is the last.
            fn from_i64(x: i64) -> $t {
                <$t>::from_f64(x as f64)
            }

            fn from_u64(x: u64) -> $t {
                <$t>::from_f64(x as f64)
            }

            fn total_cmp(&self, other: &$t) -> Ordering {
                <$t>::total_cmp(self, other)
            }

            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
        }
    )*};
}

half_element!(f16 => F16, bf16 => BF16);

impl Element for bool {
    value_variant!(bool, Pred);

    // Bytes other than 0 and 1 are valid `pred` tensor contents but not valid `bool`s.
    fn view_le(_: &[u8]) -> Option<&[bool]> {
        None
    }

    fn bytes_le_mut(_: &mut [bool]) -> Option<&mut [u8]> {
        None
    }

    fn decode_le(bytes: &[u8]) -> Vec<bool> {
        bytes.iter().map(|&b| b != 0).collect()
    }

    fn encode_le<'e>(elements: impl Iterator<Item = &'e bool>, out: &mut [u8]) {
        for (byte, &x) in out.iter_mut().zip(elements) {
            *byte = u8::from(x);
        }
    }

    fn to_f32(self) -> f32 {
        f32::from(u8::from(self))
    }

    fn to_i64(self) -> i64 {
        i64::from(self)
    }

    fn to_u64(self) -> u64 {
        u64::from(self)
    }

    fn from_f32(x: f32) -> bool {
        x != 0.0
    }

    fn from_i64(x: i64) -> bool {
        x != 0
    }

    fn from_u64(x: u64) -> bool {
        x != 0
    }

    fn total_cmp(&self, other: &bool) -> Ordering {
        self.cmp(other)
    }
}

/// Integer arithmetic with HLO's semantics: wrapping, with XLA's answers where Rust's
/// operators would panic.
pub(crate) trait Int: Element + Ord {
    const SIGNED: bool;
    const ZERO: Self;
    const ONE: Self;

    fn add(self, y: Self) -> Self;
    fn sub(self, y: Self) -> Self;
    fn mul(self, y: Self) -> Self;
    /// `x / 0` is all ones (-1 when signed); `MIN / -1` is `MIN`.
    fn div(self, y: Self) -> Self;
    /// `x % 0` is `x`; `MIN % -1` is 0.
    fn rem(self, y: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn signum(self) -> Self;
    fn not(self) -> Self;
    fn count_ones(self) -> Self;
    fn leading_zeros(self) -> Self;
    fn and(self, y: Self) -> Self;
    fn or(self, y: Self) -> Self;
    fn xor(self, y: Self) -> Self;
    /// Shift amounts are read as unsigned; from the bit width up every bit is shifted
    /// out (an arithmetic right shift leaves copies of the sign bit).
    fn shl(self, y: Self) -> Self;
    fn shr_logical(self, y: Self) -> Self;
    fn shr_arithmetic(self, y: Self) -> Self;

    /// Wrapping power; a negative exponent gives 0, except for bases 1 and -1.
    fn pow(self, y: Self) -> Self {
        if Self::SIGNED && y < Self::ZERO {
            return match self.to_i64() {
                1 => Self::ONE,
                -1 if y.and(Self::ONE) == Self::ZERO => Self::ONE,
                -1 => self,
                _ => Self::ZERO,
            };
        }
        let (mut base, mut exponent, mut acc) = (self, y.to_u64(), Self::ONE);
        while exponent > 0 {
            if exponent & 1 == 1 {
                acc = acc.mul(base);
            }
            base = base.mul(base);
            exponent >>= 1;
        }
        acc
    }
}

macro_rules! int_arithmetic {
    ($($t:ty: $unsigned:ty, $signed:ty);*) => {$(
        impl Int for $t {
            const SIGNED: bool = <$t>::MIN != 0;
            const ZERO: $t = 0;
            const ONE: $t = 1;

            fn add(self, y: $t) -> $t {
                self.wrapping_add(y)
            }

            fn sub(self, y: $t) -> $t {
                self.wrapping_sub(y)
            }

            fn mul(self, y: $t) -> $t {
                self.wrapping_mul(y)
            }

            fn div(self, y: $t) -> $t {
                if y == 0 { !0 } else { self.wrapping_div(y) }
            }

            fn rem(self, y: $t) -> $t {
                if y == 0 { self } else { self.wrapping_rem(y) }
            }

            fn neg(self) -> $t {
                self.wrapping_neg()
            }

            fn abs(self) -> $t {
                if Self::SIGNED { (self as $signed).wrapping_abs() as $t } else { self }
            }

            fn signum(self) -> $t {
                if Self::SIGNED { (self as $signed).signum() as $t } else { self.min(1) }
            }

            fn not(self) -> $t {
                !self
            }

            fn count_ones(self) -> $t {
                self.count_ones() as $t
            }

            fn leading_zeros(self) -> $t {
                self.leading_zeros() as $t
            }

            fn and(self, y: $t) -> $t {
                self & y
            }

            fn or(self, y: $t) -> $t {
                self | y
            }

            fn xor(self, y: $t) -> $t {
                self ^ y
            }

            fn shl(self, y: $t) -> $t {
                u32::try_from(y as $unsigned).ok().and_then(|n| self.checked_shl(n)).unwrap_or(0)
            }

            fn shr_logical(self, y: $t) -> $t {
                u32::try_from(y as $unsigned).ok().and_then(|n| (self as $unsigned).checked_shr(n)).unwrap_or(0) as $t
            }

            fn shr_arithmetic(self, y: $t) -> $t {
                let n = u32::try_from(y as $unsigned).map_or(<$t>::BITS - 1, |n| n.min(<$t>::BITS - 1));
                ((self as $signed) >> n) as $t
            }
        }
    )*};
}

int_arithmetic!(
    i8: u8, i8; i16: u16, i16; i32: u32, i32; i64: u64, i64;
    u8: u8, i8; u16: u16, i16; u32: u32, i32; u64: u64, i64
);

/// Matches `$dtype` against the listed element types, running `$body` with `$T` bound
/// to the listed host type; any other type runs `$other`.
macro_rules! dispatch_types {
    ($dtype:expr, $T:ident => $body:expr, $other:expr; $($variant:ident: $host:ty),+) => {{
        #[allow(unreachable_patterns)]
        let result = match $dtype {
            $($crate::dtype::DType::$variant => {
                type $T = $host;
                $body
            })+
            _ => $other,
        };
        result
    }};
}

/// Runs `$body` with `$T` bound to the host type of `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::backend::element::dispatch_types!($dtype, $T => $body, unreachable!("every element type is listed");
            Pred: bool, S8: i8, S16: i16, S32: i32, S64: i64, U8: u8, U16: u16, U32: u32, U64: u64,
            F16: half::f16, BF16: half::bf16, F32: f32)
    };
}

/// Runs `$body` with `$T` bound to the host type of integer `$dtype`, or `$other`.
macro_rules! with_int {
    ($dtype:expr, $T:ident => $body:expr, $other:expr) => {
        $crate::backend::element::dispatch_types!($dtype, $T => $body, $other;
            S8: i8, S16: i16, S32: i32, S64: i64, U8: u8, U16: u16, U32: u32, U64: u64)
    };
}

/// Runs `$body` with `$T` bound to the host type of floating-point `$dtype`, or `$other`.
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr, $other:expr) => {
        $crate::backend::element::dispatch_types!($dtype, $T => $body, $other; F16: half::f16, BF16: half::bf16, F32: f32)
    };
}

pub(crate) use {dispatch_types, with_element, with_float, with_int};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_follow_hlo_convert() {
        assert_eq!(cast::<f32, i8>(300.7), 127);
        assert_eq!(cast::<f32, u8>(-3.0), 0);
        assert_eq!(cast::<f32, i32>(f32::NAN), 0);
        assert_eq!(cast::<f32, i64>(-2.9), -2);
        assert_eq!(cast::<i32, u8>(-1), 255);
        assert_eq!(cast::<u64, i64>(u64::MAX), -1);
        assert_eq!(cast::<u64, f32>(u64::MAX), 18_446_744_073_709_551_616.0);
        assert_eq!(cast::<f32, bf16>(1.0 + 1.0 / 256.0), bf16::from_f32(1.0));
        assert_eq!(cast::<f32, bf16>(1.0 + 3.0 / 256.0), bf16::from_f32(1.0 + 4.0 / 256.0));
        assert_eq!(cast::<f16, bf16>(f16::from_f32(65504.0)), bf16::from_f32(65536.0));
        assert_eq!(cast::<i64, f16>(70_000), f16::INFINITY);
        assert!(cast::<f32, bool>(f32::NAN));
        assert_eq!(cast::<bool, f16>(true), f16::ONE);
    }

    #[test]
    fn integer_corner_cases_follow_xla() {
        assert_eq!(Int::div(7i8, 0), -1);
        assert_eq!(Int::div(7u16, 0), u16::MAX);
        assert_eq!(Int::div(i64::MIN, -1), i64::MIN);
        assert_eq!(Int::rem(7u8, 0), 7);
        assert_eq!(Int::rem(i32::MIN, -1), 0);
        assert_eq!(Int::pow(3u8, 5), 243);
        assert_eq!(Int::pow(3i8, 5), -13);
        assert_eq!(Int::pow(-1i16, -3), -1);
        assert_eq!(Int::pow(2i32, -1), 0);
        assert_eq!(Int::pow(2u64, u64::MAX), 0);
        assert_eq!(Int::shl(1u8, 8), 0);
        assert_eq!(Int::shr_arithmetic(0x80u8, 3), 0xF0);
        assert_eq!(Int::shr_logical(-8i64, 60), 0xF);
        assert_eq!(Int::shr_arithmetic(-8i32, -1), -1);
        assert_eq!(Int::abs(200u8), 200);
        assert_eq!(Int::abs(i16::MIN), i16::MIN);
        assert_eq!(Int::signum(9u32), 1);
    }
}
