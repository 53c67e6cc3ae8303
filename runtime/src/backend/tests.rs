//! Tests of the executable's interval splitting and its in-place combination of
//! little-endian buffers.

use super::*;
use ndarray::{ArrayD, IxDyn};

#[test]
fn a_fused_interval_is_split_by_share_and_covers_the_whole_span() {
    assert_eq!(split_interval(100, 200, &[1, 3]), vec![(100, 125), (125, 200)]);
    assert_eq!(split_interval(0, 9, &[0, 0, 0]), vec![(0, 3), (3, 6), (6, 9)]);
    assert_eq!(split_interval(5, 5, &[2, 2]), vec![(5, 5), (5, 5)]);
}

/// The in-place combine gives the bits of the general path's kernels, specials included.
#[test]
fn combining_in_place_gives_the_kernels_bits() {
    let floats = [1.5f32, -0.0, f32::NAN, f32::INFINITY, 1e-45, f32::MAX, -3.25, 7e-39];
    let others = [2.25f32, 0.0, 1.0, f32::NEG_INFINITY, 1e-45, f32::MAX, 0.1, -7e-39];
    let ints = [i32::MAX, -5, 7, i32::MIN, 0, 123_456, -1, 3];
    let int_others = [1, -7, 9, i32::MIN, 0, 654_321, i32::MAX, -3];
    // 16-bit floats: ties that round to even, overflow to infinity, subnormals, NaN.
    let halves = |values: &[f32], bf: bool| -> Vec<u8> {
        values
            .iter()
            .flat_map(
                |&v| {
                    if bf { half::bf16::from_f32(v).to_le_bytes() } else { half::f16::from_f32(v).to_le_bytes() }
                },
            )
            .collect()
    };
    let h = [1.0f32, 1.0, 65504.0, 3.0e38, -0.0, f32::NAN, 6.0e-8, 0.1];
    let h_others = [1.0f32 / 256.0, 3.0 / 256.0, 65504.0, 3.0e38, 0.0, 1.0, 6.0e-8, 0.2];
    let cases: [(DType, Vec<u8>, Vec<u8>); 4] = [
        (DType::F32, bytemuck::cast_slice(&floats).to_vec(), bytemuck::cast_slice(&others).to_vec()),
        (DType::S32, bytemuck::cast_slice(&ints).to_vec(), bytemuck::cast_slice(&int_others).to_vec()),
        (DType::BF16, halves(&h, true), halves(&h_others, true)),
        (DType::F16, halves(&h, false), halves(&h_others, false)),
    ];
    for (dtype, a, b) in cases {
        for op in [ReduceOp::Add, ReduceOp::Multiply] {
            let mut fast = a.clone();
            assert!(combine_in_place(op, dtype, &mut fast, &b), "{op:?} {dtype:?} takes the fast path");
            let ty = ArrayType::new(dtype, vec![a.len() as u64 / dtype.size_bytes()]);
            let (x, y) = (Value::from_le_bytes(&ty, &a), Value::from_le_bytes(&ty, &b));
            let binary = if op == ReduceOp::Add { BinaryOp::Add } else { BinaryOp::Multiply };
            let general = kernels::execute(&Op::Binary(binary), &[x.view(), y.view()], &ty, &HostPool::new(1));
            let mut expected = a.clone();
            general.expect("kernel").write_le_bytes(&mut expected);
            assert_eq!(fast, expected, "{op:?} {dtype:?}");
            let mut fused = vec![0u8; a.len()];
            combine_le_bytes_into(op, dtype, &mut fused, &a, &b);
            assert_eq!(fused, expected, "{op:?} {dtype:?} into a third buffer");
        }
    }
}

/// Two products of 32 Ki elements, the first dying before the second runs.
const PRODUCTS_HLO: &str = r#"
HloModule products
ENTRY main {
  x = f32[256,128] parameter(0)
  w = f32[128,128] parameter(1)
  a = f32[256,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[256,128] exponential(a)
  b = f32[256,128] dot(e, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = f32[256,128] add(b, x)
}
"#;

/// A product's result (of 32 Ki elements, enough to be written into a spare array)
/// goes into an array holding what an earlier run left there (the product before it,
/// which died): every run gives the first run's bits, and the unfused executable's.
#[test]
fn products_into_spare_arrays_give_the_same_bits_at_every_run() {
    use crate::compile::{Target, compile_hlo};
    let program = compile_hlo(PRODUCTS_HLO, Target::Trn1).expect("compiles");
    let x = ArrayD::from_shape_fn(IxDyn(&[256, 128]), |i| ((i[0] * 7 + i[1]) % 11) as f32 * 0.01 - 0.05);
    let w = ArrayD::from_shape_fn(IxDyn(&[128, 128]), |i| ((i[0] * 5 + i[1] * 3) % 7) as f32 * 0.005 - 0.015);
    let run = |executable: &Executable| {
        let inputs = vec![Input::Copied(Value::F32(x.clone())), Input::Copied(Value::F32(w.clone()))];
        let destinations = program.outputs.iter().map(|_| None).collect();
        let outputs = executable
            .run(inputs, destinations, u64::MAX, &HostPool::new(1), &mut |_| unreachable!(), &mut |_, _, _| {})
            .expect("runs");
        outputs.iter().map(Output::le_bytes).collect::<Vec<_>>()
    };
    let unfused = run(&Executable::new(program.clone(), false));
    let executable = Executable::new(program.clone(), true);
    for _ in 0..3 {
        assert_eq!(run(&executable), unfused);
    }
    assert!(!executable.spare.lock().unwrap_or_else(PoisonError::into_inner).is_empty(), "arrays were kept");
}

/// Dead arrays are kept as spares only where something asks for their length, and at
/// most eight of a length.
#[test]
fn spares_keep_at_most_eight_arrays_of_a_length_something_asks_for() {
    use crate::compile::{Target, compile_hlo};
    let executable = Executable::new(compile_hlo(PRODUCTS_HLO, Target::Trn1).expect("compiles"), true);
    let dead = |n: usize| Slot::Owned(Value::F32(ArrayD::zeros(IxDyn(&[n]))));
    for _ in 0..12 {
        executable.recycle(dead(256 * 128));
        executable.recycle(dead(100 * 128));
    }
    let lengths: Vec<usize> =
        executable.spare.lock().unwrap_or_else(PoisonError::into_inner).iter().map(Vec::len).collect();
    assert_eq!(lengths, vec![256 * 128; 8]);
    assert_eq!(executable.spare_f32(256 * 128).len(), 256 * 128);
    assert_eq!(executable.spare.lock().unwrap_or_else(PoisonError::into_inner).len(), 7);
}
