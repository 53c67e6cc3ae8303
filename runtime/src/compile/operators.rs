//! Which operators `neuron-cc` lowers, on which engine, and the engine operation of
//! every element-wise HLO instruction.

use neuron_datastore::Engine;

use super::attributes::{attr, comparison_direction, comparison_type, small_attr};
use crate::dtype::DType;
use crate::hlo::{self};
use crate::isa::{ActivationFn, BinaryOp, FloatFormat, Op, UnaryOp};

/// Operators `neuron-cc` lowers, in HLO spelling.
pub const SUPPORTED_OPERATORS: &[&str] = &[
    "abs",
    "add",
    "all-gather",
    "all-reduce",
    "all-to-all",
    "and",
    "atan2",
    "batch-norm-grad",
    "batch-norm-inference",
    "batch-norm-training",
    "bitcast-convert",
    "broadcast",
    "call",
    "cbrt",
    "ceil",
    "clamp",
    "compare",
    "concatenate",
    "conditional",
    "convolution",
    "constant",
    "convert",
    "copy",
    "cosine",
    "count-leading-zeros",
    "custom-call",
    "divide",
    "dot",
    "dynamic-slice",
    "dynamic-update-slice",
    "erf",
    "exponential",
    "exponential-minus-one",
    "floor",
    "gather",
    "get-tuple-element",
    "iota",
    "is-finite",
    "log",
    "log-plus-one",
    "logistic",
    "maximum",
    "minimum",
    "multiply",
    "negate",
    "not",
    "opt-barrier",
    "or",
    "pad",
    "parameter",
    "partition-id",
    "popcnt",
    "power",
    "reduce",
    "reduce-precision",
    "reduce-scatter",
    "reduce-window",
    "remainder",
    "reshape",
    "reverse",
    "rng",
    "rng-bit-generator",
    "round-nearest-afz",
    "round-nearest-even",
    "rsqrt",
    "scatter",
    "select",
    "select-and-scatter",
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
    "sign",
    "sort",
    "sine",
    "slice",
    "sqrt",
    "subtract",
    "tan",
    "tanh",
    "topk",
    "transpose",
    "tuple",
    "while",
    "xor",
];

/// Engine each operator runs on, for `neuron-cc` summaries.
pub fn engine_of_operator(opcode: &str) -> Option<Engine> {
    Some(match opcode {
        "dot" | "convolution" => Engine::Pe,
        "exponential"
        | "exponential-minus-one"
        | "log"
        | "log-plus-one"
        | "tanh"
        | "logistic"
        | "rsqrt"
        | "sqrt"
        | "sine"
        | "cosine"
        | "tan"
        | "cbrt"
        | "erf" => Engine::Act,
        "iota"
        | "dynamic-slice"
        | "dynamic-update-slice"
        | "gather"
        | "scatter"
        | "select-and-scatter"
        | "rng"
        | "rng-bit-generator"
        | "topk"
        | "reduce-window"
        | "sort" => Engine::Pool,
        "while" | "conditional" | "partition-id" => Engine::Sp,
        "parameter" | "constant" | "tuple" | "get-tuple-element" | "call" | "opt-barrier" => return None,
        _ => Engine::Dve,
    })
}

/// `custom-call` targets `neuron-cc` lowers: sharding annotations, which on one core
/// leave their operand unchanged.
pub const CUSTOM_CALL_TARGETS: &[&str] =
    &["Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "xla.sdy.FuncResultSharding"];

/// Which JAX function emits a `custom-call` target that XLA:CPU (or GPU) implements
/// with a library, for the refusal message: LAPACK and cuSOLVER factorisations, FFTs
/// and GPU random numbers.
pub(super) fn custom_call_origin(target: &str) -> Option<&'static str> {
    let t = target.to_ascii_lowercase();
    let lapack = |routine: &str| {
        ["lapack_s", "lapack_d", "lapack_c", "lapack_z", "cusolver_", "hipsolver_", "cu_", "hip_"]
            .iter()
            .any(|p| t.starts_with(p) && t.contains(routine))
    };
    Some(if lapack("getrf") {
        "an LU factorisation (jnp.linalg.inv, solve, det, slogdet or jax.scipy.linalg.lu)"
    } else if lapack("potrf") {
        "a Cholesky factorisation (jnp.linalg.cholesky or jax.scipy.linalg.cho_factor)"
    } else if lapack("geqrf") || lapack("orgqr") || lapack("ungqr") || lapack("householder") {
        "a QR factorisation (jnp.linalg.qr, or lstsq and pinv through it)"
    } else if lapack("syevd") || lapack("heevd") || lapack("syevj") {
        "a symmetric eigendecomposition (jnp.linalg.eigh)"
    } else if lapack("geev") {
        "an eigendecomposition (jnp.linalg.eig)"
    } else if lapack("gesdd") || lapack("gesvd") || lapack("gesvdj") {
        "a singular value decomposition (jnp.linalg.svd, pinv, lstsq or matrix_rank)"
    } else if lapack("trsm") || lapack("trsv") {
        "a triangular solve (jax.scipy.linalg.solve_triangular, or jnp.linalg.inv and solve)"
    } else if lapack("gehrd") || lapack("sytrd") || lapack("hetrd") {
        "a Hessenberg or tridiagonal reduction (jax.scipy.linalg.hessenberg or eigh_tridiagonal)"
    } else if t.contains("fft") {
        "a Fourier transform (jnp.fft)"
    } else if t.contains("threefry") || t.contains("philox") {
        "jax.random on a GPU; export the program for the CPU backend"
    } else {
        return None;
    })
}

/// The operation of an element-wise HLO instruction (arithmetic, activations,
/// comparisons, selection, conversion), or `None` for any other opcode.
/// `operand_dtypes` are the element types of its operands.
pub(super) fn elementwise_op(inst: &hlo::Instruction, operand_dtypes: &[DType]) -> Result<Option<Op>, String> {
    Ok(Some(match inst.opcode.as_str() {
        "add" => Op::Binary(BinaryOp::Add),
        "subtract" => Op::Binary(BinaryOp::Subtract),
        "multiply" => Op::Binary(BinaryOp::Multiply),
        "divide" => Op::Binary(BinaryOp::Divide),
        "maximum" => Op::Binary(BinaryOp::Maximum),
        "minimum" => Op::Binary(BinaryOp::Minimum),
        "power" => Op::Binary(BinaryOp::Power),
        "remainder" => Op::Binary(BinaryOp::Remainder),
        "atan2" => Op::Binary(BinaryOp::Atan2),
        "and" => Op::Binary(BinaryOp::And),
        "or" => Op::Binary(BinaryOp::Or),
        "xor" => Op::Binary(BinaryOp::Xor),
        "shift-left" => Op::Binary(BinaryOp::ShiftLeft),
        "shift-right-logical" => Op::Binary(BinaryOp::ShiftRightLogical),
        "shift-right-arithmetic" => Op::Binary(BinaryOp::ShiftRightArithmetic),
        "negate" => Op::Unary(UnaryOp::Negate),
        "abs" => Op::Unary(UnaryOp::Abs),
        "sign" => Op::Unary(UnaryOp::Sign),
        "ceil" => Op::Unary(UnaryOp::Ceil),
        "floor" => Op::Unary(UnaryOp::Floor),
        "round-nearest-even" => Op::Unary(UnaryOp::RoundNearestEven),
        "round-nearest-afz" => Op::Unary(UnaryOp::RoundNearestAfz),
        "not" => Op::Unary(UnaryOp::Not),
        "is-finite" => Op::Unary(UnaryOp::IsFinite),
        "popcnt" => Op::Unary(UnaryOp::PopCount),
        "count-leading-zeros" => Op::Unary(UnaryOp::CountLeadingZeros),
        "tan" => Op::Activation(ActivationFn::Tan),
        "cbrt" => Op::Activation(ActivationFn::Cbrt),
        "erf" => Op::Activation(ActivationFn::Erf),
        "sine" => Op::Activation(ActivationFn::Sine),
        "cosine" => Op::Activation(ActivationFn::Cosine),
        "exponential-minus-one" => Op::Activation(ActivationFn::ExpMinusOne),
        "log-plus-one" => Op::Activation(ActivationFn::LogPlusOne),
        "exponential" => Op::Activation(ActivationFn::Exp),
        "log" => Op::Activation(ActivationFn::Log),
        "tanh" => Op::Activation(ActivationFn::Tanh),
        "logistic" => Op::Activation(ActivationFn::Logistic),
        "rsqrt" => Op::Activation(ActivationFn::Rsqrt),
        "sqrt" => Op::Activation(ActivationFn::Sqrt),
        "reduce-precision" => Op::RoundPrecision {
            format: FloatFormat::Bits {
                exponent: small_attr(inst, "exponent_bits")?,
                mantissa: small_attr(inst, "mantissa_bits")?,
            },
            saturate: false,
        },
        "compare" => {
            let direction = comparison_direction(attr(inst, "direction")?)?;
            let compared = operand_dtypes.first().copied().unwrap_or(DType::F32);
            Op::Compare { direction, total_order: comparison_type(inst, compared)? }
        }
        "select" => Op::Select,
        "convert" => Op::Convert,
        "clamp" => Op::Clamp,
        _ => return Ok(None),
    }))
}
