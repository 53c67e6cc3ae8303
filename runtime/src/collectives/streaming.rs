//! Large results written past the caches.
//!
//! A store to memory that is not in the cache first reads the line it changes, so
//! writing a large output costs twice its size in memory traffic; non-temporal stores
//! write whole lines without reading them. A part of a collective's output is computed
//! a few KiB at a time into a buffer the first-level cache keeps (so that a sum in
//! place reads what the part held before writing it), then copied out; from
//! [`MIN_BYTES`], which no cache holds anyway, with non-temporal stores (x86-64;
//! elsewhere, and for smaller parts, as usual).

use std::ops::Range;

/// Outputs from this size on are streamed.
pub(crate) const MIN_BYTES: usize = 1 << 20;
/// Bytes computed at a time: a multiple of every element size, well inside L1.
const CHUNK: usize = 4096;

/// Writes `out` through `fill`, which is given each range of it in turn, the bytes `out`
/// holds there now (an in-place sum reads them), and a buffer of the range's length to
/// write that range's new bytes into.
pub(crate) fn write(out: &mut [u8], mut fill: impl FnMut(Range<usize>, &[u8], &mut [u8])) {
    let stream = out.len() >= MIN_BYTES && cfg!(target_arch = "x86_64");
    let mut buffer = [0u64; CHUNK / 8];
    let buffer: &mut [u8] = bytemuck::cast_slice_mut(&mut buffer);
    for start in (0..out.len()).step_by(CHUNK) {
        let end = (start + CHUNK).min(out.len());
        let chunk = &mut buffer[..end - start];
        fill(start..end, &out[start..end], chunk);
        match stream {
            true => store(&mut out[start..end], chunk),
            false => out[start..end].copy_from_slice(chunk),
        }
    }
    if stream {
        fence();
    }
}

/// What is shown each piece of a copy's source (see [`copy`]).
pub(crate) type See<'s> = &'s mut dyn FnMut(&[u8]);

/// Copies `source` into `out` (of its length), streaming a large one, and shows `see`
/// each piece of `source` as it is copied (while the cache holds it), when given.
pub(crate) fn copy(out: &mut [u8], source: &[u8], mut see: Option<See<'_>>) {
    let stream = out.len() >= MIN_BYTES && cfg!(target_arch = "x86_64");
    if !stream && see.is_none() {
        out.copy_from_slice(source);
        return;
    }
    for start in (0..out.len()).step_by(CHUNK) {
        let end = (start + CHUNK).min(out.len());
        if let Some(see) = see.as_mut() {
            see(&source[start..end]);
        }
        match stream {
            true => store(&mut out[start..end], &source[start..end]),
            false => out[start..end].copy_from_slice(&source[start..end]),
        }
    }
    if stream {
        fence();
    }
}

/// Copies `source` into `out` with non-temporal stores where `out` is 16-aligned.
#[cfg(target_arch = "x86_64")]
fn store(out: &mut [u8], source: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = out.as_ptr().align_offset(16).min(out.len());
    let body = (out.len() - head) / 16 * 16;
    out[..head].copy_from_slice(&source[..head]);
    for at in (head..head + body).step_by(16) {
        // SAFETY: `at + 16 <= out.len() == source.len()`, `out[at..]` is 16-aligned (SSE2
        // is part of x86-64).
        unsafe {
            let value = _mm_loadu_si128(source.as_ptr().add(at).cast::<__m128i>());
            _mm_stream_si128(out.as_mut_ptr().add(at).cast::<__m128i>(), value);
        }
    }
    out[head + body..].copy_from_slice(&source[head + body..]);
}

#[cfg(not(target_arch = "x86_64"))]
fn store(out: &mut [u8], source: &[u8]) {
    out.copy_from_slice(source);
}

/// Orders the streamed stores before whatever follows (a peer told the part is final).
fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence has no preconditions (SSE is part of x86-64).
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_writes_and_copies_give_every_byte_at_any_alignment() {
        let source: Vec<u8> = (0..MIN_BYTES + 4099).map(|i| (i * 7 % 251) as u8).collect();
        let mut out = vec![0u8; MIN_BYTES + 4100];
        for offset in [0, 1, 3] {
            let len = MIN_BYTES + 4096 - offset;
            let target = &mut out[offset..offset + len];
            write(target, |range, _, chunk| chunk.copy_from_slice(&source[range]));
            assert!(target == &source[..len], "written at offset {offset}");
            // What a range held is given before it is written.
            write(target, |_, now, chunk| chunk.iter_mut().zip(now).for_each(|(c, &n)| *c = n.wrapping_add(1)));
            assert!(target.iter().zip(&source).all(|(&t, &s)| t == s.wrapping_add(1)), "rewritten at {offset}");
            target.fill(0);
            let mut seen = 0;
            copy(target, &source[3..3 + len], Some(&mut |piece: &[u8]| seen += piece.len()));
            assert_eq!(seen, len, "every piece seen once");
            assert!(target == &source[3..3 + len], "copied at offset {offset}");
        }
        let mut small = [0u8; 5];
        write(&mut small, |range, _, chunk| chunk.copy_from_slice(&source[range]));
        assert_eq!(small, source[..5]);
    }
}
