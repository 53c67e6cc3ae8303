//! What each `neuron-cc` numerics and optimisation option does to a program's results
//! and instructions, checked by executing compiled HLO against host references.

use neuron_runtime::isa::{Op, Program};

use neuron_runtime::{AutoCast, AutoCastType, CompileOptions, OptLevel, Target, compile_hlo_with};

use common::Bench;
use neuron_test_support::runtime as common;

fn options(auto_cast: AutoCast, auto_cast_type: AutoCastType) -> CompileOptions {
    CompileOptions { auto_cast, auto_cast_type, ..CompileOptions::new(Target::Trn1) }
}

/// Values with more mantissa bits than bf16 or fp16 hold.
fn awkward(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.318_309_87).sin() * 1.718_281_8).collect()
}

const DOT: &str = "HloModule dot\nENTRY e {\n  a = f32[4,8]{1,0} parameter(0)\n  b = f32[8,3]{1,0} parameter(1)\n  \
    ROOT d = f32[4,3]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";

/// The product of `a` (4×8) and `b` (8×3) with each operand rounded by `round`,
/// accumulated in f64.
fn reference_dot(a: &[f32], b: &[f32], round: impl Fn(f32) -> f32) -> Vec<f64> {
    let mut out = vec![0f64; 12];
    for i in 0..4 {
        for j in 0..3 {
            out[i * 3 + j] = (0..8).map(|k| f64::from(round(a[i * 8 + k])) * f64::from(round(b[k * 3 + j]))).sum();
        }
    }
    out
}

fn assert_close(got: &[f32], expected: &[f64], what: &str) {
    for (g, e) in got.iter().zip(expected) {
        assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "{what}: {g} vs {e}");
    }
}

#[test]
fn auto_cast_rounds_matrix_product_operands_and_accumulates_in_f32() {
    let bench = Bench::new();
    let (a, b) = (awkward(32, 1.0), awkward(24, 7.0));
    let bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let fp16 = |x: f32| half::f16::from_f32(x).to_f32();
    let tf32 = |x: f32| {
        let bits = x.to_bits();
        f32::from_bits((bits + 0xfff + ((bits >> 13) & 1)) & !0x1fff)
    };

    let default = bench.run_f32(DOT, &CompileOptions::new(Target::Trn1), &[&a, &b]);
    assert_close(&default, &reference_dot(&a, &b, bf16), "default (matmult, bf16)");
    let exact = bench.run_f32(DOT, &options(AutoCast::None, AutoCastType::Bf16), &[&a, &b]);
    assert_close(&exact, &reference_dot(&a, &b, |x| x), "none");
    assert_ne!(default, exact, "bf16 operands change the product");
    let got = bench.run_f32(DOT, &options(AutoCast::MatMult, AutoCastType::Fp16), &[&a, &b]);
    assert_close(&got, &reference_dot(&a, &b, fp16), "matmult, fp16");
    let got = bench.run_f32(DOT, &options(AutoCast::MatMult, AutoCastType::Tf32), &[&a, &b]);
    assert_close(&got, &reference_dot(&a, &b, tf32), "matmult, tf32");
    // FP8 E4M3 keeps 3 mantissa bits: 1.718 becomes 1.75.
    let ones = vec![1.718_281_8f32; 32];
    let got = bench.run_f32(DOT, &options(AutoCast::MatMult, AutoCastType::Fp8E4m3), &[&ones, &[1.0; 24]]);
    assert!(got.iter().all(|&x| x == 8.0 * 1.75), "{got:?}");
}

/// 1.00390625, the constant of the HLO below: 1.0 once rounded to bf16.
const ONE_PLUS_2_TO_MINUS_8: f32 = 1.0 + 1.0 / 256.0;

#[test]
fn auto_cast_all_rounds_every_computed_value_and_saturate_infinity_clamps() {
    let bench = Bench::new();
    let hlo = "HloModule all\nENTRY e {\n  x = f32[6]{0} parameter(0)\n  c = f32[] constant(1.00390625)\n  \
        b = f32[6]{0} broadcast(c), dimensions={}\n  m = f32[6]{0} multiply(x, b)\n  ROOT t = f32[6]{0} tanh(m)\n}\n";
    let x = [0.1f32, 0.2, 0.3, -0.7, 1.5, 2.5];
    let got = bench.run_f32(hlo, &options(AutoCast::All, AutoCastType::Bf16), &[&x]);
    let bf16 = |v: f32| half::bf16::from_f32(v).to_f32();
    for (g, &v) in got.iter().zip(&x) {
        // The parameter, the constant (1.00390625 is 1 + 2^-8: 1.0 in bf16), the product and the tanh are each rounded.
        let expected = bf16(bf16(bf16(v) * bf16(ONE_PLUS_2_TO_MINUS_8)).tanh());
        assert_eq!(*g, expected, "tanh({v})");
    }
    let exact = bench.run_f32(hlo, &options(AutoCast::MatMult, AutoCastType::Bf16), &[&x]);
    assert_eq!(exact[0], (0.1f32 * ONE_PLUS_2_TO_MINUS_8).tanh(), "matmult leaves element-wise work in f32");

    let big = "HloModule big\nENTRY e {\n  x = f32[2]{0} parameter(0)\n  ROOT y = f32[2]{0} multiply(x, x)\n}\n";
    let fp16_all = options(AutoCast::All, AutoCastType::Fp16);
    assert_eq!(bench.run_f32(big, &fp16_all, &[&[300.0, -1.0]]), [f32::INFINITY, 1.0], "300² overflows fp16");
    let saturating = CompileOptions { saturate_infinity: true, ..fp16_all };
    assert_eq!(bench.run_f32(big, &saturating, &[&[300.0, -1.0]]), [65504.0, 1.0]);
}

#[test]
fn reductions_over_bf16_accumulate_in_bf16_unless_mixed_precision_accumulation_is_on() {
    let bench = Bench::new();
    let hlo = "HloModule sum\nadd {\n  a = bf16[] parameter(0)\n  b = bf16[] parameter(1)\n  ROOT s = bf16[] add(a, b)\n}\n\
        ENTRY e {\n  x = bf16[1024]{0} parameter(0)\n  z = bf16[] constant(0)\n  \
        ROOT r = bf16[] reduce(x, z), dimensions={0}, to_apply=add\n}\n";
    let ones: Vec<u8> = (0..1024).flat_map(|_| half::bf16::ONE.to_le_bytes()).collect();
    let sum = |options: &CompileOptions| {
        let bytes = bench.run(hlo, options, std::slice::from_ref(&ones));
        half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
    };
    let narrow = sum(&CompileOptions::new(Target::Trn1));
    // Accumulating in bf16 (8 significant bits), the sum stops growing at 256: 256 + 1
    // rounds back to 256 (ties to even).
    assert_eq!(narrow, 256.0, "bf16 accumulation");
    let wide = sum(&CompileOptions { mixed_precision_accumulation: true, ..CompileOptions::new(Target::Trn1) });
    assert_eq!(wide, 1024.0, "f32 accumulation");
}

#[test]
fn hlo_reduce_precision_rounds_to_the_given_widths() {
    let bench = Bench::new();
    let hlo = "HloModule rp\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  \
        ROOT r = f32[4]{0} reduce-precision(x), exponent_bits=5, mantissa_bits=10\n}\n";
    let x = [1.0f32 / 3.0, 70000.0, 1e-6, -2.5];
    let got = bench.run_f32(hlo, &CompileOptions::exact(Target::Trn1), &[&x]);
    let expected: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    assert_eq!(got, expected);
}

fn compile(hlo: &str, optlevel: OptLevel) -> Program {
    compile_hlo_with(hlo, &CompileOptions { optlevel, ..CompileOptions::exact(Target::Trn1) }).expect("compile")
}

fn opcodes(program: &Program) -> Vec<&'static str> {
    let mut steps: Vec<_> = program.instructions().map(|i| (i.step, i.op.opcode())).collect();
    steps.sort();
    steps.into_iter().map(|(_, op)| op).collect()
}

#[test]
fn optlevels_drop_dead_code_reuse_scratchpad_and_forward_copies() {
    let hlo = "HloModule opt\nENTRY e {\n  x = f32[64]{0} parameter(0)\n  a = f32[64]{0} exponential(x)\n  \
        unused = f32[64]{0} negate(a)\n  c = f32[64]{0} copy(a)\n  r = f32[64]{0} reshape(c)\n  \
        b = f32[64]{0} tanh(r)\n  s = f32[64]{0} sine(b)\n  ROOT t = f32[64]{0} cosine(s)\n}\n";
    let o1 = compile(hlo, OptLevel::O1);
    let o2 = compile(hlo, OptLevel::O2);
    let o3 = compile(hlo, OptLevel::O3);
    assert_eq!(opcodes(&o1), ["Exp", "Negate", "Copy", "Reshape", "Tanh", "Sin", "Cos"]);
    assert_eq!(opcodes(&o2), ["Exp", "Copy", "Reshape", "Tanh", "Sin", "Cos"], "the unused negate is gone");
    assert_eq!(opcodes(&o3), ["Exp", "Tanh", "Sin", "Cos"], "the copy and the same-shape reshape are gone");
    assert_eq!(o1.scratchpad_bytes, 7 * 256, "one 256-byte slot per intermediate");
    assert!(o2.scratchpad_bytes < o1.scratchpad_bytes, "{} vs {}", o2.scratchpad_bytes, o1.scratchpad_bytes);
    for p in [&o1, &o2, &o3] {
        p.validate().expect("valid");
        assert_eq!(p.buffers.len(), p.instructions().count() + 1, "one input, one buffer per instruction");
    }
    assert!(o3.instructions().all(|i| !matches!(i.op, Op::Copy)));

    let bench = Bench::new();
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let run = |level| {
        let options = CompileOptions { optlevel: level, ..CompileOptions::exact(Target::Trn1) };
        bench.run_f32(hlo, &options, &[&x])
    };
    // Every level computes the same values, and they are those of the formula (the
    // runtime's `exponential` is a polynomial within 1 ulp, not libm's).
    let o1_values = run(OptLevel::O1);
    for (got, v) in o1_values.iter().zip(&x) {
        let exact = f64::from(*v).exp().tanh().sin().cos();
        assert!((f64::from(*got) - exact).abs() <= 1e-6 * exact.abs(), "{got} vs {exact}");
    }
    for level in [OptLevel::O2, OptLevel::O3] {
        assert_eq!(run(level), o1_values, "{level:?}");
    }
}

/// A causal mask built from iotas (constant, so computed at compile time at level 2)
/// applied to per-head scores whose operands are transposed (read in place at level 2).
const MASKED_SCORES: &str = "HloModule masked\nENTRY e {\n  \
    x = f32[64,4,32]{2,1,0} parameter(0)\n  y = f32[64,4,32]{2,1,0} parameter(1)\n  \
    i0 = s32[64]{0} iota(), iota_dimension=0\n  rows = s32[64,64]{1,0} broadcast(i0), dimensions={0}\n  \
    i1 = s32[64]{0} iota(), iota_dimension=0\n  cols = s32[64,64]{1,0} broadcast(i1), dimensions={1}\n  \
    causal = pred[64,64]{1,0} compare(rows, cols), direction=GE\n  \
    xt = f32[4,64,32]{2,1,0} transpose(x), dimensions={1,0,2}\n  \
    yt = f32[4,64,32]{2,1,0} transpose(y), dimensions={1,0,2}\n  \
    s = f32[4,64,64]{2,1,0} dot(xt, yt), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, \
    rhs_contracting_dims={2}\n  \
    mask = pred[4,64,64]{2,1,0} broadcast(causal), dimensions={1,2}\n  \
    low = f32[] constant(-1000)\n  lows = f32[4,64,64]{2,1,0} broadcast(low), dimensions={}\n  \
    ROOT r = f32[4,64,64]{2,1,0} select(mask, s, lows)\n}\n";

#[test]
fn optlevel_2_computes_constant_values_at_compile_time_and_reads_transposed_operands_in_place() {
    let o1 = compile(MASKED_SCORES, OptLevel::O1);
    let o2 = compile(MASKED_SCORES, OptLevel::O2);
    assert_eq!(
        opcodes(&o1),
        [
            "Iota",
            "Broadcast",
            "Iota",
            "Broadcast",
            "Compare",
            "Transpose",
            "Transpose",
            "MatMul",
            "Broadcast",
            "Broadcast",
            "Select"
        ]
    );
    // The mask is a constant now; broadcasts of constants stay (cheaper than storing them).
    assert_eq!(opcodes(&o2), ["MatMul", "Broadcast", "Broadcast", "Select"]);
    let matmul = o2.instructions().find(|i| matches!(i.op, Op::MatMul(_))).expect("a product");
    assert!(
        matmul.operands.iter().all(|&b| o2.inputs.iter().any(|io| io.buffer == b)),
        "the product reads the parameters, not transposed copies: {matmul:?}"
    );
    let causal = o2.buffers.iter().find(|b| b.ty.to_string() == "pred[64,64]").expect("the folded mask");
    assert!(matches!(causal.kind, neuron_runtime::isa::BufferKind::Constant { .. }), "{causal:?}");
    o2.validate().expect("valid");

    let bench = Bench::new();
    let x = awkward(64 * 4 * 32, 0.5);
    let y = awkward(64 * 4 * 32, 7.25);
    let run = |level| {
        let options = CompileOptions { optlevel: level, ..CompileOptions::exact(Target::Trn1) };
        bench.run_f32(MASKED_SCORES, &options, &[&x, &y])
    };
    let o1_values = run(OptLevel::O1);
    for (at, got) in o1_values.iter().enumerate() {
        let (h, i, j) = (at / 4096, at / 64 % 64, at % 64);
        let expected = if i >= j {
            (0..32).map(|d| f64::from(x[(i * 4 + h) * 32 + d]) * f64::from(y[(j * 4 + h) * 32 + d])).sum()
        } else {
            -1000.0
        };
        assert!((f64::from(*got) - expected).abs() <= 1e-5 * expected.abs().max(1.0), "{at}: {got} vs {expected}");
    }
    assert_eq!(run(OptLevel::O2), o1_values, "level 2 computes the same bits");
}

#[test]
fn values_that_vary_or_fail_are_left_to_the_execution() {
    // `rng` draws anew at each execution, and a gather outside its table must fail there
    // (NRT_EXEC_OOB), so neither is computed at compile time, though both read constants.
    let hlo = "HloModule left\nENTRY e {\n  a = f32[] constant(0)\n  b = f32[] constant(1)\n  \
        r = f32[8]{0} rng(a, b), distribution=rng_uniform\n  \
        table = f32[4,2]{1,0} constant({{1,2},{3,4},{5,6},{7,8}})\n  \
        i = s32[1,1]{1,0} constant({{9}})\n  \
        g = f32[1,2]{1,0} gather(table, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, \
        index_vector_dim=1, slice_sizes={1,2}\n  ROOT t = (f32[8]{0}, f32[1,2]{1,0}) tuple(r, g)\n}\n";
    let o2 = compile(hlo, OptLevel::O2);
    assert_eq!(opcodes(&o2), ["RngUniform", "Gather"]);
}

#[test]
fn the_default_options_are_those_of_trn1() {
    let defaults = CompileOptions::new(Target::Trn1);
    assert_eq!(defaults.auto_cast, AutoCast::MatMult);
    assert_eq!(defaults.auto_cast_type, AutoCastType::Bf16);
    assert!(!defaults.mixed_precision_accumulation && !defaults.saturate_infinity);
    assert_eq!(defaults.optlevel, OptLevel::O2);
    let exact = CompileOptions::exact(Target::Inf2);
    assert_eq!(
        (exact.auto_cast, exact.mixed_precision_accumulation, exact.target),
        (AutoCast::None, true, Target::Inf2)
    );
}
