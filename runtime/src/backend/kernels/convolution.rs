//! `Convolution` as matrix products on the PE engine (im2col): for each group, the
//! input elements every output position sees through its window are laid out as one
//! row of a matrix (zeros where the window falls into padding or between the elements
//! of a dilated input), the kernel as a matrix of window positions by output features,
//! and one product per group gives every output element. The products are the same
//! batched GEMM as `dot`'s, split across idle compute slots when large.
//!
//! The gradient of a stride-1 convolution by its kernel, whose window spans the whole
//! input, runs as one product per output position of the padded input, read in place
//! (`by_shifts`).
//!
//! A small f32 convolution with its features innermost (NHWC, by a kernel in any
//! layout: HWIO as JAX's CNNs write them, HWOI in their input gradients) runs as a
//! direct loop instead: each output position sums, window
//! position by window position and input feature by input feature, the input element
//! times the kernel's row of output features, a vector as wide as the outputs. Copying
//! the im2col rows took as long as the product on such shapes.

use std::borrow::Cow;

use ndarray::{ArrayD, IxDyn, ShapeBuilder};

use super::matrix::{Gemm, batched_matmul, converted, gemm_f32, gemm_int};
use super::{row_major_strides, to_usize, unvalidated};
use crate::backend::element::{Element, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
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
    let (ls, rs) = (lhs.shape().to_vec(), rhs.shape().to_vec());
    let y = |data: Vec<f32>| ArrayD::from_shape_vec(IxDyn(&dims), data).unwrap_or_else(|_| unvalidated("convolution"));
    match lhs.dtype().class() {
        DTypeClass::Float => {
            let (l, r) = (floats(lhs), floats(rhs));
            let data = direct(&l, &ls, &r, &rs, c, &dims, helpers)
                .or_else(|| by_shifts(&l, &ls, &r, &rs, c, &dims, helpers))
                .unwrap_or_else(|| convolve(&l, &ls, &r, &rs, c, &dims, gemm_f32, helpers));
            let result = y(data);
            match out.dtype {
                DType::F32 => Value::F32(result),
                _ => with_float!(out.dtype, D => D::wrap(result.mapv(D::from_f32)), unvalidated("convolution")),
            }
        }
        DTypeClass::Signed | DTypeClass::Unsigned => with_int!(out.dtype, D => {
            // Row-major copies in the output type (`iter` goes in logical order).
            let (l, r): (Vec<D>, Vec<D>) =
                (converted::<D>(lhs).iter().copied().collect(), converted::<D>(rhs).iter().copied().collect());
            let data = convolve(&l, &ls, &r, &rs, c, &dims, gemm_int::<D>, helpers);
            D::wrap(ArrayD::from_shape_vec(IxDyn(&dims), data).unwrap_or_else(|_| unvalidated("convolution")))
        }, unvalidated("convolution")),
        DTypeClass::Pred => unvalidated("convolution on pred"),
    }
}

/// A float operand's elements in row-major order as f32: in place when it is an f32
/// array in standard layout.
fn floats<'v>(v: &'v ValueRef<'_>) -> Cow<'v, [f32]> {
    match v {
        ValueRef::F32(a) => match a.as_slice() {
            Some(slice) => Cow::Borrowed(slice),
            None => Cow::Owned(a.iter().copied().collect()),
        },
        _ => Cow::Owned(converted::<f32>(v).iter().copied().collect()),
    }
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

/// The convolution of `lhs` (of shape `ls`) by `rhs` (of shape `rs`), row-major in
/// `out_dims`. The im2col rows hold, for each window position, the group's input
/// features side by side, so that an input whose features are its innermost dimension
/// (NHWC) is copied a run of features at a time.
#[allow(clippy::too_many_arguments)]
fn convolve<T: Element + Send + Sync>(
    lhs: &[T],
    ls: &[usize],
    rhs: &[T],
    rs: &[usize],
    c: &ConvDims,
    out_dims: &[usize],
    gemm: Gemm<T>,
    helpers: &HostPool,
) -> Vec<T> {
    let (lstride, rstride, ostride) = (row_major_strides(ls), row_major_strides(rs), row_major_strides(out_dims));
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
    let feature_stride = lstride[c.lhs_feature as usize];

    let spatial = window_sources(c, &lstride, &in_sizes, &kernel_sizes, &out_sizes);

    let mut cols: Vec<T> = Vec::with_capacity(parts * rows * depth);
    for p in 0..parts {
        let first_feature = if groups > 1 { p * inputs } else { 0 };
        for b in 0..batch {
            let lhs_batch = if batch_groups > 1 { p * batch + b } else { b };
            let base = lhs_batch * lstride[c.lhs_batch as usize] + first_feature * feature_stride;
            for s in 0..positions {
                for k in 0..window {
                    match spatial[s * window + k] {
                        Some(o) if feature_stride == 1 => cols.extend_from_slice(&lhs[base + o..][..inputs]),
                        Some(o) => cols.extend((0..inputs).map(|i| lhs[base + o + i * feature_stride])),
                        None => cols.extend(std::iter::repeat_n(T::default(), inputs)),
                    }
                }
            }
        }
    }
    let kernel_offsets =
        offsets(&kernel_sizes, &c.rhs_spatial.iter().map(|&d| rstride[d as usize]).collect::<Vec<_>>());
    let (in_stride, out_stride) = (rstride[c.rhs_input as usize], rstride[c.rhs_output as usize]);
    let mut weights: Vec<T> = Vec::with_capacity(parts * depth * per_part);
    for p in 0..parts {
        for &ko in &kernel_offsets {
            for i in 0..inputs {
                let start = ko + i * in_stride + p * per_part * out_stride;
                if out_stride == 1 {
                    weights.extend_from_slice(&rhs[start..][..per_part]);
                } else {
                    weights.extend((0..per_part).map(|o| rhs[start + o * out_stride]));
                }
            }
        }
    }
    let cols = ArrayD::from_shape_vec(IxDyn(&[parts, rows, depth]), cols).unwrap_or_else(|_| unvalidated("im2col"));
    let weights =
        ArrayD::from_shape_vec(IxDyn(&[parts, depth, per_part]), weights).unwrap_or_else(|_| unvalidated("kernel"));
    let dims = DotDims { lhs_batch: vec![0], lhs_contracting: vec![2], rhs_batch: vec![0], rhs_contracting: vec![1] };
    let product = batched_matmul(&cols.view(), &weights.view(), &dims, &[parts, rows, per_part], gemm, helpers);
    let product = product.into_raw_vec_and_offset().0;

    // In (batch, spatial..., feature) order with one group, the product is the output.
    let spatial_order: Vec<u32> = (1..=c.out_spatial.len() as u32).collect();
    if parts == 1 && c.out_batch == 0 && c.out_spatial == spatial_order && c.out_feature as usize == out_dims.len() - 1
    {
        return product;
    }
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
    out
}

/// A convolution whose window spans (nearly) its whole input, as the gradient of a
/// stride-1 convolution by its kernel is (`f01b_i01o->01bf`: the input's batch is the
/// forward pass's features, innermost; its features the forward batch): `out[oh, ow,
/// b, o] = Σ_{i, h, w} lhs[i, oh + h, ow + w, b] · rhs[i, h, w, o]` over the padded
/// input. im2col would copy the input once per output position, a gather of scattered
/// elements; here each output position `(oh, ow)` is one product of the padded input,
/// read in place from row `oh · Wp + ow` on as a matrix of `b` columns, by the kernel
/// padded to the input's width and height with zeros (so each product's rows line up):
/// no copy per position, and the products split across idle compute slots. `None` for
/// any other layout, strides or dilations, negative padding, or an input that is not
/// all finite (a zero of the padded kernel times an infinity would be NaN).
fn by_shifts(
    lhs: &[f32],
    ls: &[usize],
    rhs: &[f32],
    rs: &[usize],
    c: &ConvDims,
    out_dims: &[usize],
    helpers: &HostPool,
) -> Option<Vec<f32>> {
    let w = &c.window;
    let layout = ls.len() == 4
        && (c.lhs_feature, c.lhs_batch, c.lhs_spatial.as_slice()) == (0, 3, &[1, 2][..])
        && (c.rhs_input, c.rhs_output, c.rhs_spatial.as_slice()) == (0, 3, &[1, 2][..])
        && (c.out_batch, c.out_feature, c.out_spatial.as_slice()) == (2, 3, &[0, 1][..])
        && c.feature_groups == 1
        && c.batch_groups == 1;
    let plain = w.window.stride.iter().chain(&w.base_dilation).chain(&w.window_dilation).all(|&s| s == 1);
    if !layout || !plain || ls[0] != rs[0] || !lhs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let (n, h, wd, b) = (ls[0], ls[1], ls[2], ls[3]);
    let (kh, kw, o) = (rs[1], rs[2], rs[3]);
    let pad = |d: usize| (w.window.pad_low[d] as usize, w.window.pad_high[d] as usize);
    let ((top, bottom), (left, right)) = (pad(0), pad(1));
    let (hp, wp) = (h + top + bottom, wd + left + right);
    let (oh, ow) = (out_dims[0], out_dims[1]);
    if hp < kh || wp < kw || (hp - kh + 1, wp - kw + 1) != (oh, ow) || out_dims[2..] != [b, o] {
        return None;
    }
    // The padded input, rows of `b`, with rows of zeros after it for the last
    // products' reach past the kernel's padding.
    let rows = n * hp * wp;
    let reach = (oh - 1) * wp + ow - 1;
    let mut input = vec![0f32; (rows + reach) * b];
    for i in 0..n {
        for y in 0..h {
            let from = (i * h + y) * wd * b;
            let to = ((i * hp + y + top) * wp + left) * b;
            input[to..to + wd * b].copy_from_slice(&lhs[from..from + wd * b]);
        }
    }
    // The kernel padded with zeros to the input's height and width, rows of `o`.
    let mut kernel = vec![0f32; rows * o];
    for i in 0..n {
        for y in 0..kh {
            let from = ((i * kh + y) * kw) * o;
            let to = ((i * hp + y) * wp) * o;
            kernel[to..to + kw * o].copy_from_slice(&rhs[from..from + kw * o]);
        }
    }
    let kernel = ndarray::ArrayView2::from_shape((rows, o), &kernel).ok()?;
    let mut out = vec![0f32; oh * ow * b * o];
    let lent = helpers.lend(oh * ow - 1);
    let parts: Vec<(usize, &mut [f32])> = out.chunks_mut(b * o).enumerate().collect();
    let input = &input;
    lent.run(parts, |(position, part)| {
        let shift = (position / ow) * wp + position % ow;
        let Ok(a) = ndarray::ArrayView2::from_shape((b, rows).strides((1, b)), &input[shift * b..]) else {
            unvalidated("convolution")
        };
        let Ok(part) = ndarray::ArrayViewMut2::from_shape((b, o), part) else { unvalidated("convolution") };
        gemm_f32(a, kernel, part);
    });
    Some(out)
}

/// The most input features times window positions, and output features, of a
/// convolution that runs as a direct loop: beyond them the GEMM's blocking wins.
const DIRECT_MOST_DEPTH: usize = 1024;
const DIRECT_MOST_OUTPUTS: usize = 64;
/// Multiply-adds per part when a direct convolution is split across idle slots.
const DIRECT_PART_MACS: usize = 1 << 21;

/// Where each (output position, window position) reads in the input's spatial
/// dimensions, as an offset (`None` in padding or a hole of the dilation), row-major.
fn window_sources(
    c: &ConvDims,
    lstride: &[usize],
    in_sizes: &[usize],
    kernel_sizes: &[usize],
    out_sizes: &[usize],
) -> Vec<Option<usize>> {
    let (positions, window) = (out_sizes.iter().product::<usize>(), kernel_sizes.iter().product::<usize>());
    // Along each spatial dimension, where output index j reads at window index k.
    let along: Vec<Vec<Option<usize>>> = (0..out_sizes.len())
        .map(|d| {
            let step = lstride[c.lhs_spatial[d] as usize];
            (0..out_sizes[d])
                .flat_map(|j| (0..kernel_sizes[d]).map(move |k| (j, k)))
                .map(|(j, k)| c.window.source(d, j, k, in_sizes[d]).map(|i| i * step))
                .collect()
        })
        .collect();
    // Output and window indices counted up in row-major order.
    let (mut s, mut k) = (vec![0usize; out_sizes.len()], vec![0usize; kernel_sizes.len()]);
    let mut spatial = Vec::with_capacity(positions * window);
    for _ in 0..positions {
        k.fill(0);
        for _ in 0..window {
            let offset = (0..s.len()).try_fold(0, |o, d| along[d][s[d] * kernel_sizes[d] + k[d]].map(|i| o + i));
            spatial.push(offset);
            count_up(&mut k, kernel_sizes);
        }
        count_up(&mut s, out_sizes);
    }
    spatial
}

/// The row-major index after `index` in `sizes` (all zeros after the last).
fn count_up(index: &mut [usize], sizes: &[usize]) {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < sizes[d] {
            return;
        }
        index[d] = 0;
    }
}

/// The convolution as a direct loop (see the module's notes), row-major in
/// `out_dims`; `None` unless there is one group, the input's features are innermost,
/// the output is (batch, spatial…, feature) and the shape is small enough (the kernel
/// may be in any layout: it is packed first).
fn direct(
    lhs: &[f32],
    ls: &[usize],
    rhs: &[f32],
    rs: &[usize],
    c: &ConvDims,
    out_dims: &[usize],
    helpers: &HostPool,
) -> Option<Vec<f32>> {
    let (lstride, rstride) = (row_major_strides(ls), row_major_strides(rs));
    let spatial_order: Vec<u32> = (1..=c.out_spatial.len() as u32).collect();
    let plain = c.feature_groups == 1
        && c.batch_groups == 1
        && lstride[c.lhs_feature as usize] == 1
        && c.out_batch == 0
        && c.out_spatial == spatial_order
        && c.out_feature as usize == out_dims.len() - 1;
    let at = |dims: &[u32], shape: &[usize]| -> Vec<usize> { dims.iter().map(|&d| shape[d as usize]).collect() };
    let (in_sizes, kernel_sizes, out_sizes) =
        (at(&c.lhs_spatial, ls), at(&c.rhs_spatial, rs), at(&c.out_spatial, out_dims));
    let (inputs, outputs) = (rs[c.rhs_input as usize], rs[c.rhs_output as usize]);
    let window: usize = kernel_sizes.iter().product();
    let depth = inputs * window;
    if !plain || depth == 0 || depth > DIRECT_MOST_DEPTH || outputs == 0 || outputs > DIRECT_MOST_OUTPUTS {
        return None;
    }
    let spatial = window_sources(c, &lstride, &in_sizes, &kernel_sizes, &out_sizes);
    // The kernel as [window position, input feature] rows of the output features.
    let kernel_offsets =
        offsets(&kernel_sizes, &c.rhs_spatial.iter().map(|&d| rstride[d as usize]).collect::<Vec<_>>());
    // Rows padded with zeros to whole blocks of LANES outputs.
    let (in_stride, out_stride) = (rstride[c.rhs_input as usize], rstride[c.rhs_output as usize]);
    let lanes = outputs.next_multiple_of(LANES);
    let mut weights = Vec::with_capacity(depth * lanes);
    for &ko in &kernel_offsets {
        for i in 0..inputs {
            let row = ko + i * in_stride;
            if out_stride == 1 {
                weights.extend_from_slice(&rhs[row..][..outputs]);
            } else {
                weights.extend((0..outputs).map(|o| rhs[row + o * out_stride]));
            }
            weights.resize(weights.len() + lanes - outputs, 0.0);
        }
    }
    let positions: usize = out_sizes.iter().product();
    let rows = out_dims[0] * positions;
    let mut out = vec![0.0f32; rows * outputs];
    let rows_per_part = (DIRECT_PART_MACS / (depth * outputs)).max(1);
    let parts = rows.div_ceil(rows_per_part);
    let lent = helpers.lend(parts.saturating_sub(1));
    let chunk = rows.div_ceil(lent.threads().min(parts).max(1));
    let job = DirectRows {
        lhs,
        batch_stride: lstride[c.lhs_batch as usize],
        spatial: &spatial,
        weights: &weights,
        positions,
        window,
        inputs,
        outputs,
    };
    let pieces: Vec<(usize, &mut [f32])> =
        out.chunks_mut(chunk * outputs).enumerate().map(|(p, rows)| (p * chunk, rows)).collect();
    lent.run(pieces, |(first, rows)| super::vectorized(DirectPart(&job, first, rows)));
    Some(out)
}

/// What every part of a direct convolution reads.
struct DirectRows<'a> {
    lhs: &'a [f32],
    batch_stride: usize,
    spatial: &'a [Option<usize>],
    weights: &'a [f32],
    positions: usize,
    window: usize,
    inputs: usize,
    outputs: usize,
}

/// Output features per row of the kernel as the direct loop reads it: whole vector
/// registers' worth (16 f32 on AVX-512, 8 on AVX2).
const LANES: usize = 16;

/// What a window position in the padding reads.
static ZEROS: [f32; DIRECT_MOST_DEPTH] = [0.0; DIRECT_MOST_DEPTH];

/// Output positions summed together: as many independent chains of multiply-adds as
/// keep the vector units busy while each waits for the previous one.
const POSITIONS: usize = 6;

/// Output rows from `.1` on, into `.2` (whole rows of the output features).
struct DirectPart<'a, 'o>(&'a DirectRows<'a>, usize, &'o mut [f32]);

impl pulp::WithSimd for DirectPart<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let DirectPart(job, first, rows) = self;
        let (inputs, outputs) = (job.inputs, job.outputs);
        let (lanes, width) = (outputs.next_multiple_of(LANES), S::F32_LANES);
        let count = rows.len() / outputs;
        for group in (0..count).step_by(POSITIONS) {
            let here = POSITIONS.min(count - group);
            // Where each position of the group reads the input at each window position.
            let bases: [usize; POSITIONS] = std::array::from_fn(|p| {
                let row = first + group + p.min(here - 1);
                (row / job.positions) * job.batch_stride
            });
            let reads: [&[Option<usize>]; POSITIONS] = std::array::from_fn(|p| {
                let row = first + group + p.min(here - 1);
                &job.spatial[(row % job.positions) * job.window..][..job.window]
            });
            for block in (0..outputs).step_by(width) {
                // A register of sums per position over the whole window: the element
                // times the kernel's row, multiplied and added in one rounding.
                let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5] = [simd.splat_f32s(0.0); POSITIONS];
                for (k, kernel) in job.weights.chunks_exact(inputs * lanes).enumerate() {
                    // Padding reads zeros, as XLA's padded input holds: no branch inside,
                    // and each slice exactly `inputs` long, so no bounds check either.
                    let x = |p: usize| match reads[p][k] {
                        Some(offset) => &job.lhs[bases[p] + offset..][..inputs],
                        None => &ZEROS[..inputs],
                    };
                    let (x0, x1, x2, x3, x4, x5) = (x(0), x(1), x(2), x(3), x(4), x(5));
                    for (i, row) in kernel.chunks_exact(lanes).enumerate().take(inputs) {
                        let w = simd.partial_load_f32s(&row[block..block + width]);
                        let fma = |x: f32, acc| simd.mul_add_f32s(simd.splat_f32s(x), w, acc);
                        (a0, a1, a2) = (fma(x0[i], a0), fma(x1[i], a1), fma(x2[i], a2));
                        (a3, a4, a5) = (fma(x3[i], a3), fma(x4[i], a4), fma(x5[i], a5));
                    }
                }
                let acc = [a0, a1, a2, a3, a4, a5];
                let end = outputs.min(block + width);
                for (p, acc) in acc.into_iter().enumerate().take(here) {
                    let sums = &mut rows[(group + p) * outputs..][..outputs];
                    simd.partial_store_f32s(&mut sums[block..end], acc);
                }
            }
        }
    }
}
