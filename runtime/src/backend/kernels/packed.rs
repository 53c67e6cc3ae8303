//! What the two packed matrix-product kernels share (`bf16.rs` on bf16 products,
//! `rounded_f32.rs` on f32 multiply-adds): the block shape, and the walk over `c` that
//! packs each panel of [`PANEL`] columns of `b` just before its blocks, hands each block
//! of [`ROWS`] rows by [`PANEL`] columns to a microkernel and copies the block into
//! place, and the packing buffers each thread keeps between products.

use std::arch::x86_64::{__m512, _mm512_storeu_ps};
use std::cell::Cell;

/// Columns of `b` per packed panel: four vectors of 16.
pub(super) const PANEL: usize = 64;
/// Rows of `c` per microkernel block.
pub(super) const ROWS: usize = 6;

/// Fills `c` block by block, one panel of [`PANEL`] columns at a time. While a panel's
/// blocks are computed, the next panel's part of `source` (`b`) is prefetched, a share
/// before each block, so that packing it reads the caches, not memory. `rows` holds `a`
/// packed, `depth` values per row; `pack_panel(index, panel)` packs panel `index` of `b`
/// into `panel` (`depth` rows of [`PANEL`] values, every value written) just before its
/// blocks, so the packed panel is still in the caches when they read it. `block(a,
/// depth, count, panel, out)` computes the `count` rows of one block into `out`.
pub(super) fn by_blocks<T>(
    source: &ndarray::ArrayView2<'_, f32>,
    rows: &[T],
    depth: usize,
    panel: &mut [T],
    mut c: ndarray::ArrayViewMut2<'_, f32>,
    mut pack_panel: impl FnMut(usize, &mut [T]),
    block: impl Fn(&[T], usize, usize, &[T], &mut [f32; ROWS * PANEL]),
) {
    let (m, n) = c.dim();
    let mut out = [0f32; ROWS * PANEL];
    let panels = n.div_ceil(PANEL);
    let blocks = m.div_ceil(ROWS);
    for index in 0..panels {
        pack_panel(index, panel);
        for i in (0..m).step_by(ROWS) {
            let count = (m - i).min(ROWS);
            if index + 1 < panels {
                prefetch_share(source, index + 1, i / ROWS, blocks);
            }
            block(&rows[i * depth..][..count * depth], depth, count, panel, &mut out);
            copy_block(&out, &mut c, i, count, index);
        }
    }
}

/// Copies the first `count` rows of `block` into rows `i ..` of `c`, in the columns of
/// panel `index` (those `c` has).
pub(super) fn copy_block(
    block: &[f32; ROWS * PANEL],
    c: &mut ndarray::ArrayViewMut2<'_, f32>,
    i: usize,
    count: usize,
    index: usize,
) {
    let columns = (c.dim().1 - index * PANEL).min(PANEL);
    for r in 0..count {
        let mut row = c.row_mut(i + r);
        let values = &block[r * PANEL..][..columns];
        match row.as_slice_mut() {
            Some(row) => row[index * PANEL..][..columns].copy_from_slice(values),
            None => values.iter().enumerate().for_each(|(j, v)| row[index * PANEL + j] = *v),
        }
    }
}

/// Prefetches share `share` of `blocks` of the rows of panel `index` of `b` (its
/// [`PANEL`] columns) into the second-level cache.
fn prefetch_share(b: &ndarray::ArrayView2<'_, f32>, index: usize, share: usize, blocks: usize) {
    prefetch_rows_share(b, index, 0..b.dim().0, share, blocks);
}

/// Prefetches share `share` of `blocks` of rows `rows` of panel `index` of `b` (its
/// [`PANEL`] columns) into the second-level cache.
pub(super) fn prefetch_rows_share(
    b: &ndarray::ArrayView2<'_, f32>,
    index: usize,
    rows: std::ops::Range<usize>,
    share: usize,
    blocks: usize,
) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    let n = b.dim().1;
    let first = index * PANEL;
    let columns = (n - first).min(PANEL);
    let per_share = rows.len().div_ceil(blocks.max(1));
    let stride = b.strides()[0];
    if b.strides()[1] != 1 || columns == 0 {
        return;
    }
    let from = rows.start + share * per_share;
    for p in (from..(from + per_share).min(rows.end)).rev() {
        // Addresses only: a prefetch never faults, and these are inside `b`.
        let row = b.as_ptr().wrapping_offset(p as isize * stride).wrapping_add(first);
        for j in (0..columns).step_by(16) {
            // SAFETY: prefetching reads nothing the program sees and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(j).cast()) };
        }
    }
}

/// The largest packing buffer (in 4-byte values) a thread keeps for its next product:
/// 16 MiB. Larger ones are freed after their product, whose work dwarfs the allocation.
const SCRATCH_KEPT: usize = 4 << 20;

thread_local! {
    /// This thread's packing buffers, for `a` and for `b`.
    static SCRATCH: Cell<[Vec<u32>; 2]> = Cell::default();
}

/// Runs `pack_and_multiply` with two buffers of `rows` and `panel` values, kept by
/// this thread from one product to the next: packing then writes into memory already
/// mapped and in the caches instead of fresh zeroed pages, which cost up to a fifth of
/// a product's time. The buffers hold what the previous product left: the caller writes
/// every value it reads.
pub(super) fn with_scratch<R>(
    rows: usize,
    panel: usize,
    pack_and_multiply: impl FnOnce(&mut [u32], &mut [u32]) -> R,
) -> R {
    let [mut a, mut b] = SCRATCH.take();
    for (buffer, len) in [(&mut a, rows), (&mut b, panel)] {
        if buffer.len() < len {
            buffer.resize(len, 0);
        }
    }
    let result = pack_and_multiply(&mut a[..rows], &mut b[..panel]);
    let kept = |buffer: Vec<u32>| if buffer.len() <= SCRATCH_KEPT { buffer } else { Vec::new() };
    SCRATCH.set([kept(a), kept(b)]);
    result
}

/// Calls `$kernel::<R>(args…)` with `R` the row count `$rows` (1 to [`ROWS`]) as a
/// constant: each copy of a microkernel's loop then keeps every sum in a register.
macro_rules! with_row_count {
    ($rows:expr, $kernel:ident($($arg:expr),* $(,)?)) => {
        match $rows {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            5 => $kernel::<5>($($arg),*),
            _ => $kernel::<{ super::packed::ROWS }>($($arg),*),
        }
    };
}
pub(super) use with_row_count;

/// Checks a kernel of products of bf16-rounded operands, `gemm`, against the exact sums
/// of the bf16 products (in f64) over `shapes` (m, k, n), through contiguous,
/// transposed and reversed (strided) operands, into `c` contiguous, transposed, and a
/// block of columns of a wider array (whose other columns must stay untouched): every
/// element written, each within k units of f32's last place of the sum of its terms'
/// magnitudes (f32 sums of k terms in any order).
#[cfg(test)]
pub(super) fn check_against_exact_sums(gemm: super::matrix::Gemm<f32>, shapes: &[(usize, usize, usize)]) {
    use ndarray::{Array2, s};
    for &(m, k, n) in shapes {
        let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 7 + j * 3) % 13) as f32 * 0.37 - 1.9);
        let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 5 + j * 11) % 17) as f32 * 0.23 - 1.7);
        let bf16 = |x: f32| f64::from(half::bf16::from_f32(x).to_f32());
        // Copies in row-major order of the transposes (`to_owned` would keep the order).
        let (at, bt) = (a.t().as_standard_layout().into_owned(), b.t().as_standard_layout().into_owned());
        // Operands contiguous, transposed, reversed along one axis (rows read backwards
        // or in reverse order), and transposed and reversed (a gather's negative steps).
        let operands = [
            (a.view(), b.view()),
            (at.t(), bt.t()),
            (a.slice(s![.., ..;-1]), b.slice(s![..;-1, ..])),
            (at.t().slice_move(s![.., ..;-1]), bt.t().slice_move(s![.., ..;-1])),
        ];
        for (a, b) in operands {
            let mut contiguous = Array2::from_elem((m, n), f32::NAN);
            let mut transposed = Array2::from_elem((n, m), f32::NAN);
            let mut wider = Array2::from_elem((m, n + 3), f32::NAN);
            gemm(a.view(), b, contiguous.view_mut());
            gemm(a.view(), b, transposed.view_mut().reversed_axes());
            gemm(a.view(), b, wider.slice_mut(s![.., 1..n + 1]));
            assert!(wider.column(0).iter().chain(wider.slice(s![.., n + 1..])).all(|x| x.is_nan()), "{m}x{k}x{n}");
            for (c, layout) in [
                (contiguous.view(), "contiguous"),
                (transposed.t(), "transposed"),
                (wider.slice(s![.., 1..n + 1]), "wider"),
            ] {
                for i in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k).map(|p| bf16(a[[i, p]]) * bf16(b[[p, j]])).sum();
                        let magnitude: f64 = (0..k).map(|p| (bf16(a[[i, p]]) * bf16(b[[p, j]])).abs()).sum();
                        let bound = (k as f64 * f64::from(f32::EPSILON) * magnitude).max(1e-6);
                        assert!(
                            (f64::from(c[[i, j]]) - exact).abs() <= bound,
                            "{m}x{k}x{n} into {layout} at {i},{j}: {} against {exact}",
                            c[[i, j]]
                        );
                    }
                }
            }
        }
    }
}

/// Stores a microkernel's sums, `R` rows of [`PANEL`] columns, into `block`.
///
/// # Safety
///
/// The CPU has AVX512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_sums<const R: usize>(sums: &[[__m512; PANEL / 16]; R], block: &mut [f32; ROWS * PANEL]) {
    const { assert!(R <= ROWS) };
    for (r, row) in sums.iter().enumerate() {
        for (q, sum) in row.iter().enumerate() {
            // SAFETY: block row `r < ROWS` has PANEL floats from `r * PANEL`.
            unsafe { _mm512_storeu_ps(block.as_mut_ptr().add(r * PANEL + q * 16), *sum) };
        }
    }
}
