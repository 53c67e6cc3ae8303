//! The data-moving algorithms of one meeting: a group of one, all-to-all (every rank
//! reads every input) and the ring (reduce-scatter then all-gather steps between
//! neighbours).

use std::ops::Range;

use super::{Collective, Request};
use crate::backend;
use crate::dtype::DType;
use crate::isa::ReduceOp;

/// How a buffer divides into the `n` parts ranks exchange.
#[derive(Debug, Clone, Copy)]
enum Parts {
    /// Consecutive element ranges of about equal size (an all-reduce's ring parts).
    Flat { elements: usize, element_bytes: usize, n: usize },
    /// `outer` rows of `n` segments of `segment` bytes: part `k` is segment `k` of each
    /// row (the parts along a gathered or scattered dimension).
    Strided { outer: usize, segment: usize, n: usize },
}

impl Parts {
    fn ranges(self, k: usize) -> Vec<Range<usize>> {
        match self {
            Parts::Flat { elements, element_bytes, n } => {
                let range = k * elements / n * element_bytes..(k + 1) * elements / n * element_bytes;
                vec![range]
            }
            Parts::Strided { outer, segment, n } => {
                (0..outer).map(|o| (o * n + k) * segment..(o * n + k + 1) * segment).collect()
            }
        }
    }

    /// Part `k`'s bytes, contiguous (a copy of each range, not of each byte).
    fn pack(self, buffer: &[u8], k: usize) -> Vec<u8> {
        let ranges = self.ranges(k);
        let mut packed = Vec::with_capacity(ranges.iter().map(Range::len).sum());
        for range in ranges {
            packed.extend_from_slice(&buffer[range]);
        }
        packed
    }

    /// Part `k`'s bytes, copied contiguous into `out` (of the part's length).
    fn pack_into(self, buffer: &[u8], k: usize, out: &mut [u8]) {
        let mut at = 0;
        for range in self.ranges(k) {
            let len = range.len();
            out[at..at + len].copy_from_slice(&buffer[range]);
            at += len;
        }
    }

    fn unpack(self, buffer: &mut [u8], k: usize, data: &[u8]) {
        let mut at = 0;
        for r in self.ranges(k) {
            let len = r.len();
            buffer[r].copy_from_slice(&data[at..at + len]);
            at += len;
        }
    }

    fn combine(self, buffer: &mut [u8], k: usize, data: &[u8], op: ReduceOp, dtype: DType) {
        let mut at = 0;
        for r in self.ranges(k) {
            let len = r.len();
            backend::combine_le_bytes(op, dtype, &mut buffer[r], &data[at..at + len]);
            at += len;
        }
    }
}

/// The segment size of the strided parts of a request in a group of `n`.
fn strided(request: &Request<'_>, n: usize) -> Parts {
    let outer = request.outer.max(1);
    let segment = match request.op {
        Collective::AllGather => request.input.len() / outer,
        Collective::ReduceScatter(_) => request.output.len() / outer,
        _ => request.input.len() / outer / n,
    };
    Parts::Strided { outer, segment, n }
}

/// A group of one: the output is the input (or its only part).
pub(super) fn local(request: Request<'_>) {
    let len = request.output.len().min(request.input.len());
    request.output[..len].copy_from_slice(&request.input[..len]);
}

/// The all-to-all algorithm: every rank reads all inputs, in group order.
pub(super) fn direct(request: &mut Request<'_>, position: usize, inputs: &[&[u8]]) {
    let n = inputs.len();
    let parts = strided(request, n);
    let output = &mut *request.output;
    match request.op {
        Collective::AllReduce(op) => {
            // The first two inputs in one pass, then each other one.
            match inputs {
                [only] => output.copy_from_slice(only),
                [first, second, rest @ ..] => {
                    backend::combine_le_bytes_into(op, request.dtype, output, first, second);
                    for input in rest {
                        backend::combine_le_bytes(op, request.dtype, output, input);
                    }
                }
                [] => {}
            }
        }
        Collective::AllGather => {
            for (j, input) in inputs.iter().enumerate() {
                parts.unpack(output, j, input);
            }
        }
        Collective::ReduceScatter(op) => {
            output.copy_from_slice(&parts.pack(inputs[0], position));
            for input in &inputs[1..] {
                backend::combine_le_bytes(op, request.dtype, output, &parts.pack(input, position));
            }
        }
        Collective::AllToAll => {
            for (j, input) in inputs.iter().enumerate() {
                parts.unpack(output, j, &parts.pack(input, position));
            }
        }
        Collective::Barrier | Collective::Send { .. } | Collective::Recv { .. } => {}
    }
}

/// A part a ring step passes on, still where it lies: the step copies it where the next
/// position reads it.
pub(super) struct Outgoing<'a> {
    parts: Parts,
    buffer: &'a [u8],
    k: usize,
}

impl Outgoing<'_> {
    pub(super) fn len(&self) -> usize {
        self.parts.ranges(self.k).iter().map(Range::len).sum()
    }

    /// Copies the part into `out`, which has its length.
    pub(super) fn write_to(&self, out: &mut [u8]) {
        self.parts.pack_into(self.buffer, self.k, out);
    }

    pub(super) fn to_vec(&self) -> Vec<u8> {
        self.parts.pack(self.buffer, self.k)
    }
}

/// The ring algorithm: `n − 1` reduce-scatter steps after which position `p` holds the
/// finished part `p`, then `n − 1` all-gather steps that pass the finished parts on.
/// `step` passes a part to the next position and returns the one from the previous.
pub(super) fn ring<E, R: std::ops::Deref<Target = [u8]>>(
    request: &mut Request<'_>,
    p: usize,
    n: usize,
    mut step: impl FnMut(Outgoing<'_>) -> Result<R, E>,
) -> Result<(), E> {
    let part = |k: isize| k.rem_euclid(n as isize) as usize;
    let p = p as isize;
    let dtype = request.dtype;
    match request.op {
        Collective::AllReduce(op) => {
            let element_bytes = dtype.size_bytes() as usize;
            let parts = Parts::Flat { elements: request.input.len() / element_bytes, element_bytes, n };
            // Accumulates in the output, which has the input's size.
            let acc = &mut *request.output;
            acc.copy_from_slice(&request.input);
            for s in 0..n as isize - 1 {
                let received = step(Outgoing { parts, buffer: acc, k: part(p - s - 1) })?;
                parts.combine(acc, part(p - s - 2), &received, op, dtype);
            }
            for s in 0..n as isize - 1 {
                let received = step(Outgoing { parts, buffer: acc, k: part(p - s) })?;
                parts.unpack(acc, part(p - s - 1), &received);
            }
        }
        Collective::ReduceScatter(op) => {
            let parts = strided(request, n);
            let mut acc = request.input.to_vec();
            for s in 0..n as isize - 1 {
                let received = step(Outgoing { parts, buffer: &acc, k: part(p - s - 1) })?;
                parts.combine(&mut acc, part(p - s - 2), &received, op, dtype);
            }
            request.output.copy_from_slice(&parts.pack(&acc, part(p)));
        }
        Collective::AllGather => {
            let parts = strided(request, n);
            let input = &request.input[..];
            let output = &mut *request.output;
            parts.unpack(output, part(p), input);
            for s in 0..n as isize - 1 {
                let received = step(Outgoing { parts, buffer: output, k: part(p - s) })?;
                parts.unpack(output, part(p - s - 1), &received);
            }
        }
        Collective::AllToAll | Collective::Barrier | Collective::Send { .. } | Collective::Recv { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_a_buffer_exactly_once() {
        for parts in
            [Parts::Flat { elements: 13, element_bytes: 4, n: 4 }, Parts::Strided { outer: 3, segment: 8, n: 4 }]
        {
            let len = match parts {
                Parts::Flat { elements, element_bytes, .. } => elements * element_bytes,
                Parts::Strided { outer, segment, n } => outer * segment * n,
            };
            let mut covered = vec![0u8; len];
            for k in 0..4 {
                for range in parts.ranges(k) {
                    covered[range].iter_mut().for_each(|c| *c += 1);
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "{parts:?}: {covered:?}");
        }
        let parts = Parts::Strided { outer: 2, segment: 2, n: 2 };
        let buffer = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(parts.pack(&buffer, 1), [2, 3, 6, 7], "segment 1 of each row");
    }
}
