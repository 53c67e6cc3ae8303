//! The host arrays a program's buffers hold ([`Value`], and [`ValueRef`] when borrowed:
//! an intermediate, a constant, or an input read in place from its tensor), and how they
//! come in ([`Input`]), go out ([`Destination`], [`Output`]) and meet the other ranks
//! ([`CollectiveStep`]).

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::element::{Element, with_element};
use super::kernels;
use crate::dtype::{ArrayType, DType};
use crate::error::NrtError;
use crate::isa::CollectiveOp;

/// A host array of one of the element types.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    F32(ArrayD<f32>),
    S32(ArrayD<i32>),
    Pred(ArrayD<bool>),
    S8(ArrayD<i8>),
    S16(ArrayD<i16>),
    S64(ArrayD<i64>),
    U8(ArrayD<u8>),
    U16(ArrayD<u16>),
    U32(ArrayD<u32>),
    U64(ArrayD<u64>),
    F16(ArrayD<half::f16>),
    BF16(ArrayD<half::bf16>),
}

/// Applies `$f` to the array inside a `Value` or `ValueRef`, whatever its type.
macro_rules! each_variant {
    ($enum:ident, $value:expr, $a:ident => $body:expr) => {
        match $value {
            $enum::F32($a) => $body,
            $enum::S32($a) => $body,
            $enum::Pred($a) => $body,
            $enum::S8($a) => $body,
            $enum::S16($a) => $body,
            $enum::S64($a) => $body,
            $enum::U8($a) => $body,
            $enum::U16($a) => $body,
            $enum::U32($a) => $body,
            $enum::U64($a) => $body,
            $enum::F16($a) => $body,
            $enum::BF16($a) => $body,
        }
    };
}

impl Value {
    /// Decodes little-endian bytes (exactly `ty.size_bytes()` of them) into a value.
    pub(crate) fn from_le_bytes(ty: &ArrayType, bytes: &[u8]) -> Value {
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        with_element!(ty.dtype, T => {
            // Callers pass exactly the bytes of `ty`: bindings and constants are size-checked.
            let array = ArrayD::from_shape_vec(dims, T::decode_le(bytes))
                .unwrap_or_else(|_| unreachable!("{} bytes do not hold a {ty}", bytes.len()));
            T::wrap(array)
        })
    }

    /// A value of type `ty` whose little-endian bytes `fill` writes, all of them: in the
    /// value's own memory where the host's layout allows (no copy), else decoded from a
    /// buffer. `fill`'s result comes beside the value.
    pub(crate) fn filled_le<R>(ty: &ArrayType, fill: impl FnOnce(&mut [u8]) -> R) -> (Value, R) {
        let dims = kernels::to_usize(&ty.dims);
        with_element!(ty.dtype, T => {
            let mut elements = vec![T::default(); dims.iter().product()];
            match T::bytes_le_mut(&mut elements) {
                Some(bytes) => {
                    let result = fill(bytes);
                    let array = ArrayD::from_shape_vec(IxDyn(&dims), elements)
                        .unwrap_or_else(|_| unreachable!("as many elements as the shape"));
                    (T::wrap(array), result)
                }
                None => {
                    let mut bytes = vec![0; ty.size_bytes().unwrap_or(0) as usize];
                    let result = fill(&mut bytes);
                    (Value::from_le_bytes(ty, &bytes), result)
                }
            }
        })
    }

    /// A zero-filled value of type `ty`.
    pub(crate) fn zeros(ty: &ArrayType) -> Value {
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        with_element!(ty.dtype, T => T::wrap(ArrayD::from_elem(dims, T::default())))
    }

    /// Writes the value's elements, row-major and little-endian, into `out`.
    pub(crate) fn write_le_bytes(&self, out: &mut [u8]) {
        self.view().write_le_bytes(out)
    }

    /// The same elements in row-major order with new dimensions (as many elements);
    /// no copy when the array is in standard layout.
    pub(super) fn reshaped(self, dims: &[usize]) -> Value {
        fn reshape<T: Element>(a: ArrayD<T>, dims: &[usize]) -> Value {
            let a = if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned() };
            T::wrap(a.into_shape_with_order(IxDyn(dims)).unwrap_or_else(|_| kernels::unvalidated("reshape")))
        }
        each_variant!(Value, self, a => reshape(a, dims))
    }

    /// A borrowed view of the value.
    pub(crate) fn view(&self) -> ValueRef<'_> {
        fn view<T: Element>(a: &ArrayD<T>) -> ValueRef<'_> {
            T::wrap_view(a.view())
        }
        each_variant!(Value, self, a => view(a))
    }
}

/// A borrowed array: an intermediate, a constant, or an input read in place from its
/// tensor's memory.
#[derive(Debug, Clone)]
pub(crate) enum ValueRef<'a> {
    F32(ArrayViewD<'a, f32>),
    S32(ArrayViewD<'a, i32>),
    Pred(ArrayViewD<'a, bool>),
    S8(ArrayViewD<'a, i8>),
    S16(ArrayViewD<'a, i16>),
    S64(ArrayViewD<'a, i64>),
    U8(ArrayViewD<'a, u8>),
    U16(ArrayViewD<'a, u16>),
    U32(ArrayViewD<'a, u32>),
    U64(ArrayViewD<'a, u64>),
    F16(ArrayViewD<'a, half::f16>),
    BF16(ArrayViewD<'a, half::bf16>),
}

impl<'a> ValueRef<'a> {
    /// Views little-endian tensor bytes in place when the host is little-endian and
    /// the bytes are aligned for the element type; `None` when a copy is needed.
    pub(crate) fn from_le_bytes(ty: &ArrayType, bytes: &'a [u8]) -> Option<ValueRef<'a>> {
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        with_element!(ty.dtype, T => ArrayViewD::from_shape(dims, T::view_le(bytes)?).ok().map(T::wrap_view))
    }

    pub(crate) fn dtype(&self) -> DType {
        fn dtype<T: Element>(_: &ArrayViewD<'_, T>) -> DType {
            T::DTYPE
        }
        each_variant!(ValueRef, self, a => dtype(a))
    }

    pub(crate) fn shape(&self) -> &[usize] {
        each_variant!(ValueRef, self, a => a.shape())
    }

    /// Writes the elements, row-major and little-endian, into `out`.
    pub(crate) fn write_le_bytes(&self, out: &mut [u8]) {
        fn write<T: Element>(a: &ArrayViewD<'_, T>, out: &mut [u8]) {
            match a.as_slice() {
                Some(slice) => T::encode_le(slice.iter(), out),
                None => T::encode_le(a.iter(), out),
            }
        }
        each_variant!(ValueRef, self, a => write(a, out))
    }

    /// The same view, borrowed for a shorter time.
    pub(crate) fn view(&self) -> ValueRef<'_> {
        fn view<'v, T: Element>(a: &'v ArrayViewD<'_, T>) -> ValueRef<'v> {
            T::wrap_view(a.view())
        }
        each_variant!(ValueRef, self, a => view(a))
    }

    /// Number of NaN or infinite elements (zero for integer types).
    pub(crate) fn non_finite_count(&self) -> u64 {
        // Every f32 output is counted after every execution: vectorised.
        if let ValueRef::F32(a) = self
            && let Some(slice) = a.as_slice()
        {
            return kernels::non_finite_f32(slice);
        }
        fn count<T: Element>(a: &ArrayViewD<'_, T>) -> u64 {
            if !T::DTYPE.is_float() {
                return 0;
            }
            match a.as_slice() {
                Some(slice) => slice.iter().filter(|x| !x.is_finite()).count() as u64,
                None => a.iter().filter(|x| !x.is_finite()).count() as u64,
            }
        }
        each_variant!(ValueRef, self, a => count(a))
    }

    pub(crate) fn to_owned(&self) -> Value {
        fn owned<T: Element>(a: &ArrayViewD<'_, T>) -> Value {
            T::wrap(a.to_owned())
        }
        each_variant!(ValueRef, self, a => owned(a))
    }
}

/// A program input: read in place from tensor memory, or decoded into a copy.
#[derive(Debug)]
pub(crate) enum Input<'a> {
    InPlace(ValueRef<'a>),
    Copied(Value),
}

/// Output tensor memory that an `f32` result is computed straight into. Outputs of
/// other types are computed into the scratchpad and copied out after the run.
#[derive(Debug)]
pub(crate) struct Destination<'a>(pub(super) &'a mut [f32]);

impl<'a> Destination<'a> {
    /// Views output tensor bytes as `f32` elements, when the output is `f32` and the
    /// bytes are aligned for them on a little-endian host.
    pub(crate) fn from_le_bytes(dtype: DType, bytes: &'a mut [u8]) -> Option<Destination<'a>> {
        if cfg!(target_endian = "big") || dtype != DType::F32 {
            return None;
        }
        bytemuck::try_cast_slice_mut(bytes).ok().map(Destination)
    }

    /// Has `fill` write all the little-endian bytes of a value of type `ty` (`f32`, as
    /// many elements as the destination holds) here; the view reads them back.
    pub(crate) fn fill_le<R>(self, ty: &ArrayType, fill: impl FnOnce(&mut [u8]) -> R) -> (ValueRef<'a>, R) {
        let words = self.0;
        let result = fill(bytemuck::cast_slice_mut(&mut *words));
        let words: &'a [f32] = words;
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        (ValueRef::F32(ArrayViewD::from_shape(dims, words).unwrap_or_else(|_| kernels::unvalidated("output"))), result)
    }
}

/// One output of a run: already in its tensor, or a value still to be copied there.
#[derive(Debug)]
pub(crate) enum Output<'a> {
    /// Written in place; the view reads it back.
    Written(ValueRef<'a>),
    Value(Value),
}

#[cfg(test)]
impl Output<'_> {
    /// The output's elements, row-major and little-endian.
    pub(crate) fn le_bytes(&self) -> Vec<u8> {
        let view = match self {
            Output::Written(view) => view.view(),
            Output::Value(value) => value.view(),
        };
        let mut bytes = vec![0u8; view.shape().iter().product::<usize>() * view.dtype().size_bytes() as usize];
        view.write_le_bytes(&mut bytes);
        bytes
    }
}

/// One collective of a program, as the run hands it to the runtime.
#[derive(Debug)]
pub(crate) struct CollectiveStep<'s, 'a> {
    /// Its index among the program's collectives, in execution order.
    pub(crate) index: u32,
    pub(crate) op: &'s CollectiveOp,
    /// The rank's operand.
    pub(crate) operand: ValueRef<'s>,
    /// The program input the operand is, when it is one read in place from its tensor.
    pub(crate) input: Option<usize>,
    pub(crate) out: &'s ArrayType,
    /// When the result is program output `k`, and that output's tensor memory takes it
    /// in place: `k` and the memory.
    pub(crate) destination: Option<(usize, Destination<'a>)>,
}

/// Runs a program's collectives: returns this rank's result, written into the step's
/// destination or as a value.
pub(crate) type CollectiveRunner<'r, 'a> = dyn FnMut(CollectiveStep<'_, 'a>) -> Result<Output<'a>, NrtError> + 'r;
