//! `Convolution` as matrix products on the PE engine (im2col): for each group, the
//! input elements every output position sees through its window are laid out as one
//! row of a matrix (zeros where the window falls into padding or between the elements
//! of a dilated input), the kernel as a matrix of window positions by output features,
//! and one product per group gives every output element. The products are the same
//! batched GEMM as `dot`'s, split across idle compute slots when large.

use ndarray::{ArrayD, IxDyn};

use super::matrix::{Gemm, batched_matmul, converted, gemm_f32, gemm_int};
use super::{to_usize, unvalidated};
use crate::backend::element::{Element, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DTypeClass};
use crate::isa::{ConvDims, DotDims};
use crate::pool::HostPool;

/// The convolution of `lhs` by `rhs` into a value of type `out`. Floats multiply and
/// accumulate in f32 and round once to the output type; integers are converted to the
/// output type first and wrap.
pub(super) fn convolution(
    lhs: &ValueRef<'_>,
    rhs: &ValueRef<'_>,
    c: &ConvDims,
    out: &ArrayType,
    helpers: &HostPool,
) -> Value {
    let dims = to_usize(&out.dims);
    match lhs.dtype().class() {
        DTypeClass::Float => {
            let (l, r) = (converted::<f32>(lhs), converted::<f32>(rhs));
            let y = convolve(&l, &r, c, &dims, gemm_f32, helpers);
            with_float!(out.dtype, D => D::wrap(y.mapv(D::from_f32)), unvalidated("convolution"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(out.dtype, D => {
            let (l, r) = (converted::<D>(lhs), converted::<D>(rhs));
            D::wrap(convolve(&l, &r, c, &dims, gemm_int::<D>, helpers))
        }, unvalidated("convolution")),
        DTypeClass::Pred => unvalidated("convolution on pred"),
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Row-major positions of every index of `sizes`, each as the sum of `index[d] *
/// steps[d]`.
fn offsets(sizes: &[usize], steps: &[usize]) -> Vec<usize> {
    let mut all = vec![0usize];
    for (&n, &step) in sizes.iter().zip(steps) {
        all = all.iter().flat_map(|&base| (0..n).map(move |i| base + i * step)).collect();
    }
    all
}

fn convolve<T: Element + Send + Sync>(
    lhs: &ArrayD<T>,
    rhs: &ArrayD<T>,
    c: &ConvDims,
    out_dims: &[usize],
    gemm: Gemm<T>,
    helpers: &HostPool,
) -> ArrayD<T> {
    let (ls, rs) = (lhs.shape(), rhs.shape());
    let (lstride, rstride, ostride) = (strides(ls), strides(rs), strides(out_dims));
    let (lhs, rhs) = (
        lhs.as_slice().unwrap_or_else(|| unvalidated("convolution input layout")),
        rhs.as_slice().unwrap_or_else(|| unvalidated("convolution kernel layout")),
    );
    let at = |dims: &[u32], shape: &[usize]| -> Vec<usize> { dims.iter().map(|&d| shape[d as usize]).collect() };
    let (in_sizes, kernel_sizes, out_sizes) =
        (at(&c.lhs_spatial, ls), at(&c.rhs_spatial, rs), at(&c.out_spatial, out_dims));
    let inputs = rs[c.rhs_input as usize];
    let outputs = rs[c.rhs_output as usize];
    let batch = out_dims[c.out_batch as usize];
    let (groups, batch_groups) = (c.feature_groups as usize, c.batch_groups as usize);
    let parts = groups.max(batch_groups);
    let per_part = outputs / parts;
    let positions: usize = out_sizes.iter().product();
    let window: usize = kernel_sizes.iter().product();
    let (rows, depth) = (batch * positions, inputs * window);

    // Where each (output position, window position) reads in the input's spatial
    // dimensions, as an offset; `None` in padding or a hole of the dilation.
    let mut spatial: Vec<Option<usize>> = Vec::with_capacity(positions * window);
    for s in 0..positions {
        let s = unravel(s, &out_sizes);
        for k in 0..window {
            let k = unravel(k, &kernel_sizes);
            let mut offset = Some(0);
            for d in 0..s.len() {
                offset = offset.and_then(|o| {
                    let i = c.window.source(d, s[d], k[d], in_sizes[d])?;
                    Some(o + i * lstride[c.lhs_spatial[d] as usize])
                });
            }
            spatial.push(offset);
        }
    }

    let mut cols = vec![T::default(); parts * rows * depth];
    for p in 0..parts {
        for b in 0..batch {
            let lhs_batch = if batch_groups > 1 { p * batch + b } else { b };
            for s in 0..positions {
                let row = &mut cols[(p * rows + b * positions + s) * depth..][..depth];
                for i in 0..inputs {
                    let feature = if groups > 1 { p * inputs + i } else { i };
                    let base = lhs_batch * lstride[c.lhs_batch as usize] + feature * lstride[c.lhs_feature as usize];
                    for k in 0..window {
                        if let Some(o) = spatial[s * window + k] {
                            row[i * window + k] = lhs[base + o];
                        }
                    }
                }
            }
        }
    }
    let kernel_offsets =
        offsets(&kernel_sizes, &c.rhs_spatial.iter().map(|&d| rstride[d as usize]).collect::<Vec<_>>());
    let mut weights = vec![T::default(); parts * depth * per_part];
    for p in 0..parts {
        for i in 0..inputs {
            for (k, &ko) in kernel_offsets.iter().enumerate() {
                for o in 0..per_part {
                    let at =
                        i * rstride[c.rhs_input as usize] + (p * per_part + o) * rstride[c.rhs_output as usize] + ko;
                    weights[(p * depth + i * window + k) * per_part + o] = rhs[at];
                }
            }
        }
    }
    let cols = ArrayD::from_shape_vec(IxDyn(&[parts, rows, depth]), cols).unwrap_or_else(|_| unvalidated("im2col"));
    let weights =
        ArrayD::from_shape_vec(IxDyn(&[parts, depth, per_part]), weights).unwrap_or_else(|_| unvalidated("kernel"));
    let dims = DotDims { lhs_batch: vec![0], lhs_contracting: vec![2], rhs_batch: vec![0], rhs_contracting: vec![1] };
    let product = batched_matmul(&cols.view(), &weights.view(), &dims, &[parts, rows, per_part], gemm, helpers);
    let product = product.as_slice().unwrap_or_else(|| unvalidated("convolution product layout"));

    let out_spatial = offsets(&out_sizes, &c.out_spatial.iter().map(|&d| ostride[d as usize]).collect::<Vec<_>>());
    let mut out = vec![T::default(); out_dims.iter().product()];
    for p in 0..parts {
        for b in 0..batch {
            for (s, &so) in out_spatial.iter().enumerate() {
                let from = &product[(p * rows + b * positions + s) * per_part..][..per_part];
                for (o, &v) in from.iter().enumerate() {
                    let feature = p * per_part + o;
                    out[b * ostride[c.out_batch as usize] + feature * ostride[c.out_feature as usize] + so] = v;
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(out_dims), out).unwrap_or_else(|_| unvalidated("convolution"))
}

fn unravel(mut flat: usize, sizes: &[usize]) -> Vec<usize> {
    let mut index = vec![0; sizes.len()];
    for d in (0..sizes.len()).rev() {
        index[d] = flat % sizes[d].max(1);
        flat /= sizes[d].max(1);
    }
    index
}
