//! Random numbers: XLA's `rng-bit-generator`, bit for bit, and `rng` (uniform).

use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{ArrayD, Dimension, IxDyn};

use super::{arr, first, to_usize, unvalidated};
use crate::backend::element::{Element, with_element};
use crate::backend::{Value, ValueRef};
use crate::dtype::{ArrayType, DTypeClass};
use crate::isa::{RngAlgorithm, RngResult};

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox-4x32 with 10 rounds: four words from a 128-bit counter and a 64-bit key.
pub(crate) fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = u64::from(PHILOX_M0) * u64::from(c[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
    }
    c
}

/// Threefry-2x32 with 20 rounds: two words from a 64-bit counter and a 64-bit key.
pub(crate) fn threefry2x32(counter: [u32; 2], key: [u32; 2]) -> [u32; 2] {
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let keys = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let mut x = [counter[0].wrapping_add(keys[0]), counter[1].wrapping_add(keys[1])];
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x[0] = x[0].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r) ^ x[0];
        }
        let injection = group + 1;
        x[0] = x[0].wrapping_add(keys[injection % 3]);
        x[1] = x[1].wrapping_add(keys[(injection + 1) % 3]).wrapping_add(injection as u32);
    }
    x
}

/// `rng-bit-generator`, as XLA's `RngBitGeneratorExpander` defines it: the advanced
/// state or the bits (of type `out`), as `result` asks. The state is `[key, counter...]`.
pub(super) fn bit_generator(
    algorithm: RngAlgorithm,
    result: RngResult,
    state: &ValueRef<'_>,
    out: &ArrayType,
) -> Value {
    let state: Vec<u64> = arr::<u64>(state).iter().copied().collect();
    let dims = to_usize(&out.dims);
    let (words, new_state) = match algorithm {
        RngAlgorithm::Philox => philox_words(&state, out),
        RngAlgorithm::ThreeFry => threefry_words(&state, out, &dims),
    };
    match result {
        RngResult::State => Value::U64(
            ArrayD::from_shape_vec(IxDyn(&[new_state.len()]), new_state).unwrap_or_else(|_| unvalidated("rng state")),
        ),
        RngResult::Bits => with_element!(out.dtype, T => {
            let values: Vec<T> = words.into_iter().map(T::from_u64).collect();
            T::wrap(ArrayD::from_shape_vec(IxDyn(&dims), values).unwrap_or_else(|_| unvalidated("rng bits")))
        }),
    }
}

/// Philox bits: the 128-bit counter is `state[1]` (low) and `state[2]` (high), or,
/// for a two-word state, `state[1]` (low) and the key (high); block `j` encrypts
/// counter + `j` under the key. A 32-bit (or narrower, truncated) element takes one
/// word, in block order; a 64-bit element takes two (low word first). The counter
/// advances by the blocks used; a two-word state keeps only its low half.
fn philox_words(state: &[u64], out: &ArrayType) -> (Vec<u64>, Vec<u64>) {
    let key = state[0];
    let (low, high) = if state.len() >= 3 { (state[1], state[2]) } else { (state[1], state[0]) };
    let count = out.element_count().unwrap_or(0) as usize;
    let wide = out.dtype.size_bytes() == 8;
    let blocks = if wide { (2 * count).div_ceil(4) } else { count.div_ceil(4) };
    let key = [key as u32, (key >> 32) as u32];
    let counter = |j: u64| -> [u32; 4] {
        let l = low.wrapping_add(j);
        let h = if l < low { high.wrapping_add(1) } else { high };
        [l as u32, (l >> 32) as u32, h as u32, (h >> 32) as u32]
    };
    let mut words = Vec::with_capacity(count);
    for j in 0..blocks as u64 {
        let w = philox4x32(counter(j), key);
        if wide {
            words.push(u64::from(w[0]) | u64::from(w[1]) << 32);
            words.push(u64::from(w[2]) | u64::from(w[3]) << 32);
        } else {
            words.extend(w.iter().map(|&x| u64::from(x)));
        }
    }
    words.truncate(count);
    let [l0, l1, h0, h1] = counter(blocks as u64);
    let (new_low, new_high) = (u64::from(l0) | u64::from(l1) << 32, u64::from(h0) | u64::from(h1) << 32);
    let new_state = if state.len() >= 3 { vec![state[0], new_low, new_high] } else { vec![state[0], new_low] };
    (words, new_state)
}

/// Threefry bits: the counter is `state[1]`. A 64-bit element at row-major position
/// `i` encrypts counter + `i` and joins the two words (low first). Narrower elements
/// come in pairs: the shape is halved along its first even dimension (else its
/// largest), element `i` of the halved shape encrypts counter + `i`, and its two words
/// go to the two neighbours along that dimension (truncated below 32 bits).
fn threefry_words(state: &[u64], out: &ArrayType, dims: &[usize]) -> (Vec<u64>, Vec<u64>) {
    let (key, counter) = (state[0], state[1]);
    let key = [key as u32, (key >> 32) as u32];
    let block = |i: u64| {
        let c = counter.wrapping_add(i);
        threefry2x32([c as u32, (c >> 32) as u32], key)
    };
    let count: usize = dims.iter().product();
    if out.dtype.size_bytes() == 8 {
        let words = (0..count as u64).map(|i| {
            let [x0, x1] = block(i);
            u64::from(x0) | u64::from(x1) << 32
        });
        return (words.collect(), vec![state[0], counter.wrapping_add(count as u64)]);
    }
    if dims.is_empty() {
        return (vec![u64::from(block(0)[0])], vec![state[0], counter.wrapping_add(1)]);
    }
    let split = dims
        .iter()
        .position(|d| d % 2 == 0)
        .unwrap_or_else(|| (0..dims.len()).fold(0, |best, d| if dims[d] > dims[best] { d } else { best }));
    let mut half = dims.to_vec();
    half[split] = dims[split].div_ceil(2);
    let half_count: usize = half.iter().product();
    let mut words = Vec::with_capacity(count);
    for index in ndarray::indices(IxDyn(dims)) {
        let mut linear = 0usize;
        for (d, (&i, &n)) in index.slice().iter().zip(&half).enumerate() {
            linear = linear * n + if d == split { i / 2 } else { i };
        }
        words.push(u64::from(block(linear as u64)[index[split] % 2]));
    }
    (words, vec![state[0], counter.wrapping_add(half_count as u64)])
}

/// Counter of the process-wide generator behind `rng`: every execution of an `rng`
/// instruction takes fresh blocks.
static UNIFORM_COUNTER: AtomicU64 = AtomicU64::new(0);
/// Key of the process-wide generator (the first digits of pi).
const UNIFORM_KEY: [u32; 2] = [0x243F_6A88, 0x85A3_08D3];

/// `rng` with the uniform distribution over `[a, b)`.
pub(super) fn uniform(a: &ValueRef<'_>, b: &ValueRef<'_>, out: &ArrayType) -> Value {
    let count = out.element_count().unwrap_or(0) as usize;
    let blocks = count.div_ceil(2) as u64;
    let first_block = UNIFORM_COUNTER.fetch_add(blocks, Ordering::Relaxed);
    let words = move |i: usize| -> [u32; 2] {
        let block = first_block.wrapping_add((i / 2) as u64);
        let w = philox4x32([block as u32, (block >> 32) as u32, 0, 0], UNIFORM_KEY);
        if i.is_multiple_of(2) { [w[0], w[1]] } else { [w[2], w[3]] }
    };
    fn fill<T: Element>(a: T, b: T, count: usize, dims: &[usize], words: impl Fn(usize) -> [u32; 2]) -> ArrayD<T> {
        let values: Vec<T> = match T::DTYPE.class() {
            DTypeClass::Float => {
                let (lo, hi) = (a.to_f32(), b.to_f32());
                (0..count)
                    .map(|i| {
                        // 23 random mantissa bits: a float in [1, 2), then [0, 1).
                        let unit = f32::from_bits((words(i)[0] >> 9) | 0x3F80_0000) - 1.0;
                        let x = T::from_f32(lo + unit * (hi - lo));
                        // Rounding may land on `b`, which the interval excludes.
                        if x.to_f32() >= hi && lo < hi { a } else { x }
                    })
                    .collect()
            }
            class => {
                let widen = |x: T| -> i128 {
                    if class == DTypeClass::Unsigned { i128::from(x.to_u64()) } else { i128::from(x.to_i64()) }
                };
                let (lo, hi) = (widen(a), widen(b));
                let range = (hi - lo).max(0) as u128;
                (0..count)
                    .map(|i| {
                        let [w0, w1] = words(i);
                        let r = (u64::from(w1) << 32 | u64::from(w0)) as u128;
                        let offset = if range == 0 { 0 } else { (r % range) as i128 };
                        let v = lo + offset;
                        if class == DTypeClass::Unsigned { T::from_u64(v as u64) } else { T::from_i64(v as i64) }
                    })
                    .collect()
            }
        };
        ArrayD::from_shape_vec(IxDyn(dims), values).unwrap_or_else(|_| unvalidated("rng"))
    }
    let dims = to_usize(&out.dims);
    with_element!(out.dtype, T => {
        let (a, b) = (first(arr::<T>(a)), first(arr::<T>(b)));
        T::wrap(fill(a, b, count, &dims, words))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn philox_matches_the_random123_known_answers() {
        // Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    fn generate(algorithm: RngAlgorithm, state: &[u64], dtype: DType, dims: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let state = ndarray::ArrayD::from_shape_vec(IxDyn(&[state.len()]), state.to_vec()).expect("state");
        let out = ArrayType::new(dtype, dims.to_vec());
        let run = |result| bit_generator(algorithm, result, &ValueRef::U64(state.view()), &out);
        let mut bits = vec![0u8; out.size_bytes().expect("size") as usize];
        run(RngResult::Bits).write_le_bytes(&mut bits);
        let width = dtype.size_bytes() as usize;
        let words =
            bits.chunks_exact(width).map(|c| c.iter().rev().fold(0u64, |w, &b| w << 8 | u64::from(b))).collect();
        let Value::U64(new_state) = run(RngResult::State) else { panic!("state is u64") };
        (words, new_state.iter().copied().collect())
    }

    #[test]
    fn bit_generator_reproduces_xla_for_three_word_states_and_odd_shapes() {
        // Vectors computed by XLA:CPU (jax 0.10.2) for the same states and shapes.
        let (bits, state) = generate(RngAlgorithm::Philox, &[1, 2, 3], DType::U32, &[5]);
        assert_eq!(bits, [0xf045_e74a, 0x5176_30e6, 0x1d8a_f405, 0xb5e5_9a96, 0x0554_5ceb]);
        assert_eq!(state, [1, 4, 3]);

        let s = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
        let (bits, state) = generate(RngAlgorithm::ThreeFry, &s, DType::U32, &[3, 3]);
        assert_eq!(
            bits,
            [
                0xaed4_a37f,
                0xc3cc_4d02,
                0xaee5_264e,
                0x1130_d111,
                0x798e_402e,
                0xb089_da7a,
                0x49b1_05a8,
                0xe8e5_2210,
                0xf0a3_9a78
            ]
        );
        assert_eq!(state, [s[0], 0xfedc_ba98_7654_3216]);
        let (bits, _) = generate(RngAlgorithm::Philox, &s, DType::U8, &[5]);
        assert_eq!(bits, [0x42, 0xb5, 0x02, 0x17, 0x19]);
        let (bits, state) = generate(RngAlgorithm::Philox, &s, DType::U64, &[3]);
        assert_eq!(bits, [0xcfa3_90b5_1ec5_3d42, 0xe71f_f917_f223_5702, 0xd682_777a_cb47_2319]);
        assert_eq!(state, [s[0], 0xfedc_ba98_7654_3212]);
    }

    #[test]
    fn threefry_matches_the_random123_known_answers() {
        // Known-answer vectors of Random123 (kat_vectors, threefry2x32_20).
        assert_eq!(threefry2x32([0; 2], [0; 2]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(threefry2x32([u32::MAX; 2], [u32::MAX; 2]), [0x1cb9_96fc, 0xbb00_2be7]);
        assert_eq!(threefry2x32([0x243f_6a88, 0x85a3_08d3], [0x1319_8a2e, 0x0370_7344]), [0xc492_3a9c, 0x483d_f7a0]);
    }
}
