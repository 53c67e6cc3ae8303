//! The compiler's unit tests: HLO text in, a program (or an error naming the
//! instruction and line) out.

use std::collections::HashMap;

use neuron_datastore::Engine;

use super::operators::SUPPORTED_OPERATORS;
use super::*;
use crate::isa::{CollectiveKind, CollectiveOp, Op, ReduceOp};

/// Compiles without auto-cast and at level 1 (no constant folding), so that each HLO
/// instruction is one engine instruction.
fn compile(text: &str) -> Result<Program, CompileError> {
    compile_hlo_with(text, &CompileOptions { optlevel: OptLevel::O1, ..CompileOptions::exact(Target::Trn1) })
}

#[test]
fn lowers_each_operator_to_its_engine() {
    let p = compile(
        "HloModule m\nENTRY e {\n a = f32[2,3]{1,0} parameter(0)\n b = f32[3,4]{1,0} parameter(1)\n \
         d = f32[2,4]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n \
         t = f32[2,4]{1,0} tanh(d)\n i = s32[2,4]{1,0} iota(), iota_dimension=1\n \
         c = f32[2,4]{1,0} convert(i)\n ROOT s = f32[2,4]{1,0} add(t, c)\n}\n",
    )
    .expect("compiles");
    let counts: HashMap<Engine, usize> = p.instruction_counts().into_iter().collect();
    assert_eq!(counts[&Engine::Pe], 1);
    assert_eq!(counts[&Engine::Act], 1);
    assert_eq!(counts[&Engine::Pool], 1);
    assert_eq!(counts[&Engine::Dve], 2);
    assert_eq!(p.flops_per_execution(), 2 * 2 * 4 * 3 + 8 + 8);
    assert_eq!(p.inputs.len(), 2);
    assert_eq!(p.outputs[0].hlo_name, "s");
}

#[test]
fn xla_style_text_with_percent_names_and_typed_operands_compiles() {
    let p = compile(
        "HloModule m\n\n%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  \
         ROOT %add = f32[] add(f32[] %x, f32[] %y)\n}\n\nENTRY %main (p: f32[2,3]) -> f32[2] {\n  \
         %p = f32[2,3]{1,0} parameter(0)\n  %zero = f32[] constant(0)\n  \
         ROOT %r = f32[2]{0} reduce(f32[2,3]{1,0} %p, f32[] %zero), dimensions={1}, to_apply=%add, \
         metadata={op_type=\"aten::sum\" op_name=\"sum\"}\n}\n",
    )
    .expect("compiles");
    assert_eq!(p.instructions().map(|i| i.op.opcode()).collect::<Vec<_>>(), ["Reduce"]);
    assert_eq!(p.inputs[0].hlo_name, "p");
}

#[test]
fn elided_constants_are_explained() {
    let err = compile("HloModule m\nENTRY e {\n ROOT c = f32[1000]{0} constant({...})\n}\n").expect_err("elided");
    assert!(err.message.contains("large constants printed"), "{err}");
}

/// The message of compiling an entry computation made of `body`.
fn error_of(body: &str) -> String {
    let text = format!("HloModule m\nENTRY e {{\n{body}\n}}\n");
    compile(&text).expect_err("must not compile").message
}

#[test]
fn every_listed_operator_is_recognised_by_the_lowering() {
    // The operator list of the Neuron compiler that neuron-cc stays compatible with.
    let required = "abs add all-gather all-reduce and or xor not atan2 batch-norm-training batch-norm-grad \
        batch-norm-inference bitcast-convert broadcast ceil clamp compare concatenate constant convert cosine sine \
        custom-call divide dot dynamic-slice dynamic-update-slice exponential exponential-minus-one floor \
        round-nearest-even round-nearest-afz gather scatter get-tuple-element iota log log-plus-one logistic \
        maximum minimum multiply negate pad power reduce remainder reshape reverse rng-bit-generator rng rsqrt \
        select select-and-scatter shift-left shift-right-logical shift-right-arithmetic sign slice sqrt subtract \
        tanh transpose tuple call";
    for op in required.split_whitespace() {
        assert!(SUPPORTED_OPERATORS.contains(&op), "`{op}` is missing from SUPPORTED_OPERATORS");
    }
    for op in SUPPORTED_OPERATORS {
        // Malformed on purpose: the lowering must get past the opcode to complain.
        let text = format!("HloModule m\nENTRY e {{\n ROOT r = f32[] {op}()\n}}\n");
        if let Err(e) = compile(&text) {
            assert!(!e.message.contains("is not supported by this compiler"), "{op}: {e}");
        }
    }
}

#[test]
fn comparison_types_must_fit_the_operands() {
    let message = error_of(" a = f32[2] parameter(0)\n ROOT c = pred[2] compare(a, a), direction=LT, type=SIGNED");
    assert!(message.contains("comparison type SIGNED does not fit f32 operands"), "{message}");
    let message = error_of(" a = u8[2] parameter(0)\n ROOT c = pred[2] compare(a, a), direction=LT, type=FLOAT");
    assert!(message.contains("comparison type FLOAT does not fit u8 operands"), "{message}");
    let message = error_of(" a = s8[2] parameter(0)\n ROOT c = pred[2] compare(a, a), direction=LT, type=SIDEWAYS");
    assert!(message.contains("unknown comparison type `SIDEWAYS`"), "{message}");
    for (ty, kind) in
        [("f32", "TOTALORDER"), ("bf16", "FLOAT"), ("s64", "SIGNED"), ("u16", "UNSIGNED"), ("pred", "UNSIGNED")]
    {
        let body = format!(" a = {ty}[2] parameter(0)\n ROOT c = pred[2] compare(a, a), direction=EQ, type={kind}");
        compile(&format!("HloModule m\nENTRY e {{\n{body}\n}}\n")).unwrap_or_else(|e| panic!("{ty} {kind}: {e}"));
    }
}

#[test]
fn random_number_operators_reject_what_they_cannot_generate() {
    let message =
        error_of(" s = u64[2] parameter(0)\n ROOT r = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_mersenne");
    assert!(message.contains("algorithm `rng_mersenne` is not supported"), "{message}");
    let message =
        error_of(" s = u64[3] parameter(0)\n ROOT r = (u64[3], u32[4]) rng-bit-generator(s), algorithm=rng_three_fry");
    assert!(message.contains("must be u64[2]"), "{message}");
    let message = error_of(
        " a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT r = f32[4] rng(a, b), distribution=rng_normal",
    );
    assert!(message.contains("rng distribution `rng_normal` is not supported"), "{message}");
}

#[test]
fn batch_norm_operands_are_checked_against_the_feature_dimension() {
    let message = error_of(
        " x = f32[2,3] parameter(0)\n s = f32[2] parameter(1)\n o = f32[3] parameter(2)\n \
         ROOT b = (f32[2,3], f32[3], f32[3]) batch-norm-training(x, s, o), epsilon=0.001, feature_index=1",
    );
    assert!(message.contains("operand 1 is f32[2]; expected f32[3]"), "{message}");
    let message = error_of(
        " x = s32[2,3] parameter(0)\n s = s32[3] parameter(1)\n o = s32[3] parameter(2)\n \
         ROOT b = (s32[2,3], s32[3], s32[3]) batch-norm-training(x, s, o), epsilon=0.001, feature_index=1",
    );
    assert!(message.contains("needs a floating-point operand"), "{message}");
}

#[test]
fn reducers_may_only_use_element_wise_operations() {
    let text = "HloModule m\nr {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n \
                c = f32[1] reshape(a)\n ROOT d = f32[] add(a, b)\n}\n\
                ENTRY e {\n x = f32[4] parameter(0)\n z = f32[] constant(0)\n \
                ROOT s = f32[] reduce(x, z), dimensions={0}, to_apply=r\n}\n";
    let message = compile(text).expect_err("reshape in a reducer").message;
    assert!(message.contains("reducer `r`"), "{message}");
    assert!(message.contains("`reshape` is not supported in a reducer"), "{message}");
}

#[test]
fn unknown_operator_names_operator_instruction_and_line() {
    let err =
        compile("HloModule m\nENTRY e {\n a = f32[2,2] parameter(0)\n ROOT b = f32[2,2] cholesky(a), lower=true\n}\n")
            .expect_err("cholesky is unsupported");
    assert_eq!(err.line, Some(4));
    assert_eq!(err.instruction.as_deref(), Some("b"));
    assert!(err.message.contains("`cholesky`"), "{err}");
}

#[test]
fn f64_is_refused_at_compile_time_with_a_hint() {
    let err = compile("HloModule m\nENTRY e {\n ROOT a = f64[2] parameter(0)\n}\n").expect_err("f64");
    assert_eq!(err.line, Some(3));
    assert!(err.message.starts_with("element type `f64` is not supported: NeuronCores have no 64-bit"), "{err}");
    assert!(err.message.ends_with("(supported: pred, s8, s16, s32, s64, u8, u16, u32, u64, f16, bf16, f32)"), "{err}");
}

#[test]
fn literals_are_checked_against_their_element_type() {
    let literal = |ty: &str, value: &str| {
        compile(&format!("HloModule m\nENTRY e {{\n ROOT c = {ty}[] constant({value})\n}}\n"))
            .map(|p| p.constants[0].clone())
    };
    assert_eq!(literal("s8", "-128").ok(), Some(vec![0x80]));
    assert_eq!(literal("u64", "18446744073709551615").ok(), Some(vec![0xff; 8]));
    assert_eq!(literal("bf16", "1.5").ok(), Some(half::bf16::from_f32(1.5).to_le_bytes().to_vec()));
    assert_eq!(literal("f16", "-inf").ok(), Some(half::f16::NEG_INFINITY.to_le_bytes().to_vec()));
    let err = literal("u8", "256").expect_err("out of range");
    assert!(err.message.contains("`256` is not a valid u8 value"), "{err}");
    assert!(literal("s16", "-1.5").is_err());
}

#[test]
fn collectives_lower_with_their_replica_groups() {
    let all_reduce = |groups: &str| {
        compile(&format!(
            "HloModule m\nmax {{\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] maximum(a, b)\n}}\n\
             ENTRY e {{\n x = f32[4] parameter(0)\n ROOT y = f32[4] all-reduce(x), replica_groups={groups}, to_apply=max\n}}\n"
        ))
    };
    for (text, groups) in [
        ("{}", vec![]),
        ("{{0}}", vec![vec![0]]),
        ("{{0,1},{2,3}}", vec![vec![0, 1], vec![2, 3]]),
        ("{{0, 2}, {1, 3}}", vec![vec![0, 2], vec![1, 3]]),
        ("[2,2]<=[4]", vec![vec![0, 1], vec![2, 3]]),
    ] {
        let program = all_reduce(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let ops: Vec<Op> = program.instructions().map(|i| i.op.clone()).collect();
        let expected = Op::Collective(CollectiveOp { kind: CollectiveKind::AllReduce(ReduceOp::Maximum), groups });
        assert_eq!(ops, [expected], "{text}");
    }
    for refused in ["{{0,x}}", "[2,2]<=[2,2]T(1,0)", "[2,2]<=[5]", "{0,1}"] {
        let err = all_reduce(refused).expect_err(refused);
        assert!(err.message.contains("is not understood"), "{refused}: {err}");
    }
    let gather = compile(
        "HloModule m\nENTRY e {\n x = f32[2,3] parameter(0)\n \
         ROOT y = f32[2,6] all-gather(x), replica_groups={{0,1}}, dimensions={1}\n}\n",
    )
    .expect("compiles");
    let ops: Vec<Op> = gather.instructions().map(|i| i.op.clone()).collect();
    let expected = CollectiveOp { kind: CollectiveKind::AllGather { dim: 1 }, groups: vec![vec![0, 1]] };
    assert_eq!(ops, [Op::Collective(expected)]);
    let err = compile(
        "HloModule m\nENTRY e {\n x = f32[2,3] parameter(0)\n \
         ROOT y = f32[2,9] all-gather(x), replica_groups={{0,1}}, dimensions={1}\n}\n",
    )
    .expect_err("groups of 2 cannot triple a dimension");
    assert!(err.message.contains("needs groups of 3 ranks"), "{err}");
}

#[test]
fn shapes_too_large_to_address_are_rejected() {
    let err = compile("HloModule m\nENTRY e {\n ROOT a = f32[0,4611686018427387904,4] parameter(0)\n}\n")
        .expect_err("unaddressable");
    assert!(err.message.contains("too large"), "{err}");
}

#[test]
fn exponential_call_expansion_is_refused() {
    let mut text = String::from("HloModule m\nc0 {\n p = f32[] parameter(0)\n ROOT n = f32[] negate(p)\n}\n");
    for level in 1..=30 {
        let prev = level - 1;
        text.push_str(&format!(
            "c{level} {{\n p = f32[] parameter(0)\n a = f32[] call(p), to_apply=c{prev}\n \
             ROOT b = f32[] call(a), to_apply=c{prev}\n}}\n"
        ));
    }
    text.push_str("ENTRY e {\n x = f32[] parameter(0)\n ROOT y = f32[] call(x), to_apply=c30\n}\n");
    let err = compile(&text).expect_err("2^30 instructions");
    assert!(err.message.contains("once calls are inlined"), "{err}");
}

#[test]
fn deeply_nested_tuples_are_refused() {
    let mut text = String::from("HloModule m\nENTRY e {\n t0 = f32[] parameter(0)\n");
    for i in 1..=70 {
        text.push_str(&format!(" t{i} = (f32[]) tuple(t{})\n", i - 1));
    }
    text.push_str(" ROOT r = f32[] parameter(1)\n}\n");
    let err = compile(&text).expect_err("too deep");
    assert!(err.message.contains("nest deeper"), "{err}");
}

#[test]
fn declared_shapes_are_checked() {
    let err = compile("HloModule m\nENTRY e {\n a = f32[2] parameter(0)\n ROOT b = f32[3] negate(a)\n}\n")
        .expect_err("shape mismatch");
    assert!(err.message.contains("f32[2]"), "{err}");
}

#[test]
fn scratchpad_space_is_reused_after_last_use() {
    let p = compile_hlo_with(
        "HloModule m\nENTRY e {\n a = f32[16] parameter(0)\n b = f32[16] negate(a)\n c = f32[16] negate(b)\n \
         d = f32[16] negate(c)\n ROOT e = f32[16] negate(d)\n}\n",
        &CompileOptions::exact(Target::Trn1),
    )
    .expect("compiles");
    // Each step needs its operand and its result live at once: two 64-byte slots.
    assert_eq!(p.scratchpad_bytes, 128);
}

#[test]
fn targets_are_spelled_as_neuron_cc_takes_them() {
    let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["trn1", "trn1n", "inf2", "trn2"]);
    assert_eq!("inf2".parse::<Target>(), Ok(Target::Inf2));
}
