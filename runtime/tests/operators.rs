//! Operators whose corner cases the JAX fixtures do not reach: window padding in
//! `select-and-scatter`, reducers that are not a plain binary operation, empty
//! reductions, bit casts between widths, and the statistics of `rng`.

use common::{Bench, f32_inputs, floats, ints};
use neuron_test_support::runtime as common;

use neuron_runtime::{CompileOptions, Target};

fn exact() -> CompileOptions {
    CompileOptions::exact(Target::Trn1)
}

const SELECT_AND_SCATTER: &str = "HloModule sas
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[5] parameter(0)
  src = f32[SOURCE] parameter(1)
  zero = f32[] constant(0)
  ROOT r = f32[5] select-and-scatter(x, src, zero), window={WINDOW}, select=ge, scatter=sum
}
";

fn select_and_scatter(window: &str, sources: usize, x: &[f32], src: &[f32]) -> Vec<f32> {
    let hlo = SELECT_AND_SCATTER.replace("WINDOW", window).replace("SOURCE", &sources.to_string());
    Bench::new().run_f32(&hlo, &exact(), &[x, src])
}

#[test]
fn select_and_scatter_skips_padding_keeps_the_first_of_equal_elements_and_adds_overlaps() {
    // Windows of 3 with stride 2 and one padding element each side: [pad, 1, 5],
    // [5, 2, 5], [5, 0, pad]. Padding is never selected; on ties (GE) the first wins.
    let x = [1.0, 5.0, 2.0, 5.0, 0.0];
    let got = select_and_scatter("size=3 stride=2 pad=1_1", 3, &x, &[10.0, 20.0, 40.0]);
    assert_eq!(got, [0.0, 30.0, 0.0, 40.0, 0.0]);

    // Without padding, windows of 2 with stride 1: [7, 7] selects its first element,
    // [7, 1] its first (element 1), [1, 0] element 2 and [0, 3] element 4.
    let got = select_and_scatter("size=2 stride=1", 4, &[7.0, 7.0, 1.0, 0.0, 3.0], &[1.0, 2.0, 4.0, 8.0]);
    assert_eq!(got, [1.0, 2.0, 4.0, 0.0, 8.0]);

    // The same selector written with its parameters swapped: compare(b, a), LE.
    let mirrored = SELECT_AND_SCATTER
        .replace("compare(a, b), direction=GE", "compare(b, a), direction=LE")
        .replace("WINDOW", "size=2 stride=1")
        .replace("SOURCE", "4");
    let got = Bench::new().run_f32(&mirrored, &exact(), &[&[7.0, 7.0, 1.0, 0.0, 3.0], &[1.0, 2.0, 4.0, 8.0]]);
    assert_eq!(got, [1.0, 2.0, 4.0, 0.0, 8.0]);
}

#[test]
fn select_and_scatter_rejects_a_source_that_does_not_match_the_windows() {
    let hlo = SELECT_AND_SCATTER.replace("WINDOW", "size=2 stride=2").replace("SOURCE", "3");
    let err = neuron_runtime::compile_hlo(&hlo, Target::Trn1).expect_err("5 elements hold 2 windows of 2");
    assert!(err.to_string().contains("one element per window ([2])"), "{err}");
}

#[test]
fn a_reducer_that_is_not_a_plain_operation_runs_element_wise_with_its_constants() {
    let hlo = "HloModule r
max_plus_zero {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  m = s32[] maximum(a, b)
  z = s32[] constant(0)
  ROOT r = s32[] add(m, z)
}
ENTRY e {
  x = s32[3,7] parameter(0)
  init = s32[] constant(-100)
  ROOT r = s32[3] reduce(x, init), dimensions={1}, to_apply=max_plus_zero
}
";
    let x: Vec<i32> = (0..21).map(|i| (i * 37 % 23) - 11).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let got = ints(&Bench::new().run(hlo, &exact(), &[bytes]));
    let expected: Vec<i32> = x.chunks(7).map(|row| *row.iter().max().expect("row")).collect();
    assert_eq!(got, expected);
}

#[test]
fn reducing_an_empty_dimension_gives_the_initial_values() {
    let hlo = "HloModule r
arg {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  v = f32[] select(gt, a, b)
  k = s32[] select(gt, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
ENTRY e {
  x = f32[0,3] parameter(0)
  i = s32[0,3] parameter(1)
  lo = f32[] constant(-inf)
  none = s32[] constant(-1)
  r = (f32[3], s32[3]) reduce(x, i, lo, none), dimensions={0}, to_apply=arg
  ROOT k = s32[3] get-tuple-element(r), index=1
}
";
    let got = ints(&Bench::new().run(hlo, &exact(), &[vec![], vec![]]));
    assert_eq!(got, [-1, -1, -1]);
}

#[test]
fn bitcast_convert_between_widths_splits_and_joins_little_endian_words() {
    let hlo = "HloModule b
ENTRY e {
  x = u32[2,2] parameter(0)
  wide = u64[2] bitcast-convert(x)
  one = u64[] constant(1)
  ones = u64[2] broadcast(one), dimensions={}
  sum = u64[2] add(wide, ones)
  ROOT back = u32[2,2] bitcast-convert(sum)
}
";
    let words: [u32; 4] = [0xFFFF_FFFF, 0x0000_0001, 0x1234_5678, 0x9ABC_DEF0];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let all = Bench::new().run_all(hlo, &exact(), &[bytes]);
    let got: Vec<u32> = all[0].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    // 0x00000001_FFFFFFFF + 1 carries into the high word.
    assert_eq!(got, [0, 2, 0x1234_5679, 0x9ABC_DEF0]);
}

#[test]
fn rng_uniform_draws_from_the_interval_with_new_values_each_execution() {
    let hlo = "HloModule rng
ENTRY e {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  lo = s32[] constant(-3)
  hi = s32[] constant(4)
  f = f32[20000] rng(a, b), distribution=rng_uniform
  i = s32[700] rng(lo, hi), distribution=rng_uniform
  ROOT t = (f32[20000], s32[700]) tuple(f, i)
}
";
    let runs = Bench::new().run_repeatedly(hlo, &exact(), &f32_inputs(&[&[2.0], &[12.0]]), 2);
    for run in &runs {
        let f = floats(&run[0]);
        assert!(f.iter().all(|&x| (2.0..12.0).contains(&x)), "a float outside [2, 12)");
        let mean = f.iter().map(|&x| f64::from(x)).sum::<f64>() / f.len() as f64;
        // The mean of 20000 uniform draws on [2, 12) has a standard deviation of 0.02.
        assert!((mean - 7.0).abs() < 0.1, "mean {mean}");
        let below_4 = f.iter().filter(|&&x| x < 4.0).count();
        assert!((3600..4400).contains(&below_4), "{below_4} of 20000 below 4 (expected 4000)");

        let i = ints(&run[1]);
        for v in -3..4 {
            let n = i.iter().filter(|&&x| x == v).count();
            assert!((60..140).contains(&n), "{v} drawn {n} times of 700 (expected 100)");
        }
        assert!(i.iter().all(|&x| (-3..4).contains(&x)));
    }
    assert_ne!(runs[0][0], runs[1][0], "a second execution draws new numbers");
}
