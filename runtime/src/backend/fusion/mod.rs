//! Fusion of element-wise chains: several `f32` / `pred` element-wise instructions of
//! one shape run together, tile by tile, instead of one whole-array pass each.
//!
//! A chain such as `divide → select → subtract → exponential` over a large array costs
//! one read and one write of the whole array per instruction when run one by one, plus
//! a materialised array for every broadcast it reads. Fused, each tile of about a
//! thousand elements goes through every instruction while it is in the first-level
//! cache, broadcasts are read in place (a row of the operand, or one scalar per row),
//! and only the values that something after the group reads are written out.
//!
//! Nothing about the program changes: the same instructions run, with the same
//! numerics (every kernel here computes element by element exactly as its
//! whole-array counterpart in `kernels`). The executable only reorders instructions
//! that do not depend on each other so that a group's members are adjacent, and times
//! each member per tile, so that the device trace still shows every original
//! instruction with its share of the group's time.
//!
//! Values inside a group are `f32` lanes; a `pred` value is held as `0.0` or `1.0`.
//!
//! A reduction of a group's trailing dimensions joins the group too, when its rows are
//! long enough ([`MIN_ROW_TILE`]): a softmax or a layer norm then runs row by row, each
//! row read once, with the row's maximum or sum folded exactly as the whole-array
//! reduction folds it (`fold_lanes`), and the values with one element per row (the
//! reduction's, and what is computed from them before they are broadcast back along
//! the row) held as one value for the row's tile. A broadcast, a copy or a reshape
//! inside a group passes its operand's tile on without copying it.

mod evaluate;
mod plan;

use std::borrow::Cow;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::kernels::{
    beyond_trig_limit, compare_scalars, cos_f32, erf_f32, exact_trig, exp_f32, fold_lanes, ln_f32, logistic_f32,
    max_f32, min_f32, round_mantissa, round_to_format, sign_f32, sin_f32, tanh_f32, tanh_into, to_usize, unvalidated,
    vectorized, vectorized_job, with_activation, with_binary_f32, with_reduce_f32, with_rounding, with_unary_f32,
};
use super::{Destination, Output, Value, ValueRef};
use crate::dtype::DType;
use crate::isa::{ActivationFn, BinaryOp, CompareDirection, FloatFormat, Instruction, Op, Program, ReduceOp, UnaryOp};
use crate::pool::HostPool;
use neuron_datastore::clock::ticks;

/// Elements per tile: each member's tile (4 KiB) stays in the first-level cache while
/// the next member reads it.
const TILE: usize = 1024;

/// Groups with an operand read in rows (a broadcast along some dimensions) shorter than
/// this are not fused: assembling its tiles row by row would outweigh the gain.
const MIN_ROW: usize = 32;

/// Groups with an operand read in rows of at least this many elements (and fewer than
/// [`TILE`]) run on tiles of one row each, so that such an operand's tile is its row in
/// place, or one value, rather than assembled from several rows; a reduction joins a
/// group only over rows of at least this many elements. Shorter rows would cost more in
/// the work done once per tile than the copies save (measured: a layer norm over rows
/// of 128 ran 2% slower row by row, over rows of 256 15% faster).
const MIN_ROW_TILE: usize = 256;

/// The longest rows a group reduces: each member's tile is a whole row then.
const MAX_REDUCED_ROW: usize = 4 * TILE;

/// The most instructions in one group, which bounds the scratch memory per thread.
const MAX_MEMBERS: usize = 64;

/// Fused work of at least this many element operations (elements × members) is split
/// across idle compute slots.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// What one member computes, on lanes (a small loop's fused steps too).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::backend) enum Kernel {
    /// The operand unchanged: a broadcast (read in place), a copy, a conversion that
    /// keeps the lane value (`pred → f32`, `f32 → f32`).
    Pass,
    Binary(BinaryOp),
    Unary(UnaryOp),
    /// `not` of a `pred`.
    Not,
    Activation(ActivationFn),
    Compare {
        direction: CompareDirection,
        total_order: bool,
    },
    Select,
    /// `convert` of an `f32` to `pred`: anything non-zero (NaN too) is true.
    ToPred,
    Clamp,
    Round {
        format: FloatFormat,
        saturate: bool,
    },
    /// A reduction of each row (the group's trailing dimensions) to one value, in the
    /// order of the whole-array kernel (`fold_lanes`).
    Reduce(ReduceOp),
}

/// Where a member's operand comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    Input(usize),
    Member(usize),
}

#[derive(Debug, Clone, PartialEq)]
struct Member {
    kernel: Kernel,
    operands: Vec<Source>,
    /// Whether it holds one value per row of the group (a reduction, and what is
    /// computed from such values) rather than one per element.
    per_row: bool,
    /// Where its operands' tiles are read from: `operands`, with each pass member (a
    /// broadcast read in place, a copy) seen through to the value it passes on.
    reads: Vec<Source>,
    /// Whether it runs: false for a pass member that no member reads (they read what it
    /// passes on) and that is not written out.
    runs: bool,
}

/// A value the group reads from outside, seen in the group's shape.
#[derive(Debug, Clone, PartialEq)]
struct Input {
    buffer: u32,
    reads: Reads,
}

/// How a group input's elements line up with the group's.
#[derive(Debug, Clone, PartialEq)]
enum Reads {
    /// Element for element: a tile is a slice of the input.
    Flat,
    /// One value for every element (a scalar, or a broadcast of one).
    Scalar,
    /// Row by row (a broadcast along some dimensions): the input's element strides, one
    /// per leading (row) dimension of the group, and its stride along the collapsed
    /// row: 1 (contiguous), 0 (one value per row) or another step.
    Rows { row_strides: Vec<usize>, lane_stride: usize },
}

/// A planned group: the members run in order, on tiles of the group's shape.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Group {
    dims: Vec<usize>,
    /// The leading dimensions (rows) and the length of the collapsed row.
    row_dims: Vec<usize>,
    row_len: usize,
    /// Elements per tile: [`TILE`], or one row (see [`MIN_ROW_TILE`]).
    tile: usize,
    inputs: Vec<Input>,
    members: Vec<Member>,
    /// Members whose values are read after the group or returned: (member, buffer, pred).
    outputs: Vec<(usize, u32, bool)>,
    /// Each output's dimensions: the group's, or a per-row member's own.
    output_dims: Vec<Vec<usize>>,
}

/// How a program runs: single instructions and fused groups, in execution order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Schedule {
    /// Positions in the program's step order, in the order they execute.
    pub(super) order: Vec<usize>,
    /// Units of `order`: `len` consecutive positions, fused when `group` is set.
    pub(super) units: Vec<Unit>,
}

impl Group {
    /// Whether each tile is one row (parts of the work are then whole rows). The tile
    /// is at least one element, even in a group of none.
    pub(super) fn tiles_are_rows(&self) -> bool {
        self.tile == self.row_len
    }

    /// The elements of each value the group writes out.
    pub(super) fn output_lengths(&self) -> impl Iterator<Item = usize> + '_ {
        self.output_dims.iter().map(|dims| dims.iter().product())
    }

    /// The buffers the group writes out (the other members live in tiles only).
    pub(super) fn output_buffers(&self) -> impl Iterator<Item = u32> + '_ {
        self.outputs.iter().map(|&(_, buffer, _)| buffer)
    }

    /// The bytes each member reads from and writes to memory when the group runs, in
    /// member order: each input the group reads once (a broadcast's operand in place),
    /// charged to the first member that reads it; a member's value is written only when
    /// something after the group reads it. Intermediates in tiles move nothing.
    pub(super) fn moved_bytes(&self, program: &Program) -> Vec<(u64, u64)> {
        let size = |buffer: u32| program.buffers[buffer as usize].ty.size_bytes().unwrap_or(0);
        let mut charged = vec![false; self.inputs.len()];
        self.members
            .iter()
            .enumerate()
            .map(|(k, member)| {
                let mut read = 0;
                for source in &member.operands {
                    if let Source::Input(i) = *source
                        && !std::mem::replace(&mut charged[i], true)
                    {
                        read += size(self.inputs[i].buffer);
                    }
                }
                let written = self.outputs.iter().filter(|o| o.0 == k).map(|o| size(o.1)).sum();
                (read, written)
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unit {
    /// First index into `Schedule::order`.
    pub(super) first: usize,
    pub(super) len: usize,
    pub(super) group: Option<Group>,
}

pub(super) use evaluate::run;
pub(in crate::backend) use evaluate::{Lane, compute};
pub(in crate::backend) use plan::kernel;
pub(super) use plan::schedule;

#[cfg(test)]
mod tests {
    use super::plan::{row_split, strides_in_group};
    use proptest::prelude::*;

    use super::super::{Executable, Input as ProgramInput, Output as ProgramOutput};
    use super::*;
    use crate::compile::{Target, compile_hlo};
    use crate::dtype::ArrayType;

    /// Runs `hlo` with and without fusion and returns each run's output bytes and the
    /// number of fused groups.
    fn run_both(hlo: &str, inputs: &[(Vec<u64>, Vec<f32>)]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, usize) {
        let program = compile_hlo(hlo, Target::Trn1).expect("compiles");
        let run = |fuse: bool| {
            let executable = Executable::new(program.clone(), fuse);
            let bytes = run_once(&executable, inputs);
            let groups = executable.units.iter().filter(|u| u.group.is_some()).count();
            (bytes, groups)
        };
        let (fused, groups) = run(true);
        let (plain, _) = run(false);
        (fused, plain, groups)
    }

    /// Runs `executable` once on `inputs`; its output bytes.
    fn run_once(executable: &Executable, inputs: &[(Vec<u64>, Vec<f32>)]) -> Vec<Vec<u8>> {
        let pool = HostPool::new(2);
        let values = inputs
            .iter()
            .map(|(dims, data)| {
                let ty = ArrayType::new(DType::F32, dims.clone());
                let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
                ProgramInput::Copied(Value::from_le_bytes(&ty, &bytes))
            })
            .collect();
        let destinations = executable.program().outputs.iter().map(|_| None).collect();
        let outputs = executable
            .run(values, destinations, u64::MAX, &pool, &mut |_| unreachable!(), &mut |_, _, _| {})
            .expect("runs");
        outputs.iter().map(ProgramOutput::le_bytes).collect()
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
                match x % 97 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => -0.0,
                    _ => (x % 2001) as f32 / 250.0 - 4.0,
                }
            })
            .collect()
    }

    /// `v` with its NaNs and infinities from index `from` on replaced by a finite value
    /// (sums of rows that hold one would not depend on the order of the additions).
    fn finite_from(v: Vec<f32>, from: usize) -> Vec<f32> {
        v.into_iter().enumerate().map(|(i, x)| if i >= from && !x.is_finite() { 0.25 } else { x }).collect()
    }

    /// The softmax of the attention example: broadcasts read in place, a mask, a
    /// per-row maximum subtracted, and pred values inside the group.
    const SOFTMAX: &str = r#"
HloModule softmax
region_max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[4,64,48]{2,1,0} parameter(0)
  c8 = f32[] constant(8)
  b8 = f32[4,64,48]{2,1,0} broadcast(c8), dimensions={}
  scaled = f32[4,64,48]{2,1,0} divide(x, b8)
  i0 = s32[64,48]{1,0} iota(), iota_dimension=0
  i1 = s32[64,48]{1,0} iota(), iota_dimension=1
  mask = pred[64,48]{1,0} compare(i0, i1), direction=GE
  bmask = pred[4,64,48]{2,1,0} broadcast(mask), dimensions={1,2}
  ninf = f32[] constant(-inf)
  bninf = f32[4,64,48]{2,1,0} broadcast(ninf), dimensions={}
  masked = f32[4,64,48]{2,1,0} select(bmask, scaled, bninf)
  rowmax = f32[4,64]{1,0} reduce(masked, ninf), dimensions={2}, to_apply=region_max
  browmax = f32[4,64,48]{2,1,0} broadcast(rowmax), dimensions={0,1}
  shifted = f32[4,64,48]{2,1,0} subtract(masked, browmax)
  e = f32[4,64,48]{2,1,0} exponential(shifted)
  positive = pred[4,64,48]{2,1,0} compare(x, bninf), direction=GT
  flag = f32[4,64,48]{2,1,0} convert(positive)
  zero = f32[] constant(0)
  one = f32[] constant(1)
  clamped = f32[4,64,48]{2,1,0} clamp(zero, e, one)
  ROOT out = (f32[4,64,48]{2,1,0}, f32[4,64,48]{2,1,0}, f32[4,64,48]{2,1,0}) tuple(clamped, flag, masked)
}
"#;

    #[test]
    fn fused_softmax_is_bit_identical_to_unfused() {
        let x = data(4 * 64 * 48, 7);
        let (fused, plain, groups) = run_both(SOFTMAX, &[(vec![4, 64, 48], x)]);
        assert!(groups >= 2, "expected the two chains around the reduce to fuse, got {groups} groups");
        assert_eq!(fused, plain);
    }

    #[test]
    fn only_arrays_a_group_can_write_into_are_kept_as_spares() {
        // The maximum of each row dies at every run; no group writes an array of its
        // length, so keeping it would only fill the spares.
        let program = compile_hlo(SOFTMAX, Target::Trn1).expect("compiles");
        let executable = Executable::new(program, true);
        let x = data(4 * 64 * 48, 7);
        for _ in 0..2 * super::super::MAX_SPARE {
            run_once(&executable, &[(vec![4, 64, 48], x.clone())]);
        }
        let lengths: Vec<usize> = executable.spare.lock().expect("lock").iter().map(Vec::len).collect();
        assert!(lengths.iter().all(|&n| n == 4 * 64 * 48), "{lengths:?}");
    }

    /// A softmax over rows of 320 with a bias, as attention computes it: both
    /// reductions, the per-row values between them (a maximum with -inf, a product with
    /// another per-row value, reshapes to a trailing 1 and back) and their broadcasts
    /// along the rows; the sum and the maximum are returned too.
    const SOFTMAX_ROWS: &str = r#"
HloModule softmax_rows
region_max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
region_sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[4,25,320]{2,1,0} parameter(0)
  bias = f32[320]{0} parameter(1)
  scale = f32[4,25]{1,0} parameter(2)
  bbias = f32[4,25,320]{2,1,0} broadcast(bias), dimensions={2}
  biased = f32[4,25,320]{2,1,0} add(x, bbias)
  ninf = f32[] constant(-inf)
  rowmax = f32[4,25]{1,0} reduce(biased, ninf), dimensions={2}, to_apply=region_max
  floor = f32[4,25]{1,0} broadcast(ninf), dimensions={}
  safe = f32[4,25]{1,0} maximum(rowmax, floor)
  scaled = f32[4,25]{1,0} multiply(safe, scale)
  col = f32[4,25,1]{2,1,0} reshape(scaled)
  bcol = f32[4,25,1]{2,1,0} broadcast(col), dimensions={0,1,2}
  back = f32[4,25]{1,0} reshape(bcol)
  bmax = f32[4,25,320]{2,1,0} broadcast(back), dimensions={0,1}
  shifted = f32[4,25,320]{2,1,0} subtract(biased, bmax)
  e = f32[4,25,320]{2,1,0} exponential(shifted)
  zero = f32[] constant(0)
  sum = f32[4,25]{1,0} reduce(e, zero), dimensions={2}, to_apply=region_sum
  bsum = f32[4,25,320]{2,1,0} broadcast(sum), dimensions={0,1}
  out = f32[4,25,320]{2,1,0} divide(e, bsum)
  ROOT t = (f32[4,25,320]{2,1,0}, f32[4,25]{1,0}, f32[4,25]{1,0}) tuple(out, sum, safe)
}
"#;

    #[test]
    fn a_softmax_runs_as_one_group_row_by_row_with_the_same_bits() {
        // Enough elements for the rows to be split between threads; NaN and infinities
        // in the first two rows only, so that the others have finite sums.
        let inputs = [
            (vec![4, 25, 320], finite_from(data(4 * 25 * 320, 3), 2 * 320)),
            (vec![320], finite_from(data(320, 4), 0)),
            (vec![4, 25], finite_from(data(100, 5), 0)),
        ];
        let (fused, plain, groups) = run_both(SOFTMAX_ROWS, &inputs);
        assert_eq!(groups, 1, "expected every instruction in one group");
        assert_eq!(fused, plain);
        let sums: Vec<f32> = fused[1].chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert!(sums[2..].iter().all(|s| s.is_finite()), "{sums:?}");
        assert!(sums[..2].iter().any(|s| s.is_nan()), "{sums:?}");
    }

    /// Rows of exactly one tile, split between threads: a softmax (reductions in the
    /// group, the row sums returned) and a scaling by one value per row (no reduction).
    const ROWS_OF_A_TILE: &str = r#"
HloModule rows_of_a_tile
region_max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
region_sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[256,1024]{1,0} parameter(0)
  ninf = f32[] constant(-inf)
  rowmax = f32[256]{0} reduce(x, ninf), dimensions={1}, to_apply=region_max
  bmax = f32[256,1024]{1,0} broadcast(rowmax), dimensions={0}
  shifted = f32[256,1024]{1,0} subtract(x, bmax)
  e = f32[256,1024]{1,0} exponential(shifted)
  zero = f32[] constant(0)
  sum = f32[256]{0} reduce(e, zero), dimensions={1}, to_apply=region_sum
  bsum = f32[256,1024]{1,0} broadcast(sum), dimensions={0}
  out = f32[256,1024]{1,0} divide(e, bsum)
  ROOT t = (f32[256,1024]{1,0}, f32[256]{0}) tuple(out, sum)
}
"#;

    const SCALED_ROWS_OF_A_TILE: &str = r#"
HloModule scaled_rows_of_a_tile
ENTRY main {
  x = f32[256,1024]{1,0} parameter(0)
  s = f32[256]{0} parameter(1)
  bs = f32[256,1024]{1,0} broadcast(s), dimensions={0}
  y = f32[256,1024]{1,0} multiply(x, bs)
  ROOT e = f32[256,1024]{1,0} exponential(y)
}
"#;

    #[test]
    fn rows_of_exactly_a_tile_split_between_threads_keep_their_rows_whole() {
        let x = finite_from(data(256 * 1024, 11), 0);
        let (fused, plain, groups) = run_both(ROWS_OF_A_TILE, &[(vec![256, 1024], x.clone())]);
        assert_eq!(groups, 1);
        assert_eq!(fused, plain);
        let scales = finite_from(data(256, 12), 0);
        let (fused, plain, groups) = run_both(SCALED_ROWS_OF_A_TILE, &[(vec![256, 1024], x), (vec![256], scales)]);
        assert_eq!(groups, 1);
        assert_eq!(fused, plain);
    }

    #[test]
    fn groups_of_no_elements_run() {
        let empty = ROWS_OF_A_TILE.replace("256,1024", "0,1024").replace("f32[256]", "f32[0]");
        let (fused, plain, _) = run_both(&empty, &[(vec![0, 1024], Vec::new())]);
        assert_eq!(fused, plain);
        let empty = SCALED_ROWS_OF_A_TILE.replace("256,1024", "0,300").replace("f32[256]", "f32[0]");
        let (fused, plain, groups) = run_both(&empty, &[(vec![0, 300], Vec::new()), (vec![0], Vec::new())]);
        assert_eq!(groups, 1);
        assert_eq!(fused, plain);
    }

    /// Element-wise operations a random chain picks from: (HLO text with `A` and `B`
    /// for operands, number of operands).
    const OPS: &[(&str, usize)] = &[
        ("add(A, B)", 2),
        ("subtract(A, B)", 2),
        ("multiply(A, B)", 2),
        ("divide(A, B)", 2),
        ("maximum(A, B)", 2),
        ("minimum(A, B)", 2),
        ("power(A, B)", 2),
        ("remainder(A, B)", 2),
        ("atan2(A, B)", 2),
        ("negate(A)", 1),
        ("abs(A)", 1),
        ("sign(A)", 1),
        ("floor(A)", 1),
        ("round-nearest-even(A)", 1),
        ("exponential(A)", 1),
        ("log(A)", 1),
        ("tanh(A)", 1),
        ("logistic(A)", 1),
        ("sqrt(A)", 1),
        ("rsqrt(A)", 1),
        ("sine(A)", 1),
        ("exponential-minus-one(A)", 1),
        ("reduce-precision(A), exponent_bits=8, mantissa_bits=7", 1),
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Random chains over full-shape values, per-row and per-column broadcasts and
        /// scalars, with a reduction in the middle that splits them, give bit-identical
        /// results fused and unfused.
        #[test]
        fn random_chains_fuse_exactly(
            picks in prop::collection::vec((0..OPS.len(), 0usize..64, 0usize..64), 2..14),
            reduce_at in 0usize..14,
            compare_at in 0usize..14,
            seed in 0u32..1000,
            // Rows too short for a reduction to join the group, and long enough.
            width in prop::sample::select(vec![72usize, 288]),
        ) {
            let full = format!("f32[5,{width}]{{1,0}}");
            let mut lines = vec![
                format!("  p0 = {full} parameter(0)"),
                format!("  p1 = {full} parameter(1)"),
                "  p2 = f32[5]{0} parameter(2)".to_string(),
                format!("  p3 = f32[{width}]{{0}} parameter(3)"),
                "  p4 = f32[] parameter(4)".to_string(),
                format!("  rows = {full} broadcast(p2), dimensions={{0}}"),
                format!("  cols = {full} broadcast(p3), dimensions={{1}}"),
                format!("  scalar = {full} broadcast(p4), dimensions={{}}"),
                "  zero = f32[] constant(0)".to_string(),
            ];
            let mut values = vec!["p0".to_string(), "p1".to_string(), "rows".to_string(), "cols".to_string(), "scalar".to_string()];
            for (k, &(op, a, b)) in picks.iter().enumerate() {
                let (text, _) = OPS[op];
                let a = values[a % values.len()].clone();
                let b = values[b % values.len()].clone();
                let name = format!("v{k}");
                lines.push(format!("  {name} = {full} {}", text.replace('A', &a).replace('B', &b)));
                if k == compare_at {
                    lines.push(format!("  c{k} = pred[5,{width}]{{1,0}} compare({name}, {a}), direction=LT"));
                    lines.push(format!("  s{k} = {full} select(c{k}, {name}, {b})"));
                    values.push(format!("s{k}"));
                }
                if k == reduce_at {
                    // A per-row value computed from the sum (with another per-row value),
                    // laid out with a trailing 1 and broadcast back along the rows.
                    lines.push(format!("  r{k} = f32[5]{{0}} reduce({name}, zero), dimensions={{1}}, to_apply=sum"));
                    lines.push(format!("  m{k} = f32[5]{{0}} maximum(r{k}, p2)"));
                    lines.push(format!("  t{k} = f32[5,1]{{1,0}} reshape(m{k})"));
                    lines.push(format!("  br{k} = {full} broadcast(t{k}), dimensions={{0,1}}"));
                    values.push(format!("br{k}"));
                }
                values.push(name);
            }
            let last = values.last().cloned().unwrap_or_default();
            let middle = values[values.len() / 2].clone();
            lines.push(format!("  ROOT out = ({full}, {full}) tuple({last}, {middle})"));
            let hlo = format!(
                "HloModule chain\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\nENTRY main {{\n{}\n}}\n",
                lines.join("\n")
            );
            let inputs = vec![
                // Non-finite values in the first row only.
                (vec![5, width as u64], finite_from(data(5 * width, seed), width)),
                (vec![5, width as u64], finite_from(data(5 * width, seed + 1), width)),
                (vec![5], data(5, seed + 2)),
                (vec![width as u64], data(width, seed + 3)),
                (vec![], data(1, seed + 4)),
            ];
            let (fused, plain, _) = run_both(&hlo, &inputs);
            prop_assert_eq!(fused, plain, "{}", hlo);
        }
    }

    #[test]
    fn rows_collapse_while_every_operand_steps_as_one_run() {
        let dims = [4, 256, 256];
        let same = strides_in_group(&[4, 256, 256], None, &dims);
        assert_eq!(same, vec![65536, 256, 1]);
        assert_eq!(row_split(&dims, std::slice::from_ref(&same)), 0);
        // A mask broadcast over the first dimension: rows of 65536.
        let mask = strides_in_group(&[256, 256], Some(&[1, 2]), &dims);
        assert_eq!(mask, vec![0, 256, 1]);
        assert_eq!(row_split(&dims, &[same.clone(), mask]), 1);
        // One value per row of the last dimension: rows of 256.
        let per_row = strides_in_group(&[4, 256], Some(&[0, 1]), &dims);
        assert_eq!(per_row, vec![256, 1, 0]);
        assert_eq!(row_split(&dims, &[same, per_row]), 2);
        // A scalar never limits the row.
        assert_eq!(row_split(&dims, &[strides_in_group(&[], Some(&[]), &dims)]), 0);
    }
}
