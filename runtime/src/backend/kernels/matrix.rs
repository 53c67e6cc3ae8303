//! Matrix products (`dot`): batched, through the `gemm` crate for floats, split across
//! idle compute slots when large.

use std::sync::OnceLock;

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};
use neuron_datastore::peaks::ProductKernel;

use super::*;
use crate::backend::element::{Element, Int, cast, with_element, with_float, with_int};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::isa::{DotDims, FloatFormat};
use crate::pool::HostPool;

/// `dot` with general dimension numbers, as batched matrix products. Floats multiply
/// in f32 with f32 accumulation and round once to the output type; integers are
/// converted to the output type first and wrap.
pub(super) fn matmul(
    lhs: &ValueRef<'_>,
    rhs: &ValueRef<'_>,
    d: &DotDims,
    out: &ArrayType,
    helpers: &HostPool,
) -> Value {
    let dims = to_usize(&out.dims);
    match lhs.dtype().class() {
        DTypeClass::Float => {
            if let (ValueRef::F32(l), ValueRef::F32(r), DType::F32) = (lhs, rhs, out.dtype) {
                let mut product = ArrayD::zeros(IxDyn(&dims));
                if !small_product_into(l, r, d, product.view_mut()) {
                    batched_matmul_into(l, r, d, product.view_mut(), gemm_f32, helpers);
                }
                return Value::F32(product);
            }
            // bf16 operands are exact in f32 and round to themselves, so the kernel of
            // bf16-rounded products (AMX tiles, where the host has them) computes their
            // products exactly too.
            let gemm = match (lhs.dtype(), rhs.dtype()) {
                (DType::BF16, DType::BF16) => native_gemm(FloatFormat::Bf16, false).unwrap_or(gemm_f32),
                _ => gemm_f32,
            };
            let (l, r) = (converted::<f32>(lhs), converted::<f32>(rhs));
            let product = batched_matmul(&l.view(), &r.view(), d, &dims, gemm, helpers);
            with_float!(out.dtype, D => D::wrap(product.mapv(D::from_f32)), unvalidated("dot"))
        }
        DTypeClass::Signed | DTypeClass::Unsigned => {
            if let Some(product) = exact_in_f32(lhs, rhs, d, out, helpers) {
                return product;
            }
            with_int!(out.dtype, D => {
                let (l, r) = (converted::<D>(lhs), converted::<D>(rhs));
                D::wrap(batched_matmul(&l.view(), &r.view(), d, &dims, gemm_int::<D>, helpers))
            }, unvalidated("dot"))
        }
        DTypeClass::Pred => unvalidated("dot on pred"),
    }
}

/// An integer `dot` of 8-bit operands through the f32 GEMM, where every partial sum is
/// an integer of at most 2^24 in magnitude, and so exact in f32 in any order: then the
/// exact sum, converted to the output type with wrapping, is what multiplying and
/// adding in the output type gives. `None` for wider operands or longer sums.
fn exact_in_f32(
    lhs: &ValueRef<'_>,
    rhs: &ValueRef<'_>,
    d: &DotDims,
    out: &ArrayType,
    helpers: &HostPool,
) -> Option<Value> {
    let largest = |dtype: DType| match dtype {
        DType::S8 => Some(128u64),
        DType::U8 => Some(255),
        _ => None,
    };
    let terms: u64 = d.lhs_contracting.iter().map(|&c| lhs.shape()[c as usize] as u64).product();
    if largest(lhs.dtype())? * largest(rhs.dtype())? * terms > 1 << 24 {
        return None;
    }
    let (l, r) = (converted::<f32>(lhs), converted::<f32>(rhs));
    let product = batched_matmul(&l.view(), &r.view(), d, &to_usize(&out.dims), gemm_f32, helpers);
    Some(with_int!(out.dtype, D => D::wrap(product.mapv(|x| D::from_i64(x as i64))), unvalidated("dot")))
}

/// Products at most this many multiply-adds, of one matrix or vector by another, are
/// computed by a plain loop: preparing a GEMM costs more than they do (a loop body's
/// matrix-vector update).
pub(super) const SMALL_PRODUCT_MACS: usize = 1 << 14;

/// A small f32 product without batch dimensions, of operands of rank 1 or 2 with one
/// contracting dimension, into `out` (standard layout); `false` (and `out` untouched)
/// for any other.
pub(super) fn small_product_into(
    l: &ArrayViewD<'_, f32>,
    r: &ArrayViewD<'_, f32>,
    d: &DotDims,
    out: ndarray::ArrayViewMutD<'_, f32>,
) -> bool {
    let ([lc], [rc]) = (d.lhs_contracting.as_slice(), d.rhs_contracting.as_slice()) else { return false };
    if !d.lhs_batch.is_empty() {
        return false;
    }
    let (Some(lm), Some(rm)) = (as_matrix(l, *lc as usize, false), as_matrix(r, *rc as usize, true)) else {
        return false;
    };
    let (m, k, n) = (lm.dim().0, lm.dim().1, rm.dim().1);
    if rm.dim().0 != k || m * n * k > SMALL_PRODUCT_MACS {
        return false;
    }
    let Ok(out) = out.into_shape_with_order((m, n)) else { return false };
    vectorized(SmallProduct((lm, rm, out)));
    true
}

vectorized_job!(
    /// `small_product_run`, vectorised.
    SmallProduct<'a> ((ndarray::ArrayView2<'a, f32>, ndarray::ArrayView2<'a, f32>, ndarray::ArrayViewMut2<'a, f32>)) -> () =
        small_product_run
);

/// `c = a · b` for [`small_product_into`], every element of `c` written.
#[inline(always)]
fn small_product_run(
    (a, b, mut c): (ndarray::ArrayView2<'_, f32>, ndarray::ArrayView2<'_, f32>, ndarray::ArrayViewMut2<'_, f32>),
) {
    if b.strides()[1] == 1 && b.dim().1 > 1 {
        // `b`'s rows are contiguous (a vector times a matrix stored [k, n]): each row
        // of `c` sums `a[i][p]` times row `p`, a loop the compiler vectorises, where a
        // column's dot product would stride through memory.
        for (i, mut c) in c.rows_mut().into_iter().enumerate() {
            c.fill(0.0);
            for (p, b) in b.rows().into_iter().enumerate() {
                let x = a[[i, p]];
                match (c.as_slice_mut(), b.to_slice()) {
                    (Some(c), Some(b)) => c.iter_mut().zip(b).for_each(|(c, &y)| *c += x * y),
                    (_, _) => c.iter_mut().zip(b).for_each(|(c, &y)| *c += x * y),
                }
            }
        }
        return;
    }
    // A matrix of contiguous rows times a contiguous vector (a loop body's update):
    // each element a dot product of two slices, without an iterator per row.
    if let (Some(rows), Some(column), 1) = (a.as_slice(), b.column(0).to_slice(), b.dim().1)
        && let Some(c) = c.as_slice_mut()
        && a.dim().1 > 0
    {
        let k = a.dim().1;
        for (c, row) in c.iter_mut().zip(rows.chunks_exact(k)) {
            *c = dot_in_lanes(row, column);
        }
        return;
    }
    for (i, row) in a.rows().into_iter().enumerate() {
        for (j, column) in b.columns().into_iter().enumerate() {
            c[[i, j]] = match (row.to_slice(), column.to_slice()) {
                (Some(x), Some(y)) => dot_in_lanes(x, y),
                _ => row.iter().zip(column).fold(0.0, |sum, (&x, &y)| sum + x * y),
            };
        }
    }
}

vectorized_job!(
    /// `matrix_vector_run`, vectorised.
    MatrixVector<'a> ((&'a [f32], &'a [f32], &'a mut [f32])) -> () = matrix_vector_run
);

vectorized_job!(
    /// `vector_matrix_run`, vectorised.
    VectorMatrix<'a> ((&'a [f32], &'a [f32], &'a mut [f32])) -> () = vector_matrix_run
);

/// `out = a · v` for a row-major `a` of `out.len()` rows of `v.len()` (at least one):
/// what [`small_product_into`] computes for those operands, on slices. With AVX2, each
/// row's eight partial sums are one vector register, several rows at once.
pub(super) fn matrix_vector(a: &[f32], v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        // The trait's `vectorize`, whose job is inlined where AVX2 is enabled.
        return pulp::Simd::vectorize(simd, MatrixVectorV3 { simd, a, v, out });
    }
    vectorized(MatrixVector((a, v, out)));
}

/// [`matrix_vector`] on AVX2: [`dot_in_lanes`] with each row's eight partial sums in
/// one register, [`ROWS_AT_ONCE`] rows at a time.
#[cfg(target_arch = "x86_64")]
struct MatrixVectorV3<'a> {
    simd: pulp::x86::V3,
    a: &'a [f32],
    v: &'a [f32],
    out: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::WithSimd for MatrixVectorV3<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let MatrixVectorV3 { simd, a, v, out } = self;
        matrix_vector_v3(simd, a, v, out);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn matrix_vector_v3(simd: pulp::x86::V3, a: &[f32], v: &[f32], out: &mut [f32]) {
    let k = v.len();
    let (ys, _) = v.as_chunks::<8>();
    let whole = ys.len() * 8;
    let mut outs = out.chunks_exact_mut(ROWS_AT_ONCE);
    let mut blocks = a.chunks_exact(k * ROWS_AT_ONCE);
    for (c, block) in (&mut outs).zip(&mut blocks) {
        let rows: [&[f32]; ROWS_AT_ONCE] = std::array::from_fn(|r| &block[r * k..(r + 1) * k]);
        let xs = rows.map(|x| &x.as_chunks::<8>().0[..ys.len()]);
        let mut lanes = [simd.splat_f32x8(0.0); ROWS_AT_ONCE];
        for (i, y) in ys.iter().enumerate() {
            let y: pulp::f32x8 = bytemuck::cast(*y);
            for (lanes, x) in lanes.iter_mut().zip(&xs) {
                let x: pulp::f32x8 = bytemuck::cast(x[i]);
                *lanes = simd.add_f32x8(*lanes, simd.mul_f32x8(x, y));
            }
        }
        for (r, c) in c.iter_mut().enumerate() {
            let lanes: [f32; 8] = bytemuck::cast(lanes[r]);
            *c = combine_lanes(&lanes, &rows[r][whole..], &v[whole..]);
        }
    }
    for (c, row) in outs.into_remainder().iter_mut().zip(blocks.remainder().chunks_exact(k)) {
        *c = dot_in_lanes(row, v);
    }
}

/// `out = v · b` for a row-major `b` of `v.len()` rows of `out.len()` (more than one):
/// what [`small_product_into`] computes for those operands, on slices.
pub(super) fn vector_matrix(v: &[f32], b: &[f32], out: &mut [f32]) {
    vectorized(VectorMatrix((v, b, out)));
}

/// Rows of a matrix-vector product summed at once: each row's partial sums wait on the
/// addition before, so one row at a time leaves the adders idle most of the time.
#[cfg(target_arch = "x86_64")]
const ROWS_AT_ONCE: usize = 4;

#[inline(always)]
fn matrix_vector_run((a, v, out): (&[f32], &[f32], &mut [f32])) {
    for (c, row) in out.iter_mut().zip(a.chunks_exact(v.len())) {
        *c = dot_in_lanes(row, v);
    }
}

#[inline(always)]
fn vector_matrix_run((v, b, out): (&[f32], &[f32], &mut [f32])) {
    out.fill(0.0);
    for (&x, row) in v.iter().zip(b.chunks_exact(out.len())) {
        out.iter_mut().zip(row).for_each(|(c, &y)| *c += x * y);
    }
}

/// A dot product in eight interleaved partial sums (lane `i` takes the elements `i`,
/// `i + 8`, …), combined as `((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7))` added
/// one pair after another, then the elements past the last eight one by one: the order
/// `ndarray`'s `dot` of contiguous vectors sums in, so the bits stay those of that
/// method, which this kernel used before.
#[inline(always)]
fn dot_in_lanes(x: &[f32], y: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (chunks, rest) = (x.chunks_exact(8), y.chunks_exact(8));
    let (x_rest, y_rest) = (chunks.remainder(), rest.remainder());
    for (x, y) in chunks.zip(rest) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    combine_lanes(&lanes, x_rest, y_rest)
}

/// [`dot_in_lanes`]'s sum of its eight partial sums, then of the elements past them.
#[inline(always)]
fn combine_lanes(lanes: &[f32; 8], x_rest: &[f32], y_rest: &[f32]) -> f32 {
    let mut sum = 0.0;
    for l in 0..4 {
        sum += lanes[l] + lanes[l + 4];
    }
    x_rest.iter().zip(y_rest).fold(sum, |sum, (&x, &y)| sum + x * y)
}

/// An operand of rank 1 or 2 as a matrix: `[k, n]` for a right operand
/// (`contracting_first`), `[m, k]` for a left one.
fn as_matrix<'v>(
    a: &'v ArrayViewD<'_, f32>,
    contracting: usize,
    contracting_first: bool,
) -> Option<ndarray::ArrayView2<'v, f32>> {
    let matrix = match a.ndim() {
        // A vector is one row (left) or one column (right).
        1 => a.view().insert_axis(Axis(usize::from(contracting_first))).into_dimensionality().ok()?,
        2 => {
            let v = a.view().into_dimensionality::<ndarray::Ix2>().ok()?;
            let first = contracting == 0;
            if first == contracting_first { v } else { v.reversed_axes() }
        }
        _ => return None,
    };
    Some(matrix)
}

/// `dot` of f32 operands rounded to `format` first (`MatMulRounded`), accumulated in
/// f32: bf16 products on the CPU's bf16 instructions when it has them, otherwise
/// rounded copies of the operands through the f32 GEMM.
pub(super) fn matmul_rounded(
    lhs: &ValueRef<'_>,
    rhs: &ValueRef<'_>,
    d: &DotDims,
    format: FloatFormat,
    saturate: bool,
    out: &ArrayType,
    helpers: &HostPool,
) -> Value {
    let dims = to_usize(&out.dims);
    let (l, r) = (arr::<f32>(lhs), arr::<f32>(rhs));
    match native_gemm(format, saturate) {
        Some(gemm) => Value::F32(batched_matmul(l, r, d, &dims, gemm, helpers)),
        None => {
            let (l, r) = (rounded(l, format, saturate), rounded(r, format, saturate));
            Value::F32(batched_matmul(&l.view(), &r.view(), d, &dims, gemm_f32, helpers))
        }
    }
}

/// `MatMulRounded` into `out` (see [`matmul_rounded`]).
pub(super) fn matmul_rounded_into(
    l: &ArrayViewD<'_, f32>,
    r: &ArrayViewD<'_, f32>,
    d: &DotDims,
    format: FloatFormat,
    saturate: bool,
    out: ndarray::ArrayViewMutD<'_, f32>,
    helpers: &HostPool,
) {
    match native_gemm(format, saturate) {
        Some(gemm) => batched_matmul_into(l, r, d, out, gemm, helpers),
        None => {
            let (l, r) = (rounded(l, format, saturate), rounded(r, format, saturate));
            batched_matmul_into(&l.view(), &r.view(), d, out, gemm_f32, helpers)
        }
    }
}

/// A GEMM that rounds its operands to `format` itself while it packs them (bf16
/// without saturation): bf16 products on AMX tiles or AVX512-BF16 where
/// [`product_kernel`] found them faster, else f32 multiply-adds on AVX-512F.
fn native_gemm(format: FloatFormat, saturate: bool) -> Option<Gemm<f32>> {
    #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
    if format == FloatFormat::Bf16 && !saturate {
        match product_kernel() {
            ProductKernel::Amx => return Some(super::amx::gemm_amx),
            ProductKernel::Bf16 => return Some(super::bf16::gemm_bf16),
            ProductKernel::F32 | ProductKernel::NotRecorded => {}
        }
        if super::rounded_f32::available() {
            return Some(super::rounded_f32::gemm_rounded_f32);
        }
    }
    let _ = (format, saturate);
    None
}

/// The kernel of matrix products with bf16-rounded operands on this host, measured once
/// per process: bf16 products (on AMX tiles or AVX512-BF16, whichever measures faster)
/// only where they run at least [`BF16_MARGIN`] times as fast as the same products on
/// f32 multiply-adds (`rounded_f32`), which gives the same products (each product of
/// two bf16 is exact in f32) summed in another order. On AMD Zen 4 AVX512-BF16 measured
/// twice the multiply-adds of f32; on an Intel Xeon (Sapphire Rapids) it measured no
/// faster, and AMX many times faster, which is why this is measured rather than read
/// from the CPU's flags. Never in unoptimised (debug) builds, where this crate's
/// kernels run twenty times slower than the `gemm` dependency, which is built optimised.
pub(crate) fn product_kernel() -> ProductKernel {
    *PRODUCT_KERNEL.get_or_init(measure_product_kernel)
}

/// Takes `chosen` as the kernel of this process unless one was chosen or measured
/// already (the first runtime's configuration wins); `None` measures. Returns the kernel.
pub(crate) fn choose_product_kernel(chosen: Option<ProductKernel>) -> ProductKernel {
    match chosen {
        // bf16 products need the CPU's instructions, and an optimised build.
        Some(ProductKernel::Bf16) if !native_bf16_possible() => *PRODUCT_KERNEL.get_or_init(|| ProductKernel::F32),
        Some(ProductKernel::Amx) if !native_amx_possible() => *PRODUCT_KERNEL.get_or_init(|| ProductKernel::F32),
        Some(kernel) => *PRODUCT_KERNEL.get_or_init(|| kernel),
        None => product_kernel(),
    }
}

static PRODUCT_KERNEL: OnceLock<ProductKernel> = OnceLock::new();

/// Whether this build and CPU can run bf16 products at all.
fn native_bf16_possible() -> bool {
    #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
    return super::bf16::available();
    #[cfg(not(all(target_arch = "x86_64", not(debug_assertions))))]
    false
}

/// Whether this build, CPU and kernel can run bf16 products on AMX tiles.
fn native_amx_possible() -> bool {
    #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
    return super::amx::available();
    #[cfg(not(all(target_arch = "x86_64", not(debug_assertions))))]
    false
}

/// How much faster the bf16 kernel must measure to be chosen: a margin that keeps the
/// choice (and the defined peak that follows it) the same from run to run.
#[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
const BF16_MARGIN: f64 = 1.15;

#[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
fn measure_product_kernel() -> ProductKernel {
    if !super::bf16::available() {
        return ProductKernel::F32;
    }
    // A product of the size the example models run (about 8 M multiply-adds), best of
    // five each, alternating; about 10 ms in all.
    let (m, k, n) = (64, 512, 256);
    let a = ndarray::Array2::from_shape_fn((m, k), |(i, j)| ((i * 7 + j * 3) % 13) as f32 * 0.37 - 1.9);
    let b = ndarray::Array2::from_shape_fn((k, n), |(i, j)| ((i * 5 + j * 11) % 17) as f32 * 0.23 - 1.7);
    let mut c = ndarray::Array2::<f32>::zeros((m, n));
    let mut kernels: Vec<(ProductKernel, Gemm<f32>, f64)> = vec![
        // The f32 kernel of the same shape, which rounds while it packs too.
        (ProductKernel::F32, super::rounded_f32::gemm_rounded_f32, f64::INFINITY),
        (ProductKernel::Bf16, super::bf16::gemm_bf16, f64::INFINITY),
    ];
    if super::amx::available() {
        kernels.push((ProductKernel::Amx, super::amx::gemm_amx, f64::INFINITY));
    }
    for _ in 0..5 {
        for (_, gemm, best) in &mut kernels {
            let start = std::time::Instant::now();
            gemm(a.view(), b.view(), c.view_mut());
            *best = best.min(start.elapsed().as_secs_f64());
        }
    }
    let f32 = kernels[0].2;
    let (fastest, time) = kernels[1..]
        .iter()
        .map(|(kernel, _, time)| (*kernel, *time))
        .fold((ProductKernel::F32, f64::INFINITY), |best, next| if next.1 < best.1 { next } else { best });
    let chosen = if f32 >= BF16_MARGIN * time { fastest } else { ProductKernel::F32 };
    let gflops = |time: f64| 2.0 * (m * k * n) as f64 / time / 1e9;
    let rates: Vec<String> =
        kernels.iter().map(|(kernel, _, time)| format!("{kernel:?} {:.1}", gflops(*time))).collect();
    tracing::debug!(gflops = %rates.join(", "), ?chosen, "measured the products of bf16-rounded operands");
    chosen
}

#[cfg(not(all(target_arch = "x86_64", not(debug_assertions))))]
fn measure_product_kernel() -> ProductKernel {
    ProductKernel::F32
}

fn rounded(a: &ArrayViewD<'_, f32>, format: FloatFormat, saturate: bool) -> ArrayD<f32> {
    with_rounding!(format, saturate, f => a.mapv(f))
}

/// A copy of `v` converted to `D`.
pub(super) fn converted<D: Element>(v: &ValueRef<'_>) -> ArrayD<D> {
    with_element!(v.dtype(), S => arr::<S>(v).mapv(cast::<S, D>))
}

/// A matrix product `c = a · b` on strided 2-D views; every element of `c` is written.
pub(super) type Gemm<T> = fn(ndarray::ArrayView2<'_, T>, ndarray::ArrayView2<'_, T>, ndarray::ArrayViewMut2<'_, T>);

pub(super) fn batched_matmul<T: Copy + Default + Send + Sync>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out_dims: &[usize],
    gemm: Gemm<T>,
    helpers: &HostPool,
) -> ArrayD<T> {
    let mut out = ArrayD::from_elem(IxDyn(out_dims), T::default());
    batched_matmul_into(lhs, rhs, d, out.view_mut(), gemm, helpers);
    out
}

/// Products smaller than this many multiply-adds run on the calling thread alone:
/// waking a helper thread costs tens of microseconds.
pub(super) const PARALLEL_MIN_MACS: usize = 1 << 22;

/// One matrix product of a batch, or a block of columns or rows of one.
pub(super) type GemmJob<'a, T> =
    (ndarray::ArrayView2<'a, T>, ndarray::ArrayView2<'a, T>, ndarray::ArrayViewMut2<'a, T>);

/// `dot` with general dimension numbers into `out` (the result's shape, row-major),
/// as one matrix product per batch element. Every element of `out` is written. A large
/// product is split across the host compute slots that are idle at that moment.
pub(super) fn batched_matmul_into<T: Copy + Default + Send + Sync>(
    lhs: &ArrayViewD<'_, T>,
    rhs: &ArrayViewD<'_, T>,
    d: &DotDims,
    out: ndarray::ArrayViewMutD<'_, T>,
    gemm: Gemm<T>,
    helpers: &HostPool,
) {
    let (Ok(l), Ok(r)) =
        (arrange(lhs, &d.lhs_batch, &d.lhs_contracting, true), arrange(rhs, &d.rhs_batch, &d.rhs_contracting, false))
    else {
        unvalidated("dot")
    };
    let (batch, m, k) = l.dim();
    let n = r.dim().2;
    let mut out = out.into_shape_with_order((batch, m, n)).unwrap_or_else(|_| unvalidated("dot"));
    let macs = batch.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    let wanted = if macs >= PARALLEL_MIN_MACS { (macs / PARALLEL_MIN_MACS).min(batch.max(m).max(n)) - 1 } else { 0 };
    let lent = helpers.lend(wanted);
    let threads = lent.threads();
    let mut jobs: Vec<GemmJob<'_, T>> = Vec::with_capacity(batch);
    for (i, c) in out.outer_iter_mut().enumerate() {
        jobs.push((l.index_axis(Axis(0), i), r.index_axis(Axis(0), i), c));
    }
    if threads == 1 {
        return jobs.into_iter().for_each(|(a, b, c)| gemm(a, b, c));
    }
    // Fewer products than threads: cut each into blocks of its wider side.
    if jobs.len() < threads {
        let pieces = threads.div_ceil(jobs.len());
        jobs = jobs.into_iter().flat_map(|job| split_gemm(job, pieces)).collect();
    }
    let per_part = jobs.len().div_ceil(threads);
    let mut parts: Vec<Vec<GemmJob<'_, T>>> = Vec::with_capacity(threads);
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        parts.push(jobs.by_ref().take(per_part).collect());
    }
    lent.run(parts, |part| part.into_iter().for_each(|(a, b, c)| gemm(a, b, c)));
}

/// Cuts a product into up to `pieces` products over blocks of columns (or of rows,
/// when there are more rows than columns).
pub(super) fn split_gemm<T>((mut a, mut b, mut c): GemmJob<'_, T>, pieces: usize) -> Vec<GemmJob<'_, T>> {
    let (m, n) = c.dim();
    let (axis, len) = if n >= m { (Axis(1), n) } else { (Axis(0), m) };
    let block = len.div_ceil(pieces).max(1);
    let mut blocks = Vec::with_capacity(pieces);
    while c.len_of(axis) > block {
        let (c_head, c_rest) = c.split_at(axis, block);
        c = c_rest;
        if axis == Axis(1) {
            let (b_head, b_rest) = b.split_at(axis, block);
            b = b_rest;
            blocks.push((a, b_head, c_head));
        } else {
            let (a_head, a_rest) = a.split_at(axis, block);
            a = a_rest;
            blocks.push((a_head, b, c_head));
        }
    }
    blocks.push((a, b, c));
    blocks
}

/// Arranges an operand as `[batch, free, contracting]` (or `[batch, contracting, free]`),
/// flattening each group of axes into one.
pub(super) fn arrange<'a, T: Copy>(
    a: &'a ArrayViewD<'_, T>,
    batch: &[u32],
    contracting: &[u32],
    contracting_last: bool,
) -> Result<ndarray::CowArray<'a, T, ndarray::Ix3>, ndarray::ShapeError> {
    let free: Vec<usize> =
        (0..a.ndim()).filter(|i| !batch.contains(&(*i as u32)) && !contracting.contains(&(*i as u32))).collect();
    let batch: Vec<usize> = batch.iter().map(|&i| i as usize).collect();
    let contracting: Vec<usize> = contracting.iter().map(|&i| i as usize).collect();
    let size = |axes: &[usize]| axes.iter().map(|&i| a.shape()[i]).product::<usize>();
    let (b, f, c) = (size(&batch), size(&free), size(&contracting));
    let mut perm = batch.clone();
    if contracting_last {
        perm.extend(&free);
        perm.extend(&contracting);
    } else {
        perm.extend(&contracting);
        perm.extend(&free);
    }
    let view = a.view().permuted_axes(IxDyn(&perm));
    // With at most one axis per group, a strided view serves whatever the layout (the
    // GEMM takes any strides): add unit axes for the empty groups.
    if batch.len() <= 1 && free.len() <= 1 && contracting.len() <= 1 {
        let groups = if contracting_last {
            [batch.len(), free.len(), contracting.len()]
        } else {
            [batch.len(), contracting.len(), free.len()]
        };
        let mut strided = view.clone();
        for (position, &axes) in groups.iter().enumerate() {
            if axes == 0 {
                strided = strided.insert_axis(Axis(position));
            }
        }
        if let Ok(strided) = strided.into_dimensionality::<ndarray::Ix3>() {
            return Ok(ndarray::CowArray::from(strided));
        }
    }
    let shape = if contracting_last { (b, f, c) } else { (b, c, f) };
    // A view when the axes already line up; a copy otherwise.
    match view.clone().into_shape_with_order(shape) {
        Ok(v) => Ok(ndarray::CowArray::from(v)),
        Err(_) => view.to_shape(shape).map(|v| ndarray::CowArray::from(v.into_owned())),
    }
}

/// Single-precision matrix product through the `gemm` crate (its best kernel for the
/// host CPU, on the calling thread).
pub(super) fn gemm_f32(
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    mut c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (m, k, n) = product_dims(&a, &b, &c);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    let (rsa, csa) = (a.strides()[0], a.strides()[1]);
    let (rsb, csb) = (b.strides()[0], b.strides()[1]);
    let (rsc, csc) = (c.strides()[0], c.strides()[1]);
    // SAFETY: the pointers (to each view's first element) and strides describe the
    // three views exactly (their dimensions were checked above), `c` is borrowed
    // mutably and does not alias `a` or `b`, and gemm reads and writes only within
    // those bounds. With `read_dst` false, `c` is only written: c = 1.0 * a * b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            csc,
            rsc,
            false,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Integer matrix product, wrapping: each row of `c` is summed as `a[i][p]` times row
/// `p` of `b`, over contiguous rows, in a row buffer copied into place; compiled for the
/// widest vector instructions of this CPU (AVX-512's `vpmulld` multiplies 16 lanes).
pub(super) fn gemm_int<T: Int>(
    a: ndarray::ArrayView2<'_, T>,
    b: ndarray::ArrayView2<'_, T>,
    c: ndarray::ArrayViewMut2<'_, T>,
) {
    let b = b.as_standard_layout();
    let b = b.as_slice().unwrap_or_else(|| unvalidated("a standard-layout copy"));
    vectorized(IntProduct { a, b, c });
}

struct IntProduct<'a, 'c, T> {
    a: ndarray::ArrayView2<'a, T>,
    b: &'a [T],
    c: ndarray::ArrayViewMut2<'c, T>,
}

impl<T: Int> pulp::WithSimd for IntProduct<'_, '_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let IntProduct { a, b, mut c } = self;
        let (m, k) = a.dim();
        let n = c.dim().1;
        let mut row = vec![T::ZERO; n];
        for i in 0..m {
            row.fill(T::ZERO);
            for p in 0..k {
                let x = a[[i, p]];
                let b = &b[p * n..(p + 1) * n];
                for j in 0..n {
                    row[j] = row[j].add(x.mul(b[j]));
                }
            }
            for (to, &from) in c.row_mut(i).iter_mut().zip(&row) {
                *to = from;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The choice among the kernels of bf16-rounded products that an optimised build
    /// makes at start (compiled out of debug builds, whose tests cannot see it): on a
    /// host with AVX-512F a native kernel takes them, the one measured fastest, and it
    /// gives the exact sums of the bf16 products as the plain kernel does.
    #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
    #[test]
    fn an_optimised_build_takes_bf16_rounded_products_to_the_fastest_native_kernel_of_the_host() {
        let kernel = product_kernel();
        eprintln!("the kernel of bf16-rounded products on this host: {kernel:?}");
        if !super::super::rounded_f32::available() {
            eprintln!("skipped the kernel choice: this CPU has no AVX-512F");
            assert_eq!(kernel, ProductKernel::F32);
            assert!(native_gemm(FloatFormat::Bf16, false).is_none());
            return;
        }
        let expected: Gemm<f32> = match kernel {
            ProductKernel::Amx => super::super::amx::gemm_amx,
            ProductKernel::Bf16 => super::super::bf16::gemm_bf16,
            ProductKernel::F32 | ProductKernel::NotRecorded => super::super::rounded_f32::gemm_rounded_f32,
        };
        // Only a kernel the CPU runs is chosen.
        assert!(kernel != ProductKernel::Bf16 || super::super::bf16::available());
        assert!(kernel != ProductKernel::Amx || super::super::amx::available());
        let chosen = native_gemm(FloatFormat::Bf16, false).expect("a native kernel on an AVX-512F host");
        assert!(std::ptr::fn_addr_eq(chosen, expected), "the measured kernel, {kernel:?}, takes the products");
        // Saturating conversions are rounded before the product, by the plain kernel.
        assert!(native_gemm(FloatFormat::Bf16, true).is_none());
        super::super::packed::check_against_exact_sums(chosen, &[(1, 1, 1), (9, 33, 130), (64, 512, 256)]);
    }

    #[test]
    fn an_integer_product_of_strided_views_wraps_as_the_plain_loop_does() {
        let (m, k, n) = (5, 37, 19);
        let a = ndarray::Array2::from_shape_fn((m, k), |(i, p)| ((i * 31 + p * 7) % 255) as i32 - 127);
        // `b` transposed in memory, `c` a column-major view: neither is contiguous by rows.
        let b_t =
            ndarray::Array2::from_shape_fn((n, k), |(j, p)| (((j * 13 + p * 3) % 251) as i32).wrapping_mul(70_000_001));
        let b = b_t.t();
        let mut c_t = ndarray::Array2::<i32>::zeros((n, m));
        gemm_int(a.view(), b, c_t.view_mut().reversed_axes());
        for i in 0..m {
            for j in 0..n {
                let expected = (0..k).fold(0i32, |acc, p| acc.wrapping_add(a[[i, p]].wrapping_mul(b[[p, j]])));
                assert_eq!(c_t[[j, i]], expected, "c[{i}][{j}]");
            }
        }
    }

    #[test]
    fn eight_bit_products_through_f32_are_exact_at_the_longest_sum_and_wrap_into_narrow_outputs() {
        // 1024 terms of -128 x -128: the largest sum that stays exact in f32 (2^24).
        let (m, k, n) = (3, 1024, 5);
        let a =
            ndarray::Array2::from_shape_fn((m, k), |(i, p)| if i == 0 { -128i8 } else { (p * 7 + i) as i8 }).into_dyn();
        let b = ndarray::Array2::from_shape_fn((k, n), |(p, j)| if j == 0 { -128i8 } else { (p * 3 + j * 5) as i8 });
        let b = b.into_dyn();
        let d = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contracting: vec![1], rhs_contracting: vec![0] };
        let helpers = HostPool::new(1);
        for out in [DType::S32, DType::S16, DType::U32] {
            let ty = ArrayType::new(out, vec![m as u64, n as u64]);
            let product = matmul(&ValueRef::S8(a.view()), &ValueRef::S8(b.view()), &d, &ty, &helpers);
            let exact = |i: usize, j: usize| (0..k).map(|p| i64::from(a[[i, p]]) * i64::from(b[[p, j]])).sum::<i64>();
            for i in 0..m {
                for j in 0..n {
                    let got = match &product {
                        Value::S32(c) => i64::from(c[[i, j]]),
                        Value::S16(c) => i64::from(c[[i, j]]),
                        Value::U32(c) => i64::from(c[[i, j]]),
                        other => panic!("{other:?}"),
                    };
                    let expected = match out {
                        DType::S16 => i64::from(exact(i, j) as i16),
                        DType::U32 => i64::from(exact(i, j) as u32),
                        _ => exact(i, j),
                    };
                    assert_eq!(got, expected, "{out:?} c[{i}][{j}]");
                }
            }
        }
        assert_eq!(exact_sum_at(&a, &b), 1 << 24);
    }

    fn exact_sum_at(a: &ArrayD<i8>, b: &ArrayD<i8>) -> i64 {
        (0..a.shape()[1]).map(|p| i64::from(a[[0, p]]) * i64::from(b[[p, 0]])).sum()
    }

    #[test]
    fn a_vector_times_a_row_major_matrix_sums_each_column_in_order() {
        let (k, n) = (48, 40);
        let v = ndarray::Array1::from_shape_fn(k, |p| (p as f32 * 0.37).sin()).into_dyn();
        let w = ndarray::Array2::from_shape_fn((k, n), |(p, j)| ((p * n + j) as f32 * 0.11).cos()).into_dyn();
        let d = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contracting: vec![0], rhs_contracting: vec![0] };
        let mut out = ArrayD::<f32>::zeros(IxDyn(&[n]));
        assert!(small_product_into(&v.view(), &w.view(), &d, out.view_mut()));
        for j in 0..n {
            let expected = (0..k).fold(0.0f32, |acc, p| acc + v[[p]] * w[[p, j]]);
            assert_eq!(out[[j]].to_bits(), expected.to_bits(), "column {j}");
        }
    }

    #[test]
    fn dot_products_in_lanes_give_ndarrays_bits() {
        for len in 0..42 {
            let x: Vec<f32> = (0..len).map(|i| ((i * 7 + len) as f32 * 0.731).sin() * 1e3).collect();
            let y: Vec<f32> = (0..len).map(|i| ((i * 3 + 1) as f32 * 0.377).cos() / 7.0).collect();
            let expected = ndarray::ArrayView1::from(&x).dot(&ndarray::ArrayView1::from(&y));
            assert_eq!(dot_in_lanes(&x, &y).to_bits(), expected.to_bits(), "length {len}");
        }
    }

    #[test]
    fn a_matrix_times_a_vector_gives_each_rows_dot_product() {
        let (m, k) = (5, 37);
        let w = ndarray::Array2::from_shape_fn((m, k), |(i, p)| ((i * k + p) as f32 * 0.29).sin() * 3.0).into_dyn();
        let v = ndarray::Array1::from_shape_fn(k, |p| (p as f32 * 0.61).cos()).into_dyn();
        let d = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contracting: vec![1], rhs_contracting: vec![0] };
        let mut out = ArrayD::<f32>::from_elem(IxDyn(&[m]), f32::NAN);
        assert!(small_product_into(&w.view(), &v.view(), &d, out.view_mut()));
        let (w, v) = (
            w.into_dimensionality::<ndarray::Ix2>().expect("2-D"),
            v.into_dimensionality::<ndarray::Ix1>().expect("1-D"),
        );
        for i in 0..m {
            assert_eq!(out[[i]].to_bits(), w.row(i).dot(&v).to_bits(), "row {i}");
        }
    }
}
