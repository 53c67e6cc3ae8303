//! Matrix products of f32 operands rounded to bf16 (`--auto-cast matmult`, the
//! default), with f32 accumulation, on the AMX tiles of Intel Xeon CPUs from Sapphire
//! Rapids on: `tdpbf16ps` multiplies a tile of 16 rows by 32 bf16 with one of 32 bf16 by
//! 16 columns and adds the products into 16 × 16 f32 sums, 8,192 multiply-adds in one
//! instruction.
//!
//! The operands are packed as the AVX512-BF16 kernel packs them (`bf16.rs`): `a`'s rows
//! as pairs of neighbours along `k`, `b` one panel of 64 columns at a time, each element
//! a pair of rows `2p` and `2p + 1`. That is the layout the tiles load: a tile of `a` is
//! 16 packed rows of 16 pairs, a tile of `b` 16 panel rows of 16 pairs. Both are padded
//! with zeros to whole tiles along `k`, and `a` to whole blocks of rows. A block of 32
//! rows by 32 columns of `c` is computed over all of `k` in four tiles of sums, from two
//! tiles of `a` and two of `b` at a time, then copied into place. Each product of two
//! bf16 is exact in f32, so the result differs from the other kernels' only in the order
//! of the additions (and, as with `vdpbf16ps`, bf16 operands below f32's normal range
//! count as zero).
//!
//! The tile instructions are not in Rust's stable intrinsics, so the few that are used
//! are written as inline assembly, all in this module. Linux grants a process the tile
//! registers' state only when asked (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), which
//! [`available`] does once.

use std::arch::asm;
use std::sync::OnceLock;

use super::bf16::{pack_panel, pack_rows};
use super::packed::{PANEL, with_scratch};

/// Rows of a tile.
const TILE_ROWS: usize = 16;
/// bf16 pairs in a tile's row: 64 bytes.
const TILE_PAIRS: usize = 16;
/// Rows (and columns) of `c` per block: two tiles.
const BLOCK: usize = 2 * TILE_ROWS;

/// Whether this CPU has the AMX tiles and bf16 products, the operating system saves
/// their state, and this process may use them (asked once per process); the packing
/// needs AVX512-BF16 too.
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| super::bf16::available() && cpu_has_tiles() && tile_data_permitted())
}

/// CPUID's AMX-TILE and AMX-BF16 flags (leaf 7, EDX bits 24 and 22), and XCR0's tile
/// configuration and data bits (17, 18), which the kernel sets when it saves tile state.
fn cpu_has_tiles() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: CPUID exists on every x86-64 CPU, and leaf 7 is asked for only where the
    // highest leaf reaches it.
    #[allow(unused_unsafe)]
    let (highest, leaf7) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(7, 0)) };
    if highest < 7 || leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 22) == 0 {
        return false;
    }
    let xcr0: u64 = {
        let (low, high): (u32, u32);
        // SAFETY: XGETBV with ECX = 0 is valid where the OS has enabled XSAVE, which
        // `bf16::available()` (AVX-512, whose state is saved the same way) has shown.
        unsafe {
            asm!("xgetbv", in("ecx") 0, out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags))
        };
        u64::from(high) << 32 | u64::from(low)
    };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

/// Asks Linux for the tile data state for this process (all its threads); `false`
/// where it refuses (an older kernel, a sandbox).
fn tile_data_permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // SAFETY: arch_prctl with this code reads and writes no memory of the caller.
    let status = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    if status != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "Linux refused the AMX tile state");
    }
    status == 0
}

/// `c = bf16(a) · bf16(b)`, accumulated in f32 on AMX tiles; every element of `c` is
/// written. The caller checks [`available`] first.
pub(super) fn gemm_amx(
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    mut c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (m, k, n) = super::product_dims(&a, &b, &c);
    if m == 0 || n == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    // Pairs per packed row and panel rows: whole tiles along `k`; rows of `a`: whole blocks.
    let width = kp.div_ceil(TILE_PAIRS).max(1) * TILE_PAIRS;
    let rows = m.div_ceil(BLOCK) * BLOCK;
    with_scratch(rows * width, width * PANEL, |a_pairs, panel| {
        // SAFETY: `available()`, checked by the caller, includes AVX512-BF16.
        unsafe { pack_rows(&a, kp, width, a_pairs) };
        a_pairs[m * width..].fill(0);
        let tiles = Tiles::configure();
        let mut sums = [0f32; BLOCK * BLOCK];
        for index in 0..n.div_ceil(PANEL) {
            // SAFETY: as above.
            unsafe { pack_panel(&b, kp, index, panel) };
            panel[kp * PANEL..].fill(0);
            let columns = (n - index * PANEL).min(PANEL);
            for i in (0..m).step_by(BLOCK) {
                for half in 0..columns.div_ceil(BLOCK) {
                    tiles.block(&a_pairs[i * width..(i + BLOCK) * width], width, &panel[half * BLOCK..], &mut sums);
                    let first = index * PANEL + half * BLOCK;
                    let count = (columns - half * BLOCK).min(BLOCK);
                    for r in 0..(m - i).min(BLOCK) {
                        let values = &sums[r * BLOCK..][..count];
                        let mut row = c.row_mut(i + r);
                        match row.as_slice_mut() {
                            Some(row) => row[first..][..count].copy_from_slice(values),
                            None => values.iter().enumerate().for_each(|(j, v)| row[first + j] = *v),
                        }
                    }
                }
            }
        }
    });
}

/// The tile registers of this thread, configured as eight tiles of 16 rows of 64 bytes
/// for as long as this lives; released (back to their initial state, which the kernel
/// saves cheaply) when dropped.
struct Tiles(());

impl Tiles {
    fn configure() -> Tiles {
        // The 64-byte configuration: palette 1; bytes 16.. each tile's bytes per row
        // (two bytes each), bytes 48.. each tile's rows.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut config = Config([0; 64]);
        config.0[0] = 1;
        for t in 0..8 {
            config.0[16 + 2 * t..][..2].copy_from_slice(&((TILE_PAIRS * 4) as u16).to_le_bytes());
            config.0[48 + t] = TILE_ROWS as u8;
        }
        // SAFETY: `available()` was checked (the CPU has the tiles and the process may use
        // them); LDTILECFG reads the 64 bytes of a valid configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly, preserves_flags)) };
        Tiles(())
    }

    /// `sums[r][j] = Σ_p a[r][p] · b[p][j]` for 32 rows `r` of `a` (`width` pairs each,
    /// a multiple of 16) and 32 columns `j` of `panel` (rows of [`PANEL`] pairs, `width`
    /// of them, from its first column): `sums` is 32 rows of 32.
    fn block(&self, a: &[u32], width: usize, panel: &[u32], sums: &mut [f32; BLOCK * BLOCK]) {
        assert!(width.is_multiple_of(TILE_PAIRS) && width > 0 && a.len() >= BLOCK * width);
        assert!(panel.len() >= (width - 1) * PANEL + BLOCK);
        let a_stride = width * 4;
        let b_stride = PANEL * 4;
        // SAFETY: the tiles are configured (`self`). Each step loads two tiles of `a`
        // (rows 0–15 and 16–31, 64 bytes from pair `s`, a row every `a_stride` bytes: all
        // within `a`'s 32 rows of `width` pairs) and two of `b` (panel rows `s .. s + 16`,
        // columns 0–15 and 16–31 of `panel`, a row every `b_stride` bytes: within `panel`
        // as asserted), for `width / 16` steps; the four tiles of sums are stored into
        // `sums`, 32 rows of 128 bytes. The registers named are declared clobbered, and
        // the tile registers are used by no code the compiler generates.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a0} + {a_stride} * 1]",
                "tileloadd tmm5, [{a1} + {a_stride} * 1]",
                "tileloadd tmm6, [{b0} + {b_stride} * 1]",
                "tileloadd tmm7, [{b1} + {b_stride} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 64",
                "add {a1}, 64",
                "add {b0}, {b_step}",
                "add {b1}, {b_step}",
                "dec {steps}",
                "jnz 2b",
                "tilestored [{c0} + {c_stride} * 1], tmm0",
                "tilestored [{c1} + {c_stride} * 1], tmm1",
                "tilestored [{c2} + {c_stride} * 1], tmm2",
                "tilestored [{c3} + {c_stride} * 1], tmm3",
                a0 = inout(reg) a.as_ptr() => _,
                a1 = inout(reg) a.as_ptr().add(TILE_ROWS * width) => _,
                b0 = inout(reg) panel.as_ptr() => _,
                b1 = inout(reg) panel.as_ptr().add(TILE_ROWS) => _,
                steps = inout(reg) width / TILE_PAIRS => _,
                a_stride = in(reg) a_stride,
                b_stride = in(reg) b_stride,
                b_step = in(reg) TILE_PAIRS * b_stride,
                c0 = in(reg) sums.as_mut_ptr(),
                c1 = in(reg) sums.as_mut_ptr().add(TILE_ROWS),
                c2 = in(reg) sums.as_mut_ptr().add(TILE_ROWS * BLOCK),
                c3 = in(reg) sums.as_mut_ptr().add(TILE_ROWS * BLOCK + TILE_ROWS),
                c_stride = in(reg) BLOCK * 4,
                options(nostack),
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by this value; TILERELEASE returns them to
        // their initial state and touches no memory.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape class: one element, edges of every tile and block along each axis,
    /// several panels, and strided (transposed) operands; against the exact sums of the
    /// bf16 products. On a host without AMX this checks nothing and says so.
    #[test]
    fn products_match_exact_sums_of_bf16_products() {
        if !available() {
            eprintln!("skipped the amx kernel: this host has no AMX tiles the process may use");
            return;
        }
        super::super::packed::check_against_exact_sums(
            gemm_amx,
            &[
                (1, 1, 1),
                (3, 7, 5),
                (16, 32, 16),
                (17, 33, 17),
                (32, 64, 32),
                (33, 31, 65),
                (40, 97, 130),
                (70, 512, 200),
            ],
        );
    }
}
