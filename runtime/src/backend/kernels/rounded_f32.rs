//! Matrix products of f32 operands rounded to bf16, accumulated in f32, on f32
//! multiply-adds (AVX-512F): the kernel for `--auto-cast matmult` on hosts whose bf16
//! products are no faster than f32 (see `matrix::product_kernel`).
//!
//! The operands are rounded (to nearest, ties to even, as `RoundPrecision` does) while
//! they are packed, which the product does anyway, so rounding costs no pass over the
//! operands of its own: `a`'s rows contiguous, `b` one panel of 64 columns at a time
//! (transposed operands read along their contiguous columns). A microkernel then
//! computes a block of 6 rows by 64 columns of `c`, in 24 registers, over a slice of at
//! most 128 values of `k`: the slice of the panel stays in the first-level cache while
//! all the blocks of rows read it, and each block's sums are carried to the next slice
//! (stored and loaded exactly, so the sums are added in the same order as without
//! slices). Each product of two bf16 is exact in f32, so the result differs from
//! the bf16 kernel's only in the order of the additions.

use std::arch::x86_64::*;

use super::packed::{PANEL, ROWS, copy_block, prefetch_rows_share, with_row_count, with_scratch};

/// Whether this CPU runs [`gemm_rounded_f32`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Values of `k` per slice: a slice of a packed panel ([`PANEL`] columns, 32 KiB) stays
/// in the first-level cache while every block of rows reads it. Products of a longer `k`
/// go slice by slice, each block's sums carried from one slice to the next.
const DEPTH: usize = 128;

/// `c = bf16(a) · bf16(b)`, accumulated in f32 on f32 multiply-adds; every element of
/// `c` is written. The caller checks [`available`] first.
pub(super) fn gemm_rounded_f32(
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    mut c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (m, k, n) = super::product_dims(&a, &b, &c);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    // Slices of equal depth, at most DEPTH each.
    let depth = k.div_ceil(k.div_ceil(DEPTH));
    let sliced = depth < k;
    let blocks = m.div_ceil(ROWS);
    // Each block's sums between slices.
    let carried = if sliced { blocks * ROWS * PANEL } else { 0 };
    with_scratch(m * k + carried, depth * PANEL, |rows, panel| {
        let (rows, sums) = bytemuck::cast_slice_mut::<u32, f32>(rows).split_at_mut(m * k);
        let panel = bytemuck::cast_slice_mut(panel);
        let mut single = [0f32; ROWS * PANEL];
        // SAFETY: `available()` was checked by the caller.
        unsafe { pack_rows(&a, rows) };
        let panels = n.div_ceil(PANEL);
        for index in 0..panels {
            for first in (0..k).step_by(depth) {
                let length = depth.min(k - first);
                let last = first + length == k;
                // SAFETY: as above; `first + length <= k`.
                unsafe { pack_panel(&b, index, first..first + length, panel) };
                for (block, i) in (0..m).step_by(ROWS).enumerate() {
                    // While this slice's blocks run, the next slice comes into the caches.
                    if !last {
                        prefetch_rows_share(&b, index, first + length..(first + length + depth).min(k), block, blocks);
                    } else if index + 1 < panels {
                        prefetch_rows_share(&b, index + 1, 0..depth, block, blocks);
                    }
                    let out: &mut [f32; ROWS * PANEL] = if sliced {
                        let out = &mut sums[block * ROWS * PANEL..][..ROWS * PANEL];
                        out.try_into().unwrap_or_else(|_| unreachable!("a block's sums hold ROWS × PANEL values"))
                    } else {
                        &mut single
                    };
                    let count = (m - i).min(ROWS);
                    // One pointer to the block's sums, for reading and for writing them.
                    let sums_at = out.as_mut_ptr();
                    let carried = (first > 0).then_some(sums_at.cast_const());
                    // The last slice of a block of whole rows of a panel stores its sums
                    // into `c` itself where `c`'s rows are contiguous.
                    let (row_stride, unit) = (c.strides()[0], c.strides()[1] == 1);
                    let direct = last && unit && row_stride >= 0 && (n - index * PANEL) >= PANEL;
                    let (to, to_stride) = if direct {
                        // SAFETY: rows `i .. i + count` and columns `index · PANEL ..` plus
                        // PANEL lie inside `c` (checked just above), its rows `row_stride`
                        // apart and its columns contiguous.
                        (unsafe { c.as_mut_ptr().add(i * row_stride as usize + index * PANEL) }, row_stride as usize)
                    } else {
                        (sums_at, PANEL)
                    };
                    // SAFETY: `available()` was checked by the caller; from `i * k + first`,
                    // `rows` holds `count` rows `k` apart of at least `length` values (the
                    // last row's `k - first`), `panel` holds `length` rows of `PANEL`
                    // values, `carried` the block's `count` rows of sums, and `to` has room
                    // for `count` rows `to_stride` apart of `PANEL` values.
                    unsafe {
                        microkernel(&rows[i * k + first..], k, length, count, panel, carried, to, to_stride);
                    }
                    if last && !direct {
                        copy_block(out, &mut c, i, count, index);
                    }
                }
            }
        }
    });
}

/// `x` rounded to bf16 (to nearest even), as f32; NaN stays NaN.
fn round_bf16(x: f32) -> f32 {
    if x.is_nan() { x } else { super::round_mantissa(x, 16) }
}

/// 16 lanes rounded to bf16 (to nearest even), as f32; NaN lanes stay as they are.
///
/// # Safety
///
/// The CPU has AVX512F.
#[target_feature(enable = "avx512f")]
unsafe fn round_bf16x16(x: __m512) -> __m512 {
    let bits = _mm512_castps_si512(x);
    let odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    let biased = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    let rounded = _mm512_castsi512_ps(_mm512_and_si512(biased, _mm512_set1_epi32(0xffff_0000_u32 as i32)));
    let nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    _mm512_mask_blend_ps(nan, rounded, x)
}

/// The offsets of 16 values `stride` apart, for a gather; `None` where they do not fit
/// in 32 bits.
#[target_feature(enable = "avx512f")]
fn offsets(stride: isize) -> Option<__m512i> {
    let stride = i32::try_from(stride).ok().filter(|s| s.checked_mul(15).is_some())?;
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    Some(_mm512_mullo_epi32(lanes, _mm512_set1_epi32(stride)))
}

/// `a`'s rows, rounded, one after the other into `rows` (every value written).
/// Contiguous rows round 16 values at a time.
///
/// # Safety
///
/// The CPU has AVX512F.
#[target_feature(enable = "avx512f")]
unsafe fn pack_rows(a: &ndarray::ArrayView2<'_, f32>, rows: &mut [f32]) {
    let k = a.dim().1;
    if a.strides()[0] == 1
        && let Some(offsets) = offsets(a.strides()[1])
    {
        // A transposed matrix (its columns contiguous): each row's values gathered 16
        // at a time.
        for (i, packed) in rows.chunks_mut(k.max(1)).take(a.dim().0).enumerate() {
            let mut p = 0;
            while p + 16 <= k {
                // SAFETY: `a[[i, p + l]]` for `l < 16` lies in `a` (`p + 16 <= k`), at
                // `i + (p + l) · stride` from its first element, and `packed` holds `k`
                // values.
                unsafe {
                    let at = a.as_ptr().offset(i as isize + p as isize * a.strides()[1]);
                    let x = round_bf16x16(_mm512_i32gather_ps::<4>(offsets, at));
                    _mm512_storeu_ps(packed.as_mut_ptr().add(p), x);
                }
                p += 16;
            }
            for (p, value) in packed.iter_mut().enumerate().skip(p) {
                *value = round_bf16(a[[i, p]]);
            }
        }
        return;
    }
    for (row, packed) in a.rows().into_iter().zip(rows.chunks_mut(k.max(1))) {
        let mut p = 0;
        if let Some(row) = row.as_slice() {
            while p + 16 <= k {
                // SAFETY: elements `p .. p + 16` are in both the row and `packed`.
                unsafe {
                    let x = round_bf16x16(_mm512_loadu_ps(row.as_ptr().add(p)));
                    _mm512_storeu_ps(packed.as_mut_ptr().add(p), x);
                }
                p += 16;
            }
        }
        for (p, value) in packed.iter_mut().enumerate().skip(p) {
            *value = round_bf16(row[p]);
        }
    }
}

/// Columns `index · PANEL ..` of rows `rows` of `b`, rounded, into `panel`: a row of
/// [`PANEL`] values for each (zero past the last column of `b`; every value of those
/// rows written). Contiguous rows round 16 columns at a time.
///
/// # Safety
///
/// The CPU has AVX512F; `rows` lies within `b`'s rows.
#[target_feature(enable = "avx512f")]
unsafe fn pack_panel(b: &ndarray::ArrayView2<'_, f32>, index: usize, rows: std::ops::Range<usize>, panel: &mut [f32]) {
    let n = b.dim().1;
    let first = index * PANEL;
    let columns = (n - first).min(PANEL);
    let panel = &mut panel[..rows.len() * PANEL];
    if columns < PANEL {
        panel.fill(0.0);
    }
    if b.strides()[0] == 1
        && let Some(offsets) = offsets(b.strides()[1])
    {
        // A transposed matrix (its columns contiguous): each row's values gathered 16
        // at a time.
        for (p, out) in rows.zip(panel.chunks_exact_mut(PANEL)) {
            let mut j = 0;
            while j + 16 <= columns {
                // SAFETY: `b[[p, first + j + l]]` for `l < 16` lies in `b` (`first + j +
                // 16 <= n`), at `p + (first + j + l) · stride` from its first element, and
                // `j + 16 <= PANEL`.
                unsafe {
                    let at = b.as_ptr().offset(p as isize + (first + j) as isize * b.strides()[1]);
                    let x = round_bf16x16(_mm512_i32gather_ps::<4>(offsets, at));
                    _mm512_storeu_ps(out.as_mut_ptr().add(j), x);
                }
                j += 16;
            }
            for j in j..columns {
                out[j] = round_bf16(b[[p, first + j]]);
            }
        }
        return;
    }
    for (p, out) in rows.zip(panel.chunks_exact_mut(PANEL)) {
        let row = b.row(p);
        let mut j = 0;
        if let Some(row) = row.as_slice() {
            while j + 16 <= columns {
                // SAFETY: `first + j + 16 <= n`, the row's length, and `j + 16 <= PANEL`.
                unsafe {
                    let x = round_bf16x16(_mm512_loadu_ps(row.as_ptr().add(first + j)));
                    _mm512_storeu_ps(out.as_mut_ptr().add(j), x);
                }
                j += 16;
            }
        }
        for j in j..columns {
            out[j] = round_bf16(row[first + j]);
        }
    }
}

/// One block of up to [`ROWS`] rows by [`PANEL`] columns over one slice of `k`, into
/// `to`'s rows: `Σ_p a[r · stride + p] · b[p][j]` for `p < depth`, plus the sums of the
/// slices before from `carried` (rows of [`PANEL`] values) where there were any.
///
/// # Safety
///
/// The CPU has AVX512F; `a` holds `rows` rows `stride` apart of `depth` values each,
/// `b` holds `depth` rows of [`PANEL`] values, `carried` (if any) `rows` rows of
/// [`PANEL`] values, and `to` has room for `rows` rows `to_stride` apart of [`PANEL`]
/// values (which may be `carried`'s).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn microkernel(
    a: &[f32],
    stride: usize,
    depth: usize,
    rows: usize,
    b: &[f32],
    carried: Option<*const f32>,
    to: *mut f32,
    to_stride: usize,
) {
    // The row count is a constant in each copy of the loop, which keeps every sum in a
    // register. SAFETY: as this function's.
    unsafe { with_row_count!(rows, rows_of(a, stride, depth, b, carried, to, to_stride)) }
}

/// [`microkernel`] for `R` rows.
///
/// # Safety
///
/// As [`microkernel`]'s, with `R` rows.
#[target_feature(enable = "avx512f")]
unsafe fn rows_of<const R: usize>(
    a: &[f32],
    stride: usize,
    depth: usize,
    b: &[f32],
    carried: Option<*const f32>,
    to: *mut f32,
    to_stride: usize,
) {
    debug_assert!(R <= ROWS && a.len() >= (R - 1) * stride + depth && b.len() >= depth * PANEL);
    let mut acc = [[_mm512_setzero_ps(); PANEL / 16]; R];
    if let Some(carried) = carried {
        for (r, sums) in acc.iter_mut().enumerate() {
            for (q, sum) in sums.iter_mut().enumerate() {
                // SAFETY: `carried` row `r < R` has PANEL floats from `r * PANEL`.
                *sum = unsafe { _mm512_loadu_ps(carried.add(r * PANEL + q * 16)) };
            }
        }
    }
    for p in 0..depth {
        let mut columns = [_mm512_setzero_ps(); PANEL / 16];
        for (q, vector) in columns.iter_mut().enumerate() {
            // SAFETY: row `p` of `b` holds PANEL values; `q * 16 + 16 <= PANEL`.
            *vector = unsafe { _mm512_loadu_ps(b.as_ptr().add(p * PANEL + q * 16)) };
        }
        for (r, sums) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R` of `a` holds `depth` values from `r * stride`.
            let value = _mm512_set1_ps(unsafe { *a.as_ptr().add(r * stride + p) });
            for (sum, vector) in sums.iter_mut().zip(&columns) {
                *sum = _mm512_fmadd_ps(value, *vector, *sum);
            }
        }
    }
    for (r, sums) in acc.iter().enumerate() {
        for (q, sum) in sums.iter().enumerate() {
            // SAFETY: `to` row `r < R` has room for PANEL floats from `r * to_stride`.
            unsafe { _mm512_storeu_ps(to.add(r * to_stride + q * 16), *sum) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_exact_sums_of_bf16_products() {
        if !available() {
            eprintln!("skipped the rounded_f32 kernel: this CPU has no AVX-512F");
            return;
        }
        super::super::packed::check_against_exact_sums(
            gemm_rounded_f32,
            &[
                (1, 1, 1),
                (3, 7, 5),
                (5, 64, 65),
                (9, 33, 130),
                (4, 2, 64),
                (6, 97, 20),
                (7, 40, 17),
                (13, 300, 70),
                (6, 129, 64),
                (3, 0, 5),
            ],
        );
    }

    #[test]
    fn rounding_sixteen_lanes_matches_one_at_a_time() {
        if !available() {
            eprintln!("skipped the rounded_f32 kernel: this CPU has no AVX-512F");
            return;
        }
        let values: Vec<f32> = [1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5e-39, f32::MAX, f32::INFINITY]
            .into_iter()
            .chain([f32::NAN, -0.0, 2.7182817, 65504.0, 1e-45, -1e30, 0.1, 0.2, 0.3, 7.0])
            .collect();
        let mut out = [0f32; 16];
        // SAFETY: `available()` was checked; both arrays hold 16 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), round_bf16x16(_mm512_loadu_ps(values.as_ptr()))) };
        for (x, y) in values.iter().zip(out) {
            let expected = half::bf16::from_f32(*x).to_f32();
            assert!(y.to_bits() == expected.to_bits() || (x.is_nan() && y.is_nan()), "{x} → {y}, not {expected}");
        }
    }
}
