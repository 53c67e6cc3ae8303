//! What the two packed matrix-product kernels share (`bf16.rs` on bf16 products,
//! `rounded_f32.rs` on f32 multiply-adds): the block shape, and the walk over `c` that
//! hands each block of [`ROWS`] rows by [`PANEL`] columns to a microkernel and copies
//! the block into place.

/// Columns of `b` per packed panel: four vectors of 16.
pub(super) const PANEL: usize = 64;
/// Rows of `c` per microkernel block.
pub(super) const ROWS: usize = 4;

/// Fills `c` block by block. `rows` holds `a` packed, `depth` values per row; `panels`
/// holds `b` packed, each panel `depth` rows of [`PANEL`] values. `block(a, depth,
/// count, panel, out)` computes the `count` rows of one block into `out`.
pub(super) fn by_blocks<T>(
    rows: &[T],
    panels: &[T],
    depth: usize,
    mut c: ndarray::ArrayViewMut2<'_, f32>,
    block: impl Fn(&[T], usize, usize, &[T], &mut [f32; ROWS * PANEL]),
) {
    let (m, n) = c.dim();
    let mut out = [0f32; ROWS * PANEL];
    for panel in 0..n.div_ceil(PANEL) {
        let columns = (n - panel * PANEL).min(PANEL);
        let packed = &panels[panel * depth * PANEL..][..depth * PANEL];
        for i in (0..m).step_by(ROWS) {
            let count = (m - i).min(ROWS);
            block(&rows[i * depth..][..count * depth], depth, count, packed, &mut out);
            for r in 0..count {
                let mut row = c.row_mut(i + r);
                let values = &out[r * PANEL..][..columns];
                match row.as_slice_mut() {
                    Some(row) => row[panel * PANEL..][..columns].copy_from_slice(values),
                    None => values.iter().enumerate().for_each(|(j, v)| row[panel * PANEL + j] = *v),
                }
            }
        }
    }
}
