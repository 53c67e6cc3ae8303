//! Matrix products of f32 operands rounded to bf16, accumulated in f32, on f32
//! multiply-adds (AVX-512F): the kernel for `--auto-cast matmult` on hosts whose bf16
//! products are no faster than f32 (see `matrix::product_kernel`).
//!
//! The operands are rounded (to nearest, ties to even, as `RoundPrecision` does) while
//! they are packed, which the product does anyway, so rounding costs no pass over the
//! operands of its own: `a`'s rows contiguous, `b` one panel of 64 columns at a time. A
//! microkernel then computes a block of 6 rows by 64 columns of `c` over all of `k`, in
//! 24 registers. Each product of two bf16 is exact in f32, so the result differs from
//! the bf16 kernel's only in the order of the additions.

use std::arch::x86_64::*;

use super::packed::{PANEL, ROWS, by_blocks, store_sums, with_row_count, with_scratch};

/// Whether this CPU runs [`gemm_rounded_f32`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// `c = bf16(a) · bf16(b)`, accumulated in f32 on f32 multiply-adds; every element of
/// `c` is written. The caller checks [`available`] first.
pub(super) fn gemm_rounded_f32(
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (m, k, n) = super::product_dims(&a, &b, &c);
    if m == 0 || n == 0 {
        return;
    }
    with_scratch(m * k, k * PANEL, |rows, panel| {
        let (rows, panel) = (bytemuck::cast_slice_mut(rows), bytemuck::cast_slice_mut(panel));
        // SAFETY: `available()` was checked by the caller.
        unsafe { pack_rows(&a, rows) };
        // SAFETY: as above.
        let pack_panel = |index, panel: &mut [f32]| unsafe { pack_panel(&b, index, panel) };
        by_blocks(&b, rows, k, panel, c, pack_panel, |a, k, count, b, out| {
            // SAFETY: `available()` was checked by the caller; `a` holds `count` rows of
            // `k` values, and `b` `k` rows of `PANEL` values.
            unsafe { microkernel(a, k, count, b, out) }
        });
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

/// `a`'s rows, rounded, one after the other into `rows` (every value written).
/// Contiguous rows round 16 values at a time.
///
/// # Safety
///
/// The CPU has AVX512F.
#[target_feature(enable = "avx512f")]
unsafe fn pack_rows(a: &ndarray::ArrayView2<'_, f32>, rows: &mut [f32]) {
    let k = a.dim().1;
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

/// Columns `index · PANEL ..` of `b`, rounded, into `panel`: `k` rows of [`PANEL`]
/// values (zero past the last column of `b`; every value written). Contiguous rows
/// round 16 columns at a time.
///
/// # Safety
///
/// The CPU has AVX512F.
#[target_feature(enable = "avx512f")]
unsafe fn pack_panel(b: &ndarray::ArrayView2<'_, f32>, index: usize, panel: &mut [f32]) {
    let (k, n) = b.dim();
    let first = index * PANEL;
    let columns = (n - first).min(PANEL);
    if columns < PANEL {
        panel.fill(0.0);
    }
    for (p, out) in panel.chunks_exact_mut(PANEL).take(k).enumerate() {
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

/// One block of up to [`ROWS`] rows by [`PANEL`] columns: `block[r][j] = Σ_p a[r][p] ·
/// b[p][j]`.
///
/// # Safety
///
/// The CPU has AVX512F; `a` holds `rows` rows of `k` values and `b` holds `k` rows of
/// [`PANEL`] values.
#[target_feature(enable = "avx512f")]
unsafe fn microkernel(a: &[f32], k: usize, rows: usize, b: &[f32], block: &mut [f32; ROWS * PANEL]) {
    // The row count is a constant in each copy of the loop, which keeps every sum in a
    // register. SAFETY: as this function's.
    unsafe { with_row_count!(rows, rows_of(a, k, b, block)) }
}

/// [`microkernel`] for `R` rows.
///
/// # Safety
///
/// The CPU has AVX512F; `a` holds `R` rows of `k` values and `b` holds `k` rows of
/// [`PANEL`] values.
#[target_feature(enable = "avx512f")]
unsafe fn rows_of<const R: usize>(a: &[f32], k: usize, b: &[f32], block: &mut [f32; ROWS * PANEL]) {
    debug_assert!(R <= ROWS && a.len() >= R * k && b.len() >= k * PANEL);
    let mut acc = [[_mm512_setzero_ps(); PANEL / 16]; R];
    for p in 0..k {
        let mut columns = [_mm512_setzero_ps(); PANEL / 16];
        for (q, vector) in columns.iter_mut().enumerate() {
            // SAFETY: row `p` of `b` holds PANEL values; `q * 16 + 16 <= PANEL`.
            *vector = unsafe { _mm512_loadu_ps(b.as_ptr().add(p * PANEL + q * 16)) };
        }
        for (r, sums) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R` of `a` holds `k` values.
            let value = _mm512_set1_ps(unsafe { *a.as_ptr().add(r * k + p) });
            for (sum, vector) in sums.iter_mut().zip(&columns) {
                *sum = _mm512_fmadd_ps(value, *vector, *sum);
            }
        }
    }
    // SAFETY: the CPU has AVX512F.
    unsafe { store_sums(&acc, block) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_exact_sums_of_bf16_products() {
        if !available() {
            return;
        }
        super::super::packed::check_against_exact_sums(
            gemm_rounded_f32,
            &[(1, 1, 1), (3, 7, 5), (5, 64, 65), (9, 33, 130), (4, 2, 64), (6, 97, 20), (7, 40, 17)],
        );
    }

    #[test]
    fn rounding_sixteen_lanes_matches_one_at_a_time() {
        if !available() {
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
