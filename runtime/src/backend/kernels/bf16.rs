//! Matrix products of f32 operands rounded to bf16 (`--auto-cast matmult`, the
//! default), with f32 accumulation, on the AVX512-BF16 instructions of the host when
//! it has them: `vdpbf16ps` multiplies 32 pairs of bf16 and adds them into 16 f32 lanes,
//! twice the multiply-adds of an f32 FMA.
//!
//! The operands are rounded to bf16 (to nearest, ties to even, as `RoundPrecision`
//! does) while they are packed: `a`'s rows as pairs of neighbours along `k`, `b` one
//! panel of 64 columns at a time, each element a pair of rows `2p` and `2p + 1`. A microkernel
//! then computes a block of 6 rows by 64 columns of `c` over all of `k`, in 24
//! registers. Each product of two bf16 is exact in f32, so the result differs from the
//! f32 path only in the order of the additions. The AMX kernel (`amx.rs`) packs its
//! operands with the same functions.

use std::arch::x86_64::*;

use super::packed::{PANEL, ROWS, by_blocks, store_sums, with_row_count, with_scratch};

/// Whether this CPU runs [`gemm_bf16`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// `c = bf16(a) · bf16(b)`, accumulated in f32; every element of `c` is written. The
/// caller checks [`available`] first.
pub(super) fn gemm_bf16(
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (m, k, n) = super::product_dims(&a, &b, &c);
    if m == 0 || n == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    with_scratch(m * kp, kp * PANEL, |a_pairs, panel| {
        // SAFETY: `available()` was checked by the caller.
        unsafe { pack_rows(&a, kp, kp, a_pairs) };
        // SAFETY: as above.
        let pack_panel = |index, panel: &mut [u32]| unsafe { pack_panel(&b, kp, index, panel) };
        by_blocks(&b, a_pairs, kp, panel, c, pack_panel, |a, kp, rows, b, out| {
            // SAFETY: `available()` was checked by the caller; `a` holds `rows` rows of
            // `kp` pairs, and `b` `kp` rows of `PANEL` pairs.
            unsafe { microkernel(a, kp, rows, b, out) }
        });
    });
}

/// The bf16 bits of `x`, rounded to nearest even (NaN stays a quiet NaN).
fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) | 0x40;
    }
    bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16
}

/// `a`'s rows into `pairs`, `width` pairs each (`width ≥ kp`): elements `2p` (low
/// half) and `2p + 1` (high half, zero past the end of the row), then zeros; every pair
/// of the rows written. Contiguous rows convert 32 elements at a time.
///
/// # Safety
///
/// The CPU has AVX512F, AVX512BW and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_rows(a: &ndarray::ArrayView2<'_, f32>, kp: usize, width: usize, pairs: &mut [u32]) {
    let k = a.dim().1;
    for (row, packed) in a.rows().into_iter().zip(pairs.chunks_mut(width.max(1))) {
        let (packed, padding) = packed.split_at_mut(kp);
        padding.fill(0);
        let mut p = 0;
        if let Some(row) = row.as_slice() {
            while 2 * p + 32 <= k {
                // SAFETY: elements `2p .. 2p + 32` are in the row, and pairs `p .. p + 16`
                // in `packed`.
                unsafe {
                    let low = _mm512_loadu_ps(row.as_ptr().add(2 * p));
                    let high = _mm512_loadu_ps(row.as_ptr().add(2 * p + 16));
                    // The 32 bf16 in element order: pairs of neighbours, low half first.
                    let bf16 = _mm512_cvtne2ps_pbh(high, low);
                    _mm512_storeu_si512(packed.as_mut_ptr().add(p).cast(), bits32x16(bf16));
                }
                p += 16;
            }
        }
        for (p, pair) in packed.iter_mut().enumerate().skip(p) {
            let high = if 2 * p + 1 < k { bf16_bits(row[2 * p + 1]) } else { 0 };
            *pair = bf16_bits(row[2 * p]) | high << 16;
        }
    }
}

/// Columns `index · PANEL ..` of `b` into `panel`: `kp` rows of [`PANEL`] pairs of rows
/// `2p` and `2p + 1` (zero past the end of `b`; every pair written). Contiguous rows
/// convert 16 columns at a time.
///
/// # Safety
///
/// The CPU has AVX512F, AVX512BW and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_panel(b: &ndarray::ArrayView2<'_, f32>, kp: usize, index: usize, panel: &mut [u32]) {
    let (k, n) = b.dim();
    let first = index * PANEL;
    let columns = (n - first).min(PANEL);
    if columns < PANEL {
        panel.fill(0);
    }
    for (p, out) in panel.chunks_exact_mut(PANEL).take(kp).enumerate() {
        let low = b.row(2 * p);
        let high = (2 * p + 1 < k).then(|| b.row(2 * p + 1));
        let contiguous = (low.as_slice(), high.as_ref().map(|h| h.as_slice()));
        let mut j = 0;
        if let (Some(low), None | Some(Some(_))) = contiguous {
            let high = contiguous.1.flatten();
            while j + 16 <= columns {
                // SAFETY: `first + j + 16 <= n`, the length of both rows, and
                // `j + 16 <= PANEL`.
                unsafe {
                    let lo = _mm512_loadu_ps(low.as_ptr().add(first + j));
                    let hi = match high {
                        Some(high) => _mm512_loadu_ps(high.as_ptr().add(first + j)),
                        None => _mm512_setzero_ps(),
                    };
                    let l = bits16x16(_mm512_cvtneps_pbh(lo));
                    let h = bits16x16(_mm512_cvtneps_pbh(hi));
                    let pairs =
                        _mm512_or_si512(_mm512_cvtepu16_epi32(l), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                    _mm512_storeu_si512(out.as_mut_ptr().add(j).cast(), pairs);
                }
                j += 16;
            }
        }
        for j in j..columns {
            let h = high.as_ref().map_or(0, |row| bf16_bits(row[first + j]));
            out[j] = bf16_bits(low[first + j]) | h << 16;
        }
    }
}

/// One block of up to [`ROWS`] rows by [`PANEL`] columns: `block[r][j] = Σ_p a[r][p] ·
/// b[p][j]` over the pairs.
///
/// # Safety
///
/// The CPU has AVX512F and AVX512-BF16; `a` holds `rows` rows of `kp` pairs and `b`
/// holds `kp` rows of [`PANEL`] pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn microkernel(a: &[u32], kp: usize, rows: usize, b: &[u32], block: &mut [f32; ROWS * PANEL]) {
    // The row count is a constant in each copy of the loop, which keeps every sum in a
    // register. SAFETY: as this function's.
    unsafe { with_row_count!(rows, rows_of(a, kp, b, block)) }
}

/// [`microkernel`] for `R` rows.
///
/// # Safety
///
/// The CPU has AVX512F and AVX512-BF16; `a` holds `R` rows of `kp` pairs and `b` holds
/// `kp` rows of [`PANEL`] pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn rows_of<const R: usize>(a: &[u32], kp: usize, b: &[u32], block: &mut [f32; ROWS * PANEL]) {
    debug_assert!(R <= ROWS && a.len() >= R * kp && b.len() >= kp * PANEL);
    let mut acc = [[_mm512_setzero_ps(); PANEL / 16]; R];
    for p in 0..kp {
        let mut columns = [_mm512_setzero_si512(); PANEL / 16];
        for (q, vector) in columns.iter_mut().enumerate() {
            // SAFETY: row `p` of `b` holds PANEL pairs; `q * 16 + 16 <= PANEL`.
            *vector = unsafe { _mm512_loadu_si512(b.as_ptr().add(p * PANEL + q * 16).cast()) };
        }
        for (r, sums) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R` of `a` holds `kp` pairs.
            let pair = _mm512_set1_epi32(unsafe { *a.as_ptr().add(r * kp + p) } as i32);
            for (sum, vector) in sums.iter_mut().zip(&columns) {
                *sum = _mm512_dpbf16_ps(*sum, bf16x32(pair), bf16x32(*vector));
            }
        }
    }
    // SAFETY: the CPU has AVX512F.
    unsafe { store_sums(&acc, block) };
}

/// The same 512 bits as 32 bf16.
#[inline(always)]
fn bf16x32(v: __m512i) -> __m512bh {
    // SAFETY: both types are 512 bits of plain data, valid for every bit pattern.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// The same 512 bits as 16 integers of 32 bits.
#[inline(always)]
fn bits32x16(v: __m512bh) -> __m512i {
    // SAFETY: both types are 512 bits of plain data, valid for every bit pattern.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// The same 256 bits as 16 integers of 16 bits.
#[inline(always)]
fn bits16x16(v: __m256bh) -> __m256i {
    // SAFETY: both types are 256 bits of plain data, valid for every bit pattern.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_exact_sums_of_bf16_products() {
        if !available() {
            eprintln!("skipped the bf16 kernel: this CPU has no AVX512-BF16");
            return;
        }
        super::super::packed::check_against_exact_sums(
            gemm_bf16,
            &[(1, 1, 1), (3, 7, 5), (5, 64, 65), (9, 33, 130), (4, 2, 64), (6, 97, 20)],
        );
    }
}
