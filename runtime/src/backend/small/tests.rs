use super::super::{Input, Output};
use super::*;
use crate::compile::{Target, compile_hlo};
use crate::dtype::DType;

/// Data-dependent: damped updates until the sum of |x| falls below 1 or 300 steps.
const DAMPED: &str = r#"
HloModule damped
body {
  state = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[64] get-tuple-element(state), index=1
  c = f32[] constant(0.97)
  bc = f32[64] broadcast(c), dimensions={}
  scaled = f32[64] multiply(x, bc)
  t = f32[64] tanh(x)
  d = f32[] constant(0.001)
  bd = f32[64] broadcast(d), dimensions={}
  dt = f32[64] multiply(t, bd)
  y = f32[64] subtract(scaled, dt)
  ROOT out = (s32[], f32[64]) tuple(next, y)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
cond {
  state = (s32[], f32[64]) parameter(0)
  x = f32[64] get-tuple-element(state), index=1
  ax = f32[64] abs(x)
  zero = f32[] constant(0)
  total = f32[] reduce(ax, zero), dimensions={0}, to_apply=add
  limit = f32[] constant(1)
  big = pred[] compare(total, limit), direction=GT
  i = s32[] get-tuple-element(state), index=0
  cap = s32[] constant(300)
  more = pred[] compare(i, cap), direction=LT
  ROOT go = pred[] and(big, more)
}
ENTRY main {
  zero = s32[] constant(0)
  x = f32[64] parameter(0)
  init = (s32[], f32[64]) tuple(zero, x)
  w = (s32[], f32[64]) while(init), condition=cond, body=body
  n = s32[] get-tuple-element(w), index=0
  y = f32[64] get-tuple-element(w), index=1
  ROOT r = (s32[], f32[64]) tuple(n, y)
}
"#;

/// A `fori_loop` of a small matrix-vector product (a kernel prepared with the
/// loop), with the matrix carried through unchanged, rows reduced along both axes,
/// a select, conversions, a maximum that sees NaNs, and a reversal (no flat kernel:
/// its array kernel runs on views).
const MIXED: &str = r#"
HloModule mixed
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
sum {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
body {
  state = (s32[], f32[8,8], f32[8], s32[4]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  w = f32[8,8] get-tuple-element(state), index=1
  v = f32[8] get-tuple-element(state), index=2
  k = s32[4] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  p = f32[8] dot(w, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[8] exponential(p)
  zero = f32[] constant(0)
  bz = f32[8] broadcast(zero), dimensions={}
  neg = pred[8] compare(p, bz), direction=LT
  q = f32[8] select(neg, e, p)
  ninf = f32[] constant(-inf)
  rows = f32[8] reduce(w, ninf), dimensions={1}, to_apply=max
  cols = f32[8] reduce(w, ninf), dimensions={0}, to_apply=max
  m = f32[8] maximum(rows, cols)
  fi = f32[] convert(i)
  bi = f32[8] broadcast(fi), dimensions={}
  s = f32[8] divide(m, bi)
  u0 = f32[8] add(q, s)
  ur = f32[8] reverse(u0), dimensions={0}
  u = f32[8] subtract(u0, ur)
  r = f32[8] tanh(u)
  ki = s32[4] broadcast(i), dimensions={}
  kk = s32[4] multiply(k, ki)
  z = s32[] constant(0)
  ks = s32[] reduce(kk, z), dimensions={0}, to_apply=sum
  kb = s32[4] broadcast(ks), dimensions={}
  knext = s32[4] subtract(kk, kb)
  ROOT out = (s32[], f32[8,8], f32[8], s32[4]) tuple(next, w, r, knext)
}
cond {
  state = (s32[], f32[8,8], f32[8], s32[4]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(12)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  one = s32[] constant(1)
  w = f32[8,8] parameter(0)
  v = f32[8] parameter(1)
  k = s32[4] parameter(2)
  init = (s32[], f32[8,8], f32[8], s32[4]) tuple(one, w, v, k)
  l = (s32[], f32[8,8], f32[8], s32[4]) while(init), condition=cond, body=body
  r = f32[8] get-tuple-element(l), index=2
  kr = s32[4] get-tuple-element(l), index=3
  ROOT t = (f32[8], s32[4]) tuple(r, kr)
}
"#;

/// Sums along both axes accumulated over the iterations: the order of each
/// reduction's partial sums shows in the results.
const SUMS: &str = r#"
HloModule sums
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
body {
  state = (s32[], f32[4,40], f32[4], f32[40]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  x = f32[4,40] get-tuple-element(state), index=1
  rows = f32[4] get-tuple-element(state), index=2
  cols = f32[40] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  zero = f32[] constant(0)
  r = f32[4] reduce(x, zero), dimensions={1}, to_apply=add
  c = f32[40] reduce(x, zero), dimensions={0}, to_apply=add
  rows2 = f32[4] add(rows, r)
  cols2 = f32[40] add(cols, c)
  k = f32[] constant(1.37)
  bk = f32[4,40] broadcast(k), dimensions={}
  s = f32[4,40] sine(x)
  x2 = f32[4,40] multiply(s, bk)
  ROOT out = (s32[], f32[4,40], f32[4], f32[40]) tuple(next, x2, rows2, cols2)
}
cond {
  state = (s32[], f32[4,40], f32[4], f32[40]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(20)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  zero = s32[] constant(0)
  x = f32[4,40] parameter(0)
  z = f32[] constant(0)
  rows = f32[4] broadcast(z), dimensions={}
  cols = f32[40] broadcast(z), dimensions={}
  init = (s32[], f32[4,40], f32[4], f32[40]) tuple(zero, x, rows, cols)
  l = (s32[], f32[4,40], f32[4], f32[40]) while(init), condition=cond, body=body
  r = f32[4] get-tuple-element(l), index=2
  c = f32[40] get-tuple-element(l), index=3
  ROOT t = (f32[4], f32[40]) tuple(r, c)
}
"#;

/// A state whose parts trade places: inputs returned at other positions, one of
/// them twice, and a constant returned.
const SWAPS: &str = r#"
HloModule swaps
body {
  state = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  a = f32[6] get-tuple-element(state), index=1
  b = f32[6] get-tuple-element(state), index=2
  c = f32[6] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  s = f32[6] add(a, b)
  k = f32[6] constant({1, 2, 3, 4, 5, 6})
  ROOT out = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(next, c, s, a, c, k)
}
cond {
  state = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(7)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  zero = s32[] constant(0)
  a = f32[6] parameter(0)
  b = f32[6] parameter(1)
  init = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(zero, a, b, a, b, a)
  l = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) while(init), condition=cond, body=body
  x = f32[6] get-tuple-element(l), index=1
  y = f32[6] get-tuple-element(l), index=2
  z = f32[6] get-tuple-element(l), index=3
  w = f32[6] get-tuple-element(l), index=4
  v = f32[6] get-tuple-element(l), index=5
  ROOT t = (f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(x, y, z, w, v)
}
"#;

/// Element-wise steps that untimed iterations chain: a broadcast that reorders
/// dimensions (a transposition, which stays out of chains) and one that keeps their
/// order, a clamp between one-element bounds, a copy and an `f32` conversion.
const REORDER: &str = r#"
HloModule reorder
body {
  state = (s32[], f32[2,3]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[2,3] get-tuple-element(state), index=1
  t = f32[3,2] broadcast(x), dimensions={1,0}
  r = f32[2,3] reshape(t)
  k = f32[1,2,3] broadcast(x), dimensions={1,2}
  kr = f32[2,3] reshape(k)
  lo = f32[] constant(-2.5)
  hi = f32[] constant(3)
  c = f32[2,3] clamp(lo, r, hi)
  d = f32[2,3] copy(c)
  e = f32[2,3] convert(d)
  h = f32[] constant(0.5)
  bh = f32[2,3] broadcast(h), dimensions={}
  s = f32[2,3] multiply(e, bh)
  y = f32[2,3] add(s, kr)
  ROOT out = (s32[], f32[2,3]) tuple(next, y)
}
cond {
  state = (s32[], f32[2,3]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(40)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  zero = s32[] constant(0)
  x = f32[2,3] parameter(0)
  init = (s32[], f32[2,3]) tuple(zero, x)
  l = (s32[], f32[2,3]) while(init), condition=cond, body=body
  ROOT y = f32[2,3] get-tuple-element(l), index=1
}
"#;

/// An input: its type, dimensions and little-endian bytes.
type Bound = (DType, Vec<u64>, Vec<u8>);

/// An instruction's trace entry and tick interval, as a run reported it.
type Reported = (usize, u64, u64);

/// A scan: each iteration reads row `i` of `xs` (and windows of it whose starts
/// clamp, past the end and below zero) and writes it into row `i` of `ys` from
/// column 1 (in place, the updated array being dead after it), and scatters a token
/// into element `i` of `tokens` (in place too), while the condition updates a copy
/// of `ys` it must not write into the state (indices past the end clamp).
const SCAN: &str = r#"
HloModule scan
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
assign {
  a = s32[] parameter(0)
  ROOT b = s32[] parameter(1)
}
body {
  state = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  xs = f32[6,4] get-tuple-element(state), index=1
  ys = f32[6,6] get-tuple-element(state), index=2
  h = f32[4] get-tuple-element(state), index=3
  zero = s32[] constant(0)
  x = f32[1,4] dynamic-slice(xs, i, zero), dynamic_slice_sizes={1,4}
  xr = f32[4] reshape(x)
  s0 = f32[4] add(h, xr)
  x2 = f32[2,4] dynamic-slice(xs, i, zero), dynamic_slice_sizes={2,4}
  z2 = f32[] constant(0)
  x2r = f32[4] reduce(x2, z2), dimensions={0}, to_apply=sum
  neg = s32[] negate(i)
  one2 = s32[] constant(1)
  x3 = f32[3,2] dynamic-slice(xs, neg, one2), dynamic_slice_sizes={3,2}
  x3r = f32[] reduce(x3, z2), dimensions={0,1}, to_apply=sum
  x3b = f32[4] broadcast(x3r), dimensions={}
  s1 = f32[4] add(s0, x2r)
  s = f32[4] subtract(s1, x3b)
  hn = f32[4] tanh(s)
  hr = f32[1,4] reshape(hn)
  column = s32[] constant(1)
  ys2 = f32[6,6] dynamic-update-slice(ys, hr, i, column)
  one = s32[] constant(1)
  next = s32[] add(i, one)
  tokens = s32[6] get-tuple-element(state), index=4
  at = s32[1] reshape(i)
  three = s32[] constant(3)
  token = s32[] multiply(next, three)
  tokens2 = s32[6] scatter(tokens, at, token), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=0, to_apply=assign
  ROOT out = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) tuple(next, xs, ys2, hn, tokens2)
}
cond {
  state = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  ys = f32[6,6] get-tuple-element(state), index=2
  zero = s32[] constant(0)
  probe = f32[1,4] constant({{0.5, -0.5, 2, 3}})
  ys3 = f32[6,6] dynamic-update-slice(ys, probe, i, zero)
  z = f32[] constant(0)
  t = f32[] reduce(ys3, z), dimensions={0,1}, to_apply=sum
  finite = pred[] compare(t, t), direction=EQ
  n = s32[] constant(6)
  more = pred[] compare(i, n), direction=LT
  ROOT go = pred[] and(more, finite)
}
ENTRY main {
  zero = s32[] constant(0)
  xs = f32[6,4] parameter(0)
  h = f32[4] parameter(1)
  z = f32[] constant(0)
  ys = f32[6,6] broadcast(z), dimensions={}
  seven = s32[] constant(-7)
  tokens = s32[6] broadcast(seven), dimensions={}
  init = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) tuple(zero, xs, ys, h, tokens)
  l = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) while(init), condition=cond, body=body
  y = f32[6,6] get-tuple-element(l), index=2
  hl = f32[4] get-tuple-element(l), index=3
  tl = s32[6] get-tuple-element(l), index=4
  ROOT r = (f32[6,6], f32[4], s32[6]) tuple(y, hl, tl)
}
"#;

/// Runs `hlo` on `inputs` with small loops (`fuse`) or without; its outputs' bytes
/// and the trace entries reported, in order.
fn run(hlo: &str, inputs: &[Bound], fuse: bool) -> (Vec<Vec<u8>>, Vec<Reported>) {
    let program = compile_hlo(hlo, Target::Trn1).expect("compiles");
    let executable = Executable::new(program.clone(), fuse);
    assert_eq!(executable.small.iter().flatten().count(), usize::from(fuse), "the loop runs small when fused");
    let values = inputs
        .iter()
        .map(|(dtype, dims, bytes)| Input::Copied(Value::from_le_bytes(&ArrayType::new(*dtype, dims.clone()), bytes)))
        .collect();
    let destinations = program.outputs.iter().map(|_| None).collect();
    let mut reported = Vec::new();
    let pool = HostPool::new(1);
    let outputs = executable
        .run(values, destinations, u64::MAX, &pool, &mut |_| unreachable!(), &mut |k, start, end| {
            reported.push((k, start, end))
        })
        .expect("runs");
    (outputs.iter().map(Output::le_bytes).collect(), reported)
}

/// Floats with NaNs, infinities and signed zeros among them, drawn from `seed`.
fn floats(n: usize, seed: u32, scale: f32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| {
            let x = i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
            match x % 89 {
                0 if seed.is_multiple_of(3) => f32::NAN,
                1 if seed.is_multiple_of(4) => f32::NEG_INFINITY,
                2 => -0.0,
                _ => ((x % 2001) as f32 / 1000.0 - 1.0) * scale,
            }
        })
        .flat_map(f32::to_le_bytes)
        .collect()
}

#[test]
fn small_loops_give_the_general_runs_bits() {
    for seed in 0..12 {
        let damped = [(DType::F32, vec![64], floats(64, seed, 1.0 + seed as f32))];
        let ints: Vec<u8> = [3i32, -7, i32::MAX - seed as i32, 12].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mixed = [
            (DType::F32, vec![8, 8], floats(64, seed, 0.5)),
            (DType::F32, vec![8], floats(8, seed + 100, 2.0)),
            (DType::S32, vec![4], ints),
        ];
        let sums = [(DType::F32, vec![4, 40], floats(160, seed, 3.0))];
        let swaps = [(DType::F32, vec![6], floats(6, seed, 1.0)), (DType::F32, vec![6], floats(6, seed + 7, 5.0))];
        let scan = [(DType::F32, vec![6, 4], floats(24, seed, 2.0)), (DType::F32, vec![4], floats(4, seed + 3, 1.0))];
        let reorder = [(DType::F32, vec![2, 3], floats(6, seed, 4.0))];
        let programs = [
            (DAMPED, &damped[..]),
            (MIXED, &mixed[..]),
            (SUMS, &sums[..]),
            (SWAPS, &swaps[..]),
            (SCAN, &scan[..]),
            (REORDER, &reorder[..]),
        ];
        for (hlo, inputs) in programs {
            let (small, _) = run(hlo, inputs, true);
            let (general, _) = run(hlo, inputs, false);
            assert_eq!(small, general, "seed {seed}");
        }
    }
}

#[test]
fn a_scans_rows_are_written_in_place_but_never_into_the_conditions_state() {
    let executable = Executable::new(compile_hlo(SCAN, Target::Trn1).expect("compiles"), true);
    let small_loop = executable.small.iter().flatten().next().expect("a small loop");
    let in_place = |c: &Compact| c.steps.iter().filter(|s| s.in_place.is_some()).count();
    assert_eq!((in_place(&small_loop.condition), in_place(&small_loop.body)), (0, 1));
    let sliced = small_loop.body.steps.iter().filter(|s| s.sliced.is_some()).count();
    assert_eq!(sliced, 3, "the body's dynamic slices copy rows");
    let scattered = small_loop.body.steps.iter().filter(|s| s.scatters_one).count();
    assert_eq!(scattered, 1, "the body's scatter of one token writes it in place");
}

#[test]
fn a_small_loop_reports_every_instruction_as_the_general_run_does() {
    let inputs = [(DType::F32, vec![64], floats(64, 1, 3.0))];
    let (_, small) = run(DAMPED, &inputs, true);
    let (_, general) = run(DAMPED, &inputs, false);
    // The same instructions in the same order; the broadcasts of constants, which a
    // small loop computes once, take no time.
    let entries = |reported: &[Reported]| reported.iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(entries(&small), entries(&general));
    let executable = Executable::new(compile_hlo(DAMPED, Target::Trn1).expect("compiles"), true);
    let small_loop = executable.small.iter().flatten().next().expect("a small loop");
    let hoisted: Vec<usize> = small_loop.body.steps.iter().filter(|s| s.hoisted).map(|s| s.entry).collect();
    assert_eq!(hoisted.len(), 2, "the two broadcasts of constants");
    assert!(small.iter().filter(|r| hoisted.contains(&r.0)).all(|r| r.1 == r.2), "no time for them");
    assert!(small.len() > 100, "{} intervals", small.len());
    // Back to back inside each iteration, which starts where the one before ended.
    let mut previous = small[0].1;
    for &(k, start, end) in &small {
        assert!(start <= end, "entry {k}: {start} > {end}");
        if k != 0 {
            assert_eq!(start, previous, "entry {k} starts where the instruction before it ended");
            previous = end;
        }
    }
}

#[test]
fn a_small_loop_that_never_ends_stops_at_the_deadline() {
    let hlo = DAMPED.replace("direction=GT", "direction=NE").replace("constant(300)", "constant(2147483647)");
    let program = compile_hlo(&hlo, Target::Trn1).expect("compiles");
    let executable = Executable::new(program.clone(), true);
    let x = Value::from_le_bytes(&ArrayType::new(DType::F32, vec![64]), &floats(64, 5, 1.0));
    let before = ticks();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let deadline = ticks() + 10 * (ticks() - before);
    let mut iterations = 0;
    let result = executable.run(
        vec![Input::Copied(x)],
        program.outputs.iter().map(|_| None).collect(),
        deadline,
        &HostPool::new(1),
        &mut |_| unreachable!(),
        &mut |k, _, _| iterations += usize::from(k == 0),
    );
    assert!(matches!(result, Err(RunError::DeadlineExceeded { step: 0 })), "{result:?}");
    assert!(iterations > 10, "{iterations} iterations before the deadline");
}

#[test]
fn untimed_iterations_share_the_interval_read_after_them() {
    // A condition of two instructions (entries 10 and 11) and a body of two (12 and 13)
    // in loop entry 5, whose last timed iteration took 128 ticks: 16, 32, 32 and 48.
    let mut report = Iterations::new(5, vec![10, 11, 12, 13]);
    report.ends.copy_from_slice(&[1016, 1048, 1080, 1128]);
    report.measured(1000, 1128);
    // Three whole iterations and a last one of the condition alone (3/8 of a whole one)
    // in 432 ticks: 128 each, and 48.
    report.pending = 3;
    let mut seen = Vec::new();
    report.report(2000, 2432, Some(Last::Ended(2)), &mut |k, start, end| seen.push((k, start, end)));
    let mut expected = Vec::new();
    for base in [2000, 2128, 2256] {
        let ends = [base + 16, base + 48, base + 80, base + 128];
        let starts = [base, base + 16, base + 48, base + 80];
        expected.extend([10, 11, 12, 13].into_iter().zip(starts).zip(ends).map(|((k, s), e)| (k, s, e)));
        expected.push((5, base, base + 128));
    }
    expected.extend([(10, 2384, 2400), (11, 2400, 2432), (5, 2384, 2432)]);
    assert_eq!(seen, expected);
    assert_eq!(report.pending, 0);
    assert!(report.spans.is_empty(), "the room is emptied for the next flush");
}

#[test]
fn untimed_iterations_run_chains_of_element_wise_steps_and_scalar_steps() {
    let kinds = |c: &Compact| -> Vec<String> {
        c.fast
            .iter()
            .map(|call| match call {
                fast::Fast::Chain(members) => format!("chain of {}", members.len()),
                fast::Fast::Scalar { .. } => "scalar".into(),
                fast::Fast::Prepared(_) => "prepared".into(),
                fast::Fast::Step(_) => "step".into(),
            })
            .collect()
    };
    let executable = Executable::new(compile_hlo(DAMPED, Target::Trn1).expect("compiles"), true);
    let damped = executable.small.iter().flatten().next().expect("a small loop");
    // |x| and its sum; two comparisons and their conjunction.
    assert_eq!(kinds(&damped.condition), ["chain of 2", "scalar", "scalar", "scalar"]);
    // The counter; x·0.97, tanh(x), tanh(x)·0.001 and their difference.
    assert_eq!(kinds(&damped.body), ["scalar", "chain of 4"]);
    let executable = Executable::new(compile_hlo(MIXED, Target::Trn1).expect("compiles"), true);
    let mixed = executable.small.iter().flatten().next().expect("a small loop");
    let body = kinds(&mixed.body);
    assert!(body.contains(&"prepared".to_string()), "the matrix-vector product: {body:?}");
    assert!(body.contains(&"step".to_string()), "the reversal: {body:?}");
}

/// Runs `hlo`, which fails, on `inputs` with small loops (`fuse`) or without; the
/// trace entries reported, in order.
fn run_failing(hlo: &str, inputs: &[Bound], fuse: bool) -> Vec<usize> {
    let program = compile_hlo(hlo, Target::Trn1).expect("compiles");
    let executable = Executable::new(program.clone(), fuse);
    let values = inputs
        .iter()
        .map(|(dtype, dims, bytes)| Input::Copied(Value::from_le_bytes(&ArrayType::new(*dtype, dims.clone()), bytes)))
        .collect();
    let destinations = program.outputs.iter().map(|_| None).collect();
    let mut reported = Vec::new();
    let result = executable.run(
        values,
        destinations,
        u64::MAX,
        &HostPool::new(1),
        &mut |_| unreachable!(),
        &mut |k, start, end| {
            assert!(start <= end, "entry {k}");
            reported.push(k)
        },
    );
    assert!(matches!(result, Err(RunError::OutOfBounds { .. })), "{result:?}");
    reported
}

#[test]
fn a_small_loop_that_fails_reports_what_ran_as_the_general_run_does() {
    // The body reads element i of a table of `n`: iteration n fails, after the
    // condition and the counter's increment ran.
    let failing = |n: usize| {
        format!(
            r#"
HloModule failing
body {{
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[4] get-tuple-element(s), index=1
  table = f32[{n}] iota(), iota_dimension=0
  at = s32[1] reshape(i)
  g = f32[1] gather(table, at), offset_dims={{0}}, collapsed_slice_dims={{}}, start_index_map={{0}}, index_vector_dim=0, slice_sizes={{1}}
  gs = f32[] reshape(g)
  gb = f32[4] broadcast(gs), dimensions={{}}
  y = f32[4] add(x, gb)
  ROOT t = (s32[], f32[4]) tuple(next, y)
}}
cond {{
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  cap = s32[] constant(100)
  ROOT go = pred[] compare(i, cap), direction=LT
}}
ENTRY main {{
  zero = s32[] constant(0)
  x = f32[4] parameter(0)
  init = (s32[], f32[4]) tuple(zero, x)
  l = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT y = f32[4] get-tuple-element(l), index=1
}}
"#
        )
    };
    let inputs = [(DType::F32, vec![4], floats(4, 2, 1.0))];
    // Failing in timed iterations (1, 32) and in untimed ones (7, 33).
    for n in [1, 7, 32, 33] {
        let hlo = failing(n);
        let small = run_failing(&hlo, &inputs, true);
        let general = run_failing(&hlo, &inputs, false);
        assert_eq!(small, general, "failing at iteration {n}");
    }
}
