//! The lowered program a NEFF carries: buffers, per-engine instruction streams, DMA
//! queues and constants.
//!
//! The compiler produces a [`Program`], the NEFF codec stores it, and the backend runs
//! it. [`Program::validate`] re-derives every instruction's output type from its
//! operands with the same [`infer_output`] the compiler uses, so a program that passes
//! validation cannot make the backend index out of bounds, whatever file it came from.

use serde::{Deserialize, Serialize};

use crate::dtype::{ArrayType, DType};
use neuron_datastore::Engine;
use neuron_datastore::topology::NeuronCoreVersion;

/// A compiled model, ready to encode into a NEFF or to load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub target: NeuronCoreVersion,
    pub buffers: Vec<Buffer>,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
    pub streams: Vec<EngineStream>,
    pub dma_queues: Vec<DmaQueue>,
    /// Constant data, little-endian, one blob per `BufferKind::Constant` buffer.
    pub constants: Vec<Vec<u8>>,
    /// Names of the HLO instructions that instructions came from (`Instruction::hlo`).
    pub hlo_names: Vec<String>,
    /// Bytes of device scratchpad that the intermediate buffers are planned into.
    pub scratchpad_bytes: u64,
}

/// One array the program reads or writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub ty: ArrayType,
    pub kind: BufferKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufferKind {
    /// Filled from input tensor `index` by the input DMA queue at each execution.
    Input { index: u32 },
    /// Filled from constant blob `index` by the weights DMA queue at load.
    Constant { index: u32 },
    /// Written by exactly one instruction, at `offset` in the scratchpad.
    Intermediate { offset: u64 },
}

/// A named model input or output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTensor {
    /// The name tensors are bound by: `input0`, `output1`, ...
    pub name: String,
    /// The HLO parameter (or result instruction) it came from.
    pub hlo_name: String,
    pub buffer: u32,
}

/// The instructions one engine executes, in its own order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStream {
    pub engine: Engine,
    pub instructions: Vec<Instruction>,
}

/// One engine instruction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instruction {
    /// Position in the program's global order; engines synchronise on it.
    pub step: u32,
    pub op: Op,
    pub operands: Vec<u32>,
    pub output: u32,
    /// Index into `Program::hlo_names`.
    pub hlo: u32,
}

/// Engine operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Matrix product with XLA `dot` dimension numbers.
    MatMul(DotDims),
    Activation(ActivationFn),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare {
        direction: CompareDirection,
        total_order: bool,
    },
    /// `select(pred, on_true, on_false)`.
    Select,
    /// Element type conversion to the output buffer's type.
    Convert,
    /// Operand dimension `i` becomes output dimension `dims[i]`.
    Broadcast {
        dims: Vec<u32>,
    },
    /// Same elements in row-major order, new dimensions (the output buffer's).
    Reshape,
    /// Output dimension `i` is operand dimension `perm[i]`.
    Transpose {
        perm: Vec<u32>,
    },
    /// Operands: the array and a scalar initial value.
    Reduce {
        op: ReduceOp,
        dims: Vec<u32>,
    },
    Concatenate {
        dim: u32,
    },
    Slice {
        start: Vec<u64>,
        limit: Vec<u64>,
        stride: Vec<u64>,
    },
    Iota {
        dim: u32,
    },
    Copy,
    /// `clamp(min, x, max)`; `min` and `max` are scalars or shaped like `x`.
    Clamp,
    Reverse {
        dims: Vec<u32>,
    },
    /// Operands: the array and a scalar padding value. Negative edge padding crops.
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<u64>,
    },
    /// Operands: the array, then one integer scalar start index per dimension; starts
    /// are clamped so that the slice fits, as in XLA.
    DynamicSlice {
        sizes: Vec<u64>,
    },
    /// Operands: the array, the update, then one integer scalar start index per
    /// dimension (clamped so that the update fits).
    DynamicUpdateSlice,
    /// Reinterprets the bits of each element as the output's element type (same width).
    BitcastConvert,
    /// XLA `gather`. Operands: the array and the start indices. A start index that
    /// puts a slice outside the array fails the execution with `NRT_EXEC_OOB`.
    Gather(GatherDims),
    /// XLA `scatter` of one array. Operands: the array, the indices and the updates.
    /// An update window outside the array fails the execution with `NRT_EXEC_OOB`.
    Scatter {
        dims: ScatterDims,
        combine: ScatterCombine,
    },
    /// Rounds each element to the nearest value of a narrower float format (ties to
    /// even), keeping the element type: the casts of `--auto-cast`, and HLO
    /// `reduce-precision`. Out-of-range values become infinite (NaN for formats without
    /// infinities), or the largest finite value when `saturate` is set.
    RoundPrecision {
        format: FloatFormat,
        saturate: bool,
    },
    /// A reduction that accumulates in a narrower float format: every partial result
    /// is rounded to `format` (what a reduction over bf16 or fp16 data does without
    /// `--enable-mixed-precision-accumulation`).
    ReduceRounded {
        op: ReduceOp,
        dims: Vec<u32>,
        format: FloatFormat,
        saturate: bool,
    },
    /// XLA `reduce` with a reducer `region` evaluated element-wise: several arrays at
    /// once (an arg-max reduces values and indices together), or one array with a
    /// reducer that is not a plain add, multiply, maximum or minimum. Operands: the `n`
    /// arrays, then their `n` scalar initial values. The instruction produces the
    /// reducer's result number `result`; a reduce of `n` arrays lowers to `n`
    /// instructions. Elements combine pairwise (a tree), then with the initial value.
    ReduceRegion {
        dims: Vec<u32>,
        region: Region,
        result: u32,
    },
    /// XLA `select-and-scatter` (the gradient of max pooling). Operands: the array, the
    /// source (one element per window) and the scalar initial value of the output. In
    /// each window the element `e` is selected over a later candidate `c` while
    /// `compare(e, c)` holds; the source element is combined into the output at the
    /// selected position.
    SelectAndScatter {
        window: Window,
        select: CompareDirection,
        total_order: bool,
        combine: ScatterCombine,
    },
    /// XLA `rng-bit-generator`: random bits from a counter-based generator. Operand: the
    /// state (`u64[2]`, or `u64[3]` for Philox). The instruction produces either the
    /// advanced state or the bits; the HLO instruction lowers to one of each.
    RngBitGenerator {
        algorithm: RngAlgorithm,
        result: RngResult,
        /// The type of the bits (which the new state depends on too).
        bits: ArrayType,
    },
    /// XLA `rng` with the uniform distribution: values in `[a, b)` (integers: `[a, b)`
    /// too). Operands: the scalar bounds `a` and `b`. Each execution draws new values
    /// from a process-wide generator, so runs differ, as they do under XLA.
    RngUniform,
    /// A collective across the ranks the model is loaded on (`all-reduce`,
    /// `all-gather`, `reduce-scatter`, `all-to-all`). Operand: the rank's array.
    Collective(CollectiveOp),
}

/// A collective operation of a program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveOp {
    pub kind: CollectiveKind,
    /// Replica groups: lists of ranks that exchange among themselves; empty means one
    /// group of every rank.
    pub groups: Vec<Vec<u32>>,
}

/// What a collective computes. `dim` is the dimension gathered, scattered or
/// exchanged along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectiveKind {
    /// Every rank gets the element-wise reduction of all ranks' arrays.
    AllReduce(ReduceOp),
    /// Every rank gets the ranks' arrays concatenated along `dim`, in group order.
    AllGather { dim: u32 },
    /// The reduction of all ranks' arrays, split along `dim`: rank `i` of a group
    /// gets part `i`.
    ReduceScatter { op: ReduceOp, dim: u32 },
    /// Each array is split along `dim` into one part per rank; part `j` of rank `i`
    /// becomes part `i` of rank `j`.
    AllToAll { dim: u32 },
}

impl CollectiveKind {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce(_) => "all-reduce",
            CollectiveKind::AllGather { .. } => "all-gather",
            CollectiveKind::ReduceScatter { .. } => "reduce-scatter",
            CollectiveKind::AllToAll { .. } => "all-to-all",
        }
    }
}

/// `{{0,1},{2,3}}`, or `{}` for one group of every rank.
pub fn format_groups(groups: &[Vec<u32>]) -> String {
    let inner: Vec<String> = groups.iter().map(|g| format_group(g)).collect();
    format!("{{{}}}", inner.join(","))
}

/// One replica group: `{0,1}`.
pub fn format_group(group: &[u32]) -> String {
    format!("{{{}}}", group.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
}

/// A reducer computation of `ReduceRegion`: scalar operations over its parameters,
/// applied element-wise to whole arrays. Parameters `0..n` are the accumulated values
/// and `n..2n` the incoming ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub params: Vec<DType>,
    pub steps: Vec<RegionStep>,
    pub results: Vec<RegionValue>,
}

/// One element-wise operation of a [`Region`], producing a scalar of `dtype`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionStep {
    pub op: Op,
    pub operands: Vec<RegionValue>,
    pub dtype: DType,
}

/// A scalar inside a [`Region`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionValue {
    Parameter(u32),
    /// The result of an earlier step.
    Step(u32),
    /// A constant: its little-endian bytes in the low bytes of `bits`.
    Constant {
        dtype: DType,
        bits: u64,
    },
}

impl Region {
    /// The element type of a value, if it refers to something that exists before step `before`.
    fn value_type(&self, value: RegionValue, before: usize) -> Option<DType> {
        match value {
            RegionValue::Parameter(p) => self.params.get(p as usize).copied(),
            RegionValue::Step(s) if (s as usize) < before => Some(self.steps[s as usize].dtype),
            RegionValue::Step(_) => None,
            RegionValue::Constant { dtype, .. } => Some(dtype),
        }
    }

    /// Checks that every step is an element-wise operation on values defined before
    /// it, of the types it produces; returns the types of the results.
    pub fn check(&self) -> Result<Vec<DType>, TypeError> {
        for (i, step) in self.steps.iter().enumerate() {
            let elementwise = matches!(
                step.op,
                Op::Activation(_)
                    | Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Compare { .. }
                    | Op::Select
                    | Op::Convert
                    | Op::Clamp
                    | Op::RoundPrecision { .. }
            );
            if !elementwise {
                return Err(format!("reducer step {i}: {} is not an element-wise operation", step.op.opcode()));
            }
            let types = step
                .operands
                .iter()
                .map(|&v| self.value_type(v, i).map(|d| ArrayType::new(d, vec![])))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("reducer step {i} reads a value that is not defined before it"))?;
            let refs: Vec<&ArrayType> = types.iter().collect();
            let declared = ArrayType::new(step.dtype, vec![]);
            let inferred = infer_output(&step.op, &refs, &declared).map_err(|e| format!("reducer step {i}: {e}"))?;
            if inferred != declared {
                return Err(format!("reducer step {i} produces {inferred} but declares {declared}"));
            }
        }
        self.results
            .iter()
            .map(|&v| self.value_type(v, self.steps.len()).ok_or_else(|| "a reducer result is not defined".to_string()))
            .collect()
    }
}

/// The windows of `select-and-scatter`, per dimension: size, stride and edge padding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub size: Vec<u64>,
    pub stride: Vec<u64>,
    pub pad_low: Vec<u64>,
    pub pad_high: Vec<u64>,
}

impl Window {
    /// How many windows fit along each dimension of an array of `dims`.
    pub fn counts(&self, dims: &[u64]) -> Option<Vec<u64>> {
        (0..dims.len())
            .map(|d| {
                let padded = dims[d].checked_add(self.pad_low[d])?.checked_add(self.pad_high[d])?;
                let (size, stride) = (self.size[d], self.stride[d]);
                (size >= 1 && stride >= 1 && padded >= size).then(|| (padded - size) / stride + 1)
            })
            .collect()
    }
}

/// The counter-based generators of `rng-bit-generator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RngAlgorithm {
    /// Philox-4x32-10 (XLA's `rng_philox`, and `rng_default` on CPU).
    Philox,
    /// Threefry-2x32-20 (XLA's `rng_three_fry`).
    ThreeFry,
}

/// Which output of `rng-bit-generator` an instruction produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RngResult {
    State,
    Bits,
}

/// A floating-point format narrower than f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FloatFormat {
    /// 8 exponent bits, 7 mantissa bits.
    Bf16,
    /// IEEE half precision: 5 exponent bits, 10 mantissa bits.
    Fp16,
    /// 8 exponent bits, 10 mantissa bits.
    Tf32,
    /// OCP FP8 E4M3 (`float8_e4m3fn`): 4 exponent bits, 3 mantissa bits, no infinities,
    /// largest finite value 448.
    Fp8E4m3,
    /// IEEE-style layout with these widths (HLO `reduce-precision`).
    Bits { exponent: u8, mantissa: u8 },
}

impl FloatFormat {
    /// Exponent and explicit mantissa bits.
    pub fn widths(self) -> (u32, u32) {
        match self {
            FloatFormat::Bf16 => (8, 7),
            FloatFormat::Fp16 => (5, 10),
            FloatFormat::Tf32 => (8, 10),
            FloatFormat::Fp8E4m3 => (4, 3),
            FloatFormat::Bits { exponent, mantissa } => (exponent.into(), mantissa.into()),
        }
    }

    pub fn name(self) -> String {
        match self {
            FloatFormat::Bf16 => "bf16".into(),
            FloatFormat::Fp16 => "fp16".into(),
            FloatFormat::Tf32 => "tf32".into(),
            FloatFormat::Fp8E4m3 => "fp8_e4m3".into(),
            FloatFormat::Bits { exponent, mantissa } => format!("e{exponent}m{mantissa}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatherDims {
    pub offset_dims: Vec<u32>,
    pub collapsed_slice_dims: Vec<u32>,
    pub start_index_map: Vec<u32>,
    pub operand_batching_dims: Vec<u32>,
    pub start_indices_batching_dims: Vec<u32>,
    pub index_vector_dim: u32,
    pub slice_sizes: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScatterDims {
    pub update_window_dims: Vec<u32>,
    pub inserted_window_dims: Vec<u32>,
    pub scatter_dims_to_operand_dims: Vec<u32>,
    pub input_batching_dims: Vec<u32>,
    pub scatter_indices_batching_dims: Vec<u32>,
    pub index_vector_dim: u32,
}

/// How a scatter combines an update with the element it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScatterCombine {
    /// The update replaces the element.
    Replace,
    Reduce(ReduceOp),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DotDims {
    pub lhs_batch: Vec<u32>,
    pub lhs_contracting: Vec<u32>,
    pub rhs_batch: Vec<u32>,
    pub rhs_contracting: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActivationFn {
    Exp,
    Log,
    Tanh,
    Logistic,
    Rsqrt,
    Sqrt,
    Sine,
    Cosine,
    /// `exp(x) - 1`, accurate near zero.
    ExpMinusOne,
    /// `ln(1 + x)`, accurate near zero.
    LogPlusOne,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    Negate,
    Abs,
    /// -1, 0 or 1 by sign; zeros (keeping their sign) and NaN map to themselves.
    Sign,
    Ceil,
    Floor,
    /// Rounds half-way cases to the even neighbour.
    RoundNearestEven,
    /// Rounds half-way cases away from zero.
    RoundNearestAfz,
    /// Logical not on `pred`, bitwise not on integers.
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Maximum,
    Minimum,
    Power,
    /// The remainder of truncating division (its sign is the dividend's).
    Remainder,
    /// `atan2(lhs, rhs)`: the angle of the point (rhs, lhs).
    Atan2,
    /// Logical on `pred`, bitwise on integers.
    And,
    Or,
    Xor,
    ShiftLeft,
    ShiftRightLogical,
    ShiftRightArithmetic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Add,
    Multiply,
    Maximum,
    Minimum,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CompareDirection {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The DMA queue types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DmaQueueKind {
    Input,
    Output,
    Weights,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmaQueue {
    pub kind: DmaQueueKind,
    pub transfers: Vec<DmaTransfer>,
}

/// Moves one buffer: input tensor → buffer, buffer → output tensor, or constant → buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmaTransfer {
    pub buffer: u32,
    /// Input index, output index or constant index, by queue kind.
    pub index: u32,
    pub bytes: u64,
}

impl Op {
    /// The engine that executes this operation.
    pub fn engine(&self) -> Engine {
        match self {
            Op::MatMul(_) => Engine::Pe,
            Op::Activation(_) => Engine::Act,
            Op::Iota { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Gather(_)
            | Op::Scatter { .. }
            | Op::ReduceRegion { .. }
            | Op::SelectAndScatter { .. }
            | Op::RngBitGenerator { .. }
            | Op::RngUniform => Engine::Pool,
            // The sync engine drives the collective DMA rings and their semaphores.
            Op::Collective(_) => Engine::Sp,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare { .. }
            | Op::Select
            | Op::Convert
            | Op::Broadcast { .. }
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::Reduce { .. }
            | Op::Concatenate { .. }
            | Op::Slice { .. }
            | Op::Copy
            | Op::Clamp
            | Op::Reverse { .. }
            | Op::Pad { .. }
            | Op::BitcastConvert
            | Op::RoundPrecision { .. }
            | Op::ReduceRounded { .. } => Engine::Dve,
        }
    }

    /// A short opcode name for summaries and traces.
    pub fn opcode(&self) -> &'static str {
        match self {
            Op::MatMul(_) => "MatMul",
            Op::Activation(f) => match f {
                ActivationFn::Exp => "Exp",
                ActivationFn::Log => "Log",
                ActivationFn::Tanh => "Tanh",
                ActivationFn::Logistic => "Logistic",
                ActivationFn::Rsqrt => "Rsqrt",
                ActivationFn::Sqrt => "Sqrt",
                ActivationFn::Sine => "Sin",
                ActivationFn::Cosine => "Cos",
                ActivationFn::ExpMinusOne => "Expm1",
                ActivationFn::LogPlusOne => "Log1p",
            },
            Op::Unary(u) => match u {
                UnaryOp::Negate => "Negate",
                UnaryOp::Abs => "Abs",
                UnaryOp::Sign => "Sign",
                UnaryOp::Ceil => "Ceil",
                UnaryOp::Floor => "Floor",
                UnaryOp::RoundNearestEven => "RoundNearestEven",
                UnaryOp::RoundNearestAfz => "RoundNearestAfz",
                UnaryOp::Not => "Not",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "Add",
                BinaryOp::Subtract => "Subtract",
                BinaryOp::Multiply => "Multiply",
                BinaryOp::Divide => "Divide",
                BinaryOp::Maximum => "Maximum",
                BinaryOp::Minimum => "Minimum",
                BinaryOp::Power => "Power",
                BinaryOp::Remainder => "Remainder",
                BinaryOp::Atan2 => "Atan2",
                BinaryOp::And => "And",
                BinaryOp::Or => "Or",
                BinaryOp::Xor => "Xor",
                BinaryOp::ShiftLeft => "ShiftLeft",
                BinaryOp::ShiftRightLogical => "ShiftRightLogical",
                BinaryOp::ShiftRightArithmetic => "ShiftRightArithmetic",
            },
            Op::Compare { .. } => "Compare",
            Op::Select => "Select",
            Op::Convert => "Convert",
            Op::Broadcast { .. } => "Broadcast",
            Op::Reshape => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Reduce { .. } => "Reduce",
            Op::Concatenate { .. } => "Concatenate",
            Op::Slice { .. } => "Slice",
            Op::Iota { .. } => "Iota",
            Op::Copy => "Copy",
            Op::Clamp => "Clamp",
            Op::Reverse { .. } => "Reverse",
            Op::Pad { .. } => "Pad",
            Op::DynamicSlice { .. } => "DynamicSlice",
            Op::DynamicUpdateSlice => "DynamicUpdateSlice",
            Op::BitcastConvert => "BitcastConvert",
            Op::Gather(_) => "Gather",
            Op::Scatter { .. } => "Scatter",
            Op::RoundPrecision { .. } => "RoundPrecision",
            Op::ReduceRounded { .. } | Op::ReduceRegion { .. } => "Reduce",
            Op::SelectAndScatter { .. } => "SelectAndScatter",
            Op::RngBitGenerator { .. } => "RngBitGenerator",
            Op::RngUniform => "RngUniform",
            Op::Collective(c) => match c.kind {
                CollectiveKind::AllReduce(_) => "AllReduce",
                CollectiveKind::AllGather { .. } => "AllGather",
                CollectiveKind::ReduceScatter { .. } => "ReduceScatter",
                CollectiveKind::AllToAll { .. } => "AllToAll",
            },
        }
    }

    /// Floating-point (or integer) operations the instruction performs.
    pub fn flops(&self, operands: &[&ArrayType], output: &ArrayType) -> u64 {
        let out_elems = output.element_count().unwrap_or(0);
        match self {
            Op::MatMul(d) => {
                let k: u64 = operands
                    .first()
                    .map(|lhs| d.lhs_contracting.iter().fold(1u64, |k, &i| k.saturating_mul(lhs.dims[i as usize])))
                    .unwrap_or(0);
                out_elems.saturating_mul(k).saturating_mul(2)
            }
            Op::Activation(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare { .. }
            | Op::Select
            | Op::Clamp
            | Op::RoundPrecision { .. } => out_elems,
            Op::Scatter { combine: ScatterCombine::Reduce(_), .. } => {
                operands.get(2).and_then(|t| t.element_count()).unwrap_or(0)
            }
            Op::Reduce { .. } | Op::ReduceRounded { .. } => {
                operands.first().and_then(|t| t.element_count()).unwrap_or(0)
            }
            Op::ReduceRegion { region, .. } => {
                operands.first().and_then(|t| t.element_count()).unwrap_or(0).saturating_mul(region.steps.len() as u64)
            }
            Op::SelectAndScatter { window, .. } => operands
                .get(1)
                .and_then(|t| t.element_count())
                .unwrap_or(0)
                .saturating_mul(window.size.iter().product::<u64>().saturating_add(1)),
            _ => 0,
        }
    }
}

/// Why an instruction's operands do not fit its operation.
pub type TypeError = String;

/// Formats must have at least one exponent bit and fit in f32's widths.
fn check_format(format: FloatFormat) -> Result<(), TypeError> {
    let (exponent, mantissa) = format.widths();
    if !(1..=8).contains(&exponent) || mantissa > 23 {
        return Err(format!("float format {} needs 1 to 8 exponent bits and at most 23 mantissa bits", format.name()));
    }
    Ok(())
}

/// Derives (and checks) the output type of `op` applied to `operands`; `declared` is
/// the output buffer's type, which supplies what the operation does not determine
/// (the target of `Convert`, the shape of `Reshape` and `Iota`, ...).
pub fn infer_output(op: &Op, operands: &[&ArrayType], declared: &ArrayType) -> Result<ArrayType, TypeError> {
    let arity = |n: usize| -> Result<(), TypeError> {
        if operands.len() == n {
            Ok(())
        } else {
            Err(format!("{} takes {n} operand(s), got {}", op.opcode(), operands.len()))
        }
    };
    let check_dims = |dims: &[u32], rank: usize, what: &str| -> Result<(), TypeError> {
        let mut seen = vec![false; rank];
        for &d in dims {
            let d = d as usize;
            if d >= rank || std::mem::replace(&mut seen[d], true) {
                return Err(format!("{what} {dims:?} is not a set of distinct dimensions below rank {rank}"));
            }
        }
        Ok(())
    };
    match op {
        Op::MatMul(d) => {
            arity(2)?;
            let (lhs, rhs) = (operands[0], operands[1]);
            if lhs.dtype != rhs.dtype || lhs.dtype == DType::Pred {
                return Err(format!("dot of {lhs} and {rhs}: operands must share a numeric type"));
            }
            // The result may be wider than the operands (JAX's `preferred_element_type`),
            // within the same family: floats to floats, integers to integers.
            let same_family = lhs.dtype.is_float() == declared.dtype.is_float() && declared.dtype != DType::Pred;
            let out_dtype = if same_family { declared.dtype } else { lhs.dtype };
            if d.lhs_batch.len() != d.rhs_batch.len() || d.lhs_contracting.len() != d.rhs_contracting.len() {
                return Err("dot: batch and contracting dimension lists must pair up".into());
            }
            let lhs_all: Vec<u32> = d.lhs_batch.iter().chain(&d.lhs_contracting).copied().collect();
            let rhs_all: Vec<u32> = d.rhs_batch.iter().chain(&d.rhs_contracting).copied().collect();
            check_dims(&lhs_all, lhs.rank(), "dot lhs batch+contracting dims")?;
            check_dims(&rhs_all, rhs.rank(), "dot rhs batch+contracting dims")?;
            for (l, r) in lhs_all.iter().zip(&rhs_all) {
                if lhs.dims[*l as usize] != rhs.dims[*r as usize] {
                    return Err(format!(
                        "dot: lhs dimension {l} ({}) does not match rhs dimension {r} ({})",
                        lhs.dims[*l as usize], rhs.dims[*r as usize]
                    ));
                }
            }
            let mut dims: Vec<u64> = d.lhs_batch.iter().map(|&i| lhs.dims[i as usize]).collect();
            let free = |t: &ArrayType, used: &[u32]| -> Vec<u64> {
                (0..t.rank() as u32).filter(|i| !used.contains(i)).map(|i| t.dims[i as usize]).collect()
            };
            dims.extend(free(lhs, &lhs_all));
            dims.extend(free(rhs, &rhs_all));
            Ok(ArrayType::new(out_dtype, dims))
        }
        Op::Activation(_) => {
            arity(1)?;
            if !operands[0].dtype.is_float() {
                return Err(format!("{} needs a floating-point operand, got {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Unary(u) => {
            arity(1)?;
            let dtype = operands[0].dtype;
            let fits = match u {
                UnaryOp::Negate | UnaryOp::Abs | UnaryOp::Sign => dtype != DType::Pred,
                UnaryOp::Ceil | UnaryOp::Floor | UnaryOp::RoundNearestEven | UnaryOp::RoundNearestAfz => {
                    dtype.is_float()
                }
                UnaryOp::Not => !dtype.is_float(),
            };
            if !fits {
                return Err(format!("{} is not defined on {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Binary(b) => {
            arity(2)?;
            if operands[0] != operands[1] {
                return Err(format!("{} of {} and {}: operand types differ", op.opcode(), operands[0], operands[1]));
            }
            let dtype = operands[0].dtype;
            let fits = match b {
                BinaryOp::Maximum | BinaryOp::Minimum => true,
                BinaryOp::Add
                | BinaryOp::Subtract
                | BinaryOp::Multiply
                | BinaryOp::Divide
                | BinaryOp::Power
                | BinaryOp::Remainder => dtype != DType::Pred,
                BinaryOp::Atan2 => dtype.is_float(),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !dtype.is_float(),
                BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical | BinaryOp::ShiftRightArithmetic => {
                    dtype.is_integer()
                }
            };
            if !fits {
                return Err(format!("{} is not defined on {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Compare { .. } => {
            arity(2)?;
            if operands[0] != operands[1] {
                return Err(format!("compare of {} and {}: operand types differ", operands[0], operands[1]));
            }
            Ok(ArrayType::new(DType::Pred, operands[0].dims.clone()))
        }
        Op::Select => {
            arity(3)?;
            let (pred, a, b) = (operands[0], operands[1], operands[2]);
            if a != b {
                return Err(format!("select branches differ: {a} and {b}"));
            }
            if pred.dtype != DType::Pred || (pred.rank() != 0 && pred.dims != a.dims) {
                return Err(format!("select predicate {pred} must be pred of shape {:?} or a scalar", a.dims));
            }
            Ok(a.clone())
        }
        Op::Convert => {
            arity(1)?;
            Ok(ArrayType::new(declared.dtype, operands[0].dims.clone()))
        }
        Op::Broadcast { dims } => {
            arity(1)?;
            let operand = operands[0];
            if dims.len() != operand.rank() {
                return Err(format!("broadcast dimensions {dims:?} do not match operand rank {}", operand.rank()));
            }
            check_dims(dims, declared.rank(), "broadcast dimensions")?;
            for (i, &d) in dims.iter().enumerate() {
                let (from, to) = (operand.dims[i], declared.dims[d as usize]);
                if from != to && from != 1 {
                    return Err(format!("broadcast: operand dimension {i} ({from}) cannot become {to}"));
                }
            }
            Ok(ArrayType::new(operand.dtype, declared.dims.clone()))
        }
        Op::Reshape => {
            arity(1)?;
            if operands[0].element_count() != declared.element_count() {
                return Err(format!("reshape of {} to {declared} changes the element count", operands[0]));
            }
            Ok(ArrayType::new(operands[0].dtype, declared.dims.clone()))
        }
        Op::Transpose { perm } => {
            arity(1)?;
            let operand = operands[0];
            if perm.len() != operand.rank() {
                return Err(format!("transpose permutation {perm:?} does not match rank {}", operand.rank()));
            }
            check_dims(perm, operand.rank(), "transpose permutation")?;
            Ok(ArrayType::new(operand.dtype, perm.iter().map(|&p| operand.dims[p as usize]).collect()))
        }
        Op::ReduceRounded { op: reduce, dims, format, .. } => {
            check_format(*format)?;
            if !operands.first().is_some_and(|t| t.dtype.is_float()) {
                return Err("a reduction rounded to a narrower float format needs a floating-point operand".into());
            }
            infer_output(&Op::Reduce { op: *reduce, dims: dims.clone() }, operands, declared)
        }
        Op::RoundPrecision { format, .. } => {
            arity(1)?;
            check_format(*format)?;
            if !operands[0].dtype.is_float() {
                return Err(format!("{} needs a floating-point operand, got {}", op.opcode(), operands[0]));
            }
            Ok(operands[0].clone())
        }
        Op::Reduce { op: reduce, dims } => {
            arity(2)?;
            let (operand, init) = (operands[0], operands[1]);
            if init.rank() != 0 || init.dtype != operand.dtype {
                return Err(format!("reduce init value {init} must be a {} scalar", operand.dtype));
            }
            if operand.dtype == DType::Pred && matches!(reduce, ReduceOp::Add | ReduceOp::Multiply) {
                return Err("reduce with add or multiply is not defined on pred".into());
            }
            check_dims(dims, operand.rank(), "reduce dimensions")?;
            Ok(ArrayType::new(
                operand.dtype,
                (0..operand.rank() as u32).filter(|d| !dims.contains(d)).map(|d| operand.dims[d as usize]).collect(),
            ))
        }
        Op::Concatenate { dim } => {
            let first = operands.first().ok_or("concatenate needs at least one operand")?;
            let d = *dim as usize;
            if d >= first.rank() {
                return Err(format!("concatenate dimension {dim} is not below rank {}", first.rank()));
            }
            let mut dims = first.dims.clone();
            dims[d] = 0;
            for t in operands {
                let same_rest = t.rank() == first.rank()
                    && t.dtype == first.dtype
                    && t.dims.iter().zip(&first.dims).enumerate().all(|(i, (a, b))| i == d || a == b);
                if !same_rest {
                    return Err(format!("concatenate operands {first} and {t} differ outside dimension {dim}"));
                }
                dims[d] = dims[d].checked_add(t.dims[d]).ok_or("concatenate size overflows")?;
            }
            Ok(ArrayType::new(first.dtype, dims))
        }
        Op::Slice { start, limit, stride } => {
            arity(1)?;
            let operand = operands[0];
            let rank = operand.rank();
            if start.len() != rank || limit.len() != rank || stride.len() != rank {
                return Err(format!("slice bounds do not match rank {rank}"));
            }
            let mut dims = Vec::with_capacity(rank);
            for i in 0..rank {
                if stride[i] == 0 || stride[i] > i64::MAX as u64 || start[i] > limit[i] || limit[i] > operand.dims[i] {
                    return Err(format!(
                        "slice [{}:{}:{}] is out of bounds for dimension {i} of size {}",
                        start[i], limit[i], stride[i], operand.dims[i]
                    ));
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            Ok(ArrayType::new(operand.dtype, dims))
        }
        Op::Iota { dim } => {
            arity(0)?;
            if *dim as usize >= declared.rank() || declared.dtype == DType::Pred {
                return Err(format!("iota dimension {dim} does not fit {declared}"));
            }
            Ok(declared.clone())
        }
        Op::Copy => {
            arity(1)?;
            Ok(operands[0].clone())
        }
        Op::Clamp => {
            arity(3)?;
            let (lo, x, hi) = (operands[0], operands[1], operands[2]);
            for bound in [lo, hi] {
                if bound.dtype != x.dtype || (bound.rank() != 0 && bound.dims != x.dims) {
                    return Err(format!("clamp bound {bound} must be a {} scalar or shaped like {x}", x.dtype));
                }
            }
            if x.dtype == DType::Pred {
                return Err(format!("Clamp is not defined on {x}"));
            }
            Ok(x.clone())
        }
        Op::Reverse { dims } => {
            arity(1)?;
            check_dims(dims, operands[0].rank(), "reverse dimensions")?;
            Ok(operands[0].clone())
        }
        Op::Pad { low, high, interior } => {
            arity(2)?;
            let (operand, value) = (operands[0], operands[1]);
            if value.rank() != 0 || value.dtype != operand.dtype {
                return Err(format!("pad value {value} must be a {} scalar", operand.dtype));
            }
            let rank = operand.rank();
            if low.len() != rank || high.len() != rank || interior.len() != rank {
                return Err(format!("padding does not match rank {rank}"));
            }
            let mut dims = Vec::with_capacity(rank);
            for i in 0..rank {
                let d = i128::from(operand.dims[i]);
                let stretched = if d == 0 { 0 } else { d + (d - 1) * i128::from(interior[i]) };
                let size = stretched + i128::from(low[i]) + i128::from(high[i]);
                let size = u64::try_from(size)
                    .map_err(|_| format!("padding {}_{} crops dimension {i} below zero", low[i], high[i]))?;
                dims.push(size);
            }
            Ok(ArrayType::new(operand.dtype, dims))
        }
        Op::DynamicSlice { sizes } => {
            let operand = operands.first().ok_or("DynamicSlice needs an operand")?;
            arity(1 + operand.rank())?;
            check_start_indices(&operands[1..])?;
            if sizes.len() != operand.rank() || sizes.iter().zip(&operand.dims).any(|(s, d)| s > d) {
                return Err(format!("dynamic slice sizes {sizes:?} do not fit {operand}"));
            }
            Ok(ArrayType::new(operand.dtype, sizes.clone()))
        }
        Op::DynamicUpdateSlice => {
            let operand = operands.first().ok_or("DynamicUpdateSlice needs an operand")?;
            arity(2 + operand.rank())?;
            let update = operands[1];
            check_start_indices(&operands[2..])?;
            if update.dtype != operand.dtype
                || update.rank() != operand.rank()
                || update.dims.iter().zip(&operand.dims).any(|(u, d)| u > d)
            {
                return Err(format!("update {update} does not fit in {operand}"));
            }
            Ok((*operand).clone())
        }
        Op::BitcastConvert => {
            // Between widths, the narrower side has one more dimension, of the ratio:
            // u32[n,2] <-> u64[n], the low-addressed (least significant) word first.
            arity(1)?;
            let operand = operands[0];
            let (from, to) = (operand.dtype.size_bytes(), declared.dtype.size_bytes());
            if operand.dtype == DType::Pred || declared.dtype == DType::Pred {
                return Err(format!("bitcast-convert of {operand} to {}: pred has no bit layout", declared.dtype));
            }
            let mut dims = operand.dims.clone();
            if from > to {
                dims.push(from / to);
            } else if from < to {
                if dims.last() != Some(&(to / from)) {
                    return Err(format!(
                        "bitcast-convert of {operand} to {}: the last dimension must be {}",
                        declared.dtype,
                        to / from
                    ));
                }
                dims.pop();
            }
            Ok(ArrayType::new(declared.dtype, dims))
        }
        Op::Gather(g) => {
            arity(2)?;
            gather_output(g, operands[0], operands[1])
        }
        Op::Scatter { dims, combine } => {
            arity(3)?;
            let (operand, indices, updates) = (operands[0], operands[1], operands[2]);
            if updates.dtype != operand.dtype {
                return Err(format!("scatter updates {updates} do not match {operand}"));
            }
            if operand.dtype == DType::Pred
                && matches!(combine, ScatterCombine::Reduce(ReduceOp::Add | ReduceOp::Multiply))
            {
                return Err("scatter with add or multiply is not defined on pred".into());
            }
            check_scatter(dims, operand, indices, updates)?;
            Ok((*operand).clone())
        }
        Op::ReduceRegion { dims, region, result } => {
            let n = operands.len() / 2;
            if n == 0 || !operands.len().is_multiple_of(2) {
                return Err(format!(
                    "reduce takes arrays and as many initial values, got {} operand(s)",
                    operands.len()
                ));
            }
            let (arrays, inits) = operands.split_at(n);
            for (array, init) in arrays.iter().zip(inits) {
                if array.dims != arrays[0].dims {
                    return Err(format!("reduce of {} and {}: arrays differ in shape", arrays[0], array));
                }
                if init.rank() != 0 || init.dtype != array.dtype {
                    return Err(format!("reduce init value {init} must be a {} scalar", array.dtype));
                }
            }
            let expected: Vec<DType> = arrays.iter().chain(arrays).map(|t| t.dtype).collect();
            if region.params != expected {
                return Err(format!("reducer parameters {:?} do not match the arrays ({expected:?})", region.params));
            }
            let results = region.check()?;
            if results != expected[..n] {
                return Err(format!("reducer results {results:?} do not match the arrays ({:?})", &expected[..n]));
            }
            let array = arrays.get(*result as usize).ok_or_else(|| format!("reduce has no result {result}"))?;
            check_dims(dims, array.rank(), "reduce dimensions")?;
            Ok(ArrayType::new(
                array.dtype,
                (0..array.rank() as u32).filter(|d| !dims.contains(d)).map(|d| array.dims[d as usize]).collect(),
            ))
        }
        Op::SelectAndScatter { window, combine, .. } => {
            arity(3)?;
            let (operand, source, init) = (operands[0], operands[1], operands[2]);
            if source.dtype != operand.dtype || init.dtype != operand.dtype || init.rank() != 0 {
                return Err(format!(
                    "select-and-scatter of {operand}: source {source} and initial value {init} must share its type"
                ));
            }
            if operand.dtype == DType::Pred
                && matches!(combine, ScatterCombine::Reduce(ReduceOp::Add | ReduceOp::Multiply))
            {
                return Err("select-and-scatter with add or multiply is not defined on pred".into());
            }
            let rank = operand.rank();
            if [&window.size, &window.stride, &window.pad_low, &window.pad_high].iter().any(|v| v.len() != rank) {
                return Err(format!("the window must give a size, stride and padding for each of {rank} dimension(s)"));
            }
            let counts = window.counts(&operand.dims).ok_or_else(|| {
                format!("window sizes {:?} and strides {:?} do not fit {operand}", window.size, window.stride)
            })?;
            if counts != source.dims {
                return Err(format!("source {source} must hold one element per window ({counts:?})"));
            }
            Ok(operand.clone())
        }
        Op::RngBitGenerator { algorithm, result, bits } => {
            arity(1)?;
            let state = operands[0];
            let words = match algorithm {
                RngAlgorithm::Philox => [2, 3].as_slice(),
                RngAlgorithm::ThreeFry => [2].as_slice(),
            };
            if state.dtype != DType::U64 || state.rank() != 1 || !words.contains(&state.dims[0]) {
                return Err(format!(
                    "rng-bit-generator state {state} must be u64[2]{}",
                    match algorithm {
                        RngAlgorithm::Philox => " or u64[3]",
                        RngAlgorithm::ThreeFry => "",
                    }
                ));
            }
            if !bits.dtype.is_integer() {
                return Err(format!("rng-bit-generator produces integers, not {}", bits.dtype));
            }
            match result {
                RngResult::State => Ok(state.clone()),
                RngResult::Bits => Ok(bits.clone()),
            }
        }
        Op::RngUniform => {
            arity(2)?;
            let (a, b) = (operands[0], operands[1]);
            if a.rank() != 0 || b.rank() != 0 || a.dtype != b.dtype || a.dtype != declared.dtype {
                return Err(format!("rng bounds {a} and {b} must be scalars of the result's type {}", declared.dtype));
            }
            if declared.dtype == DType::Pred {
                return Err("rng does not produce pred".into());
            }
            Ok(declared.clone())
        }
        Op::Collective(c) => {
            arity(1)?;
            let x = operands[0];
            let dim = match c.kind {
                CollectiveKind::AllReduce(_) => {
                    if x.dtype == DType::Pred
                        && !matches!(c.kind, CollectiveKind::AllReduce(ReduceOp::Maximum | ReduceOp::Minimum))
                    {
                        return Err(format!("all-reduce of {x} must combine with or (maximum) or and (minimum)"));
                    }
                    return Ok(x.clone());
                }
                CollectiveKind::AllGather { dim }
                | CollectiveKind::ReduceScatter { dim, .. }
                | CollectiveKind::AllToAll { dim } => dim,
            };
            let d = dim as usize;
            if d >= x.rank() || declared.rank() != x.rank() || declared.dtype != x.dtype {
                return Err(format!("{} along dimension {dim} of {x} cannot give {declared}", c.kind.name()));
            }
            let other_dims_agree = (0..x.rank()).all(|i| i == d || x.dims[i] == declared.dims[i]);
            let (small, large) = match c.kind {
                CollectiveKind::AllGather { .. } => (x.dims[d], declared.dims[d]),
                CollectiveKind::ReduceScatter { .. } => (declared.dims[d], x.dims[d]),
                _ => (x.dims[d], declared.dims[d]),
            };
            let fits = small > 0
                && large >= small
                && large % small == 0
                && (!matches!(c.kind, CollectiveKind::AllToAll { .. }) || small == large);
            if !other_dims_agree || !fits {
                return Err(format!("{} along dimension {dim} of {x} cannot give {declared}", c.kind.name()));
            }
            if let Some(group) = c
                .groups
                .iter()
                .find(|g| g.len() as u64 != large / small && !matches!(c.kind, CollectiveKind::AllToAll { .. }))
            {
                return Err(format!(
                    "{} of {x} into {declared} needs groups of {} ranks, but group {} has {}",
                    c.kind.name(),
                    large / small,
                    format_groups(std::slice::from_ref(group)),
                    group.len()
                ));
            }
            Ok(declared.clone())
        }
    }
}

fn check_start_indices(indices: &[&ArrayType]) -> Result<(), TypeError> {
    match indices.iter().find(|t| t.rank() != 0 || !t.dtype.is_integer()) {
        Some(t) => Err(format!("start index {t} must be an integer scalar")),
        None => Ok(()),
    }
}

/// Checks that `dims` are distinct and below `rank`, and that none is in `taken`.
fn disjoint_dims(dims: &[u32], taken: &[bool], what: &str) -> Result<(), TypeError> {
    let mut seen = vec![false; taken.len()];
    for &d in dims {
        let d = d as usize;
        if d >= taken.len() || taken[d] || std::mem::replace(&mut seen[d], true) {
            return Err(format!("{what} {dims:?} are not distinct unused dimensions below rank {}", taken.len()));
        }
    }
    Ok(())
}

fn mark(taken: &mut [bool], dims: &[u32]) {
    for &d in dims {
        taken[d as usize] = true;
    }
}

/// The shape of `indices` without its index vector dimension, and the length of that
/// vector (1 when `index_vector_dim` is the rank: an implicit trailing dimension).
fn index_batch(indices: &ArrayType, index_vector_dim: u32) -> Result<(Vec<u64>, u64), TypeError> {
    let ivd = index_vector_dim as usize;
    if !indices.dtype.is_integer() || ivd > indices.rank() {
        return Err(format!("indices {indices} must be integers with index_vector_dim={ivd} at most their rank"));
    }
    let batch = indices.dims.iter().enumerate().filter(|&(i, _)| i != ivd).map(|(_, &d)| d).collect();
    Ok((batch, indices.dims.get(ivd).copied().unwrap_or(1)))
}

fn gather_output(g: &GatherDims, operand: &ArrayType, indices: &ArrayType) -> Result<ArrayType, TypeError> {
    let rank = operand.rank();
    let (batch, vector) = index_batch(indices, g.index_vector_dim)?;
    if g.slice_sizes.len() != rank || g.slice_sizes.iter().zip(&operand.dims).any(|(s, d)| s > d) {
        return Err(format!("gather slice sizes {:?} do not fit {operand}", g.slice_sizes));
    }
    if g.start_index_map.len() as u64 != vector {
        return Err(format!("gather start_index_map {:?} does not match index vectors of {vector}", g.start_index_map));
    }
    disjoint_dims(&g.start_index_map, &vec![false; rank], "gather start_index_map")?;
    let mut taken = vec![false; rank];
    disjoint_dims(&g.collapsed_slice_dims, &taken, "gather collapsed_slice_dims")?;
    mark(&mut taken, &g.collapsed_slice_dims);
    disjoint_dims(&g.operand_batching_dims, &taken, "gather operand_batching_dims")?;
    mark(&mut taken, &g.operand_batching_dims);
    if taken.iter().enumerate().any(|(d, &t)| t && g.slice_sizes[d] > 1) {
        return Err("gather collapses or batches a dimension whose slice size is not 1".into());
    }
    let mut indices_taken = vec![false; indices.rank()];
    if let Some(t) = indices_taken.get_mut(g.index_vector_dim as usize) {
        *t = true;
    }
    disjoint_dims(&g.start_indices_batching_dims, &indices_taken, "gather start_indices_batching_dims")?;
    if g.start_indices_batching_dims.len() != g.operand_batching_dims.len() {
        return Err("gather batching dimension lists must pair up".into());
    }
    let offsets: Vec<u64> = (0..rank).filter(|&d| !taken[d]).map(|d| g.slice_sizes[d]).collect();
    let out_rank = batch.len() + offsets.len();
    if g.offset_dims.len() != offsets.len() || g.offset_dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "gather offset_dims {:?} must list {} increasing dimensions",
            g.offset_dims,
            offsets.len()
        ));
    }
    disjoint_dims(&g.offset_dims, &vec![false; out_rank], "gather offset_dims")?;
    let (mut offsets, mut batch) = (offsets.into_iter(), batch.into_iter());
    let dims = (0..out_rank as u32)
        .map(|d| if g.offset_dims.contains(&d) { offsets.next() } else { batch.next() })
        .collect::<Option<Vec<u64>>>()
        .ok_or("gather dimensions do not add up")?;
    Ok(ArrayType::new(operand.dtype, dims))
}

fn check_scatter(
    s: &ScatterDims,
    operand: &ArrayType,
    indices: &ArrayType,
    updates: &ArrayType,
) -> Result<(), TypeError> {
    let rank = operand.rank();
    let (batch, vector) = index_batch(indices, s.index_vector_dim)?;
    if s.scatter_dims_to_operand_dims.len() as u64 != vector {
        return Err(format!(
            "scatter_dims_to_operand_dims {:?} does not match index vectors of {vector}",
            s.scatter_dims_to_operand_dims
        ));
    }
    disjoint_dims(&s.scatter_dims_to_operand_dims, &vec![false; rank], "scatter_dims_to_operand_dims")?;
    let mut taken = vec![false; rank];
    disjoint_dims(&s.inserted_window_dims, &taken, "scatter inserted_window_dims")?;
    mark(&mut taken, &s.inserted_window_dims);
    disjoint_dims(&s.input_batching_dims, &taken, "scatter input_batching_dims")?;
    mark(&mut taken, &s.input_batching_dims);
    let mut indices_taken = vec![false; indices.rank()];
    if let Some(t) = indices_taken.get_mut(s.index_vector_dim as usize) {
        *t = true;
    }
    disjoint_dims(&s.scatter_indices_batching_dims, &indices_taken, "scatter_indices_batching_dims")?;
    if s.scatter_indices_batching_dims.len() != s.input_batching_dims.len() {
        return Err("scatter batching dimension lists must pair up".into());
    }
    let window_operand_dims: Vec<usize> = (0..rank).filter(|&d| !taken[d]).collect();
    if s.update_window_dims.len() != window_operand_dims.len() || s.update_window_dims.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(format!(
            "scatter update_window_dims {:?} must list {} increasing dimensions",
            s.update_window_dims,
            window_operand_dims.len()
        ));
    }
    if updates.rank() != batch.len() + window_operand_dims.len() {
        return Err(format!("scatter updates {updates} have the wrong rank"));
    }
    disjoint_dims(&s.update_window_dims, &vec![false; updates.rank()], "scatter update_window_dims")?;
    let mut window = window_operand_dims.iter();
    let mut batch = batch.iter();
    for (d, &size) in updates.dims.iter().enumerate() {
        let fits = if s.update_window_dims.contains(&(d as u32)) {
            window.next().is_some_and(|&o| size <= operand.dims[o])
        } else {
            batch.next() == Some(&size)
        };
        if !fits {
            return Err(format!("scatter updates {updates} do not fit {operand} and indices {indices}"));
        }
    }
    Ok(())
}

impl Program {
    /// Total FLOPs of one execution.
    pub fn flops_per_execution(&self) -> u64 {
        self.instructions()
            .map(|i| {
                let operands: Vec<&ArrayType> = i.operands.iter().map(|&b| &self.buffers[b as usize].ty).collect();
                i.op.flops(&operands, &self.buffers[i.output as usize].ty)
            })
            .fold(0, u64::saturating_add)
    }

    /// Every engine instruction, stream by stream.
    pub fn instructions(&self) -> impl Iterator<Item = &Instruction> {
        self.streams.iter().flat_map(|s| s.instructions.iter())
    }

    /// Instruction count per engine.
    pub fn instruction_counts(&self) -> Vec<(Engine, usize)> {
        Engine::ALL
            .iter()
            .map(|&e| {
                let n = self.streams.iter().filter(|s| s.engine == e).map(|s| s.instructions.len()).sum();
                (e, n)
            })
            .collect()
    }

    pub fn constant_bytes(&self) -> u64 {
        self.constants.iter().map(|c| c.len() as u64).sum()
    }

    /// Checks every structural invariant the backend relies on.
    pub fn validate(&self) -> Result<(), String> {
        let buffer = |id: u32| -> Result<&Buffer, String> {
            self.buffers
                .get(id as usize)
                .ok_or_else(|| format!("buffer {id} does not exist ({} buffers)", self.buffers.len()))
        };
        let mut constant_used = vec![false; self.constants.len()];
        for (id, b) in self.buffers.iter().enumerate() {
            let size =
                b.ty.size_bytes()
                    .filter(|_| b.ty.is_addressable())
                    .ok_or_else(|| format!("buffer {id} ({}) is too large to address", b.ty))?;
            match b.kind {
                BufferKind::Input { index } => {
                    let io = self
                        .inputs
                        .get(index as usize)
                        .ok_or_else(|| format!("buffer {id} names missing input {index}"))?;
                    if io.buffer as usize != id {
                        return Err(format!("input {index} and buffer {id} disagree"));
                    }
                }
                BufferKind::Constant { index } => {
                    let blob = self
                        .constants
                        .get(index as usize)
                        .ok_or_else(|| format!("buffer {id} names missing constant {index}"))?;
                    if std::mem::replace(&mut constant_used[index as usize], true) {
                        return Err(format!("constant {index} is bound to more than one buffer"));
                    }
                    if blob.len() as u64 != size {
                        return Err(format!(
                            "constant {index} holds {} bytes but buffer {id} is {} ({size} bytes)",
                            blob.len(),
                            b.ty
                        ));
                    }
                }
                BufferKind::Intermediate { offset } => {
                    if offset.checked_add(size).is_none_or(|end| end > self.scratchpad_bytes) {
                        return Err(format!("buffer {id} lies outside the {}-byte scratchpad", self.scratchpad_bytes));
                    }
                }
            }
        }
        if let Some(index) = constant_used.iter().position(|used| !used) {
            return Err(format!("constant {index} is not bound to any buffer"));
        }
        for (index, io) in self.inputs.iter().enumerate() {
            if buffer(io.buffer)?.kind != (BufferKind::Input { index: index as u32 }) {
                return Err(format!("input `{}` is not bound to an input buffer", io.name));
            }
        }
        for io in &self.outputs {
            buffer(io.buffer)?;
        }

        let total: usize = self.streams.iter().map(|s| s.instructions.len()).sum();
        let mut by_step: Vec<Option<&Instruction>> = vec![None; total];
        for stream in &self.streams {
            for instruction in &stream.instructions {
                if instruction.op.engine() != stream.engine {
                    return Err(format!(
                        "{} instruction at step {} sits in the {} stream",
                        instruction.op.opcode(),
                        instruction.step,
                        stream.engine
                    ));
                }
                let slot = by_step
                    .get_mut(instruction.step as usize)
                    .ok_or_else(|| format!("step {} is beyond the {total} instructions", instruction.step))?;
                if slot.replace(instruction).is_some() {
                    return Err(format!("step {} is used twice", instruction.step));
                }
            }
        }

        let mut defined: Vec<bool> =
            self.buffers.iter().map(|b| !matches!(b.kind, BufferKind::Intermediate { .. })).collect();
        for (step, instruction) in by_step.iter().enumerate() {
            let instruction = instruction.ok_or_else(|| format!("step {step} is missing"))?;
            if instruction.hlo as usize >= self.hlo_names.len() {
                return Err(format!("step {step} names HLO instruction {} that does not exist", instruction.hlo));
            }
            let mut operands = Vec::with_capacity(instruction.operands.len());
            for &id in &instruction.operands {
                let b = buffer(id)?;
                if !defined[id as usize] {
                    return Err(format!("step {step} reads buffer {id} before it is written"));
                }
                operands.push(&b.ty);
            }
            let out = buffer(instruction.output)?;
            if !matches!(out.kind, BufferKind::Intermediate { .. }) || defined[instruction.output as usize] {
                return Err(format!(
                    "step {step} writes buffer {} that is not a fresh intermediate",
                    instruction.output
                ));
            }
            let inferred =
                infer_output(&instruction.op, &operands, &out.ty).map_err(|e| format!("step {step}: {e}"))?;
            if inferred != out.ty {
                return Err(format!(
                    "step {step}: {} produces {inferred} but its output buffer is {}",
                    instruction.op.opcode(),
                    out.ty
                ));
            }
            defined[instruction.output as usize] = true;
        }
        for io in &self.outputs {
            if !defined[io.buffer as usize] {
                return Err(format!("output `{}` is never written", io.name));
            }
        }
        for queue in &self.dma_queues {
            for t in &queue.transfers {
                let b = buffer(t.buffer)?;
                let matches = match queue.kind {
                    DmaQueueKind::Input => b.kind == BufferKind::Input { index: t.index },
                    DmaQueueKind::Weights => b.kind == BufferKind::Constant { index: t.index },
                    DmaQueueKind::Output => self.outputs.get(t.index as usize).is_some_and(|o| o.buffer == t.buffer),
                };
                if !matches || Some(t.bytes) != b.ty.size_bytes() {
                    return Err(format!(
                        "{:?} DMA transfer of buffer {} does not match the graph",
                        queue.kind, t.buffer
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infer(op: Op, dtype: DType, arity: usize) -> Result<ArrayType, TypeError> {
        let ty = ArrayType::new(dtype, vec![2, 3]);
        infer_output(&op, &vec![&ty; arity], &ty)
    }

    #[test]
    fn element_wise_operators_accept_only_their_element_types() {
        let rejected = [
            (Op::Binary(BinaryOp::Atan2), DType::S32, 2, "Atan2 is not defined on s32[2,3]"),
            (Op::Binary(BinaryOp::ShiftLeft), DType::F32, 2, "ShiftLeft is not defined on f32[2,3]"),
            (Op::Binary(BinaryOp::Xor), DType::F32, 2, "Xor is not defined on f32[2,3]"),
            (Op::Binary(BinaryOp::Power), DType::Pred, 2, "Power is not defined on pred[2,3]"),
            (Op::Unary(UnaryOp::Ceil), DType::S32, 1, "Ceil is not defined on s32[2,3]"),
            (Op::Unary(UnaryOp::Not), DType::F32, 1, "Not is not defined on f32[2,3]"),
            (Op::Unary(UnaryOp::Sign), DType::Pred, 1, "Sign is not defined on pred[2,3]"),
        ];
        for (op, dtype, arity, message) in rejected {
            assert_eq!(infer(op, dtype, arity).err().as_deref(), Some(message));
        }
        let accepted = [
            (Op::Binary(BinaryOp::And), DType::Pred, 2),
            (Op::Binary(BinaryOp::ShiftRightArithmetic), DType::S32, 2),
            (Op::Binary(BinaryOp::Remainder), DType::F32, 2),
            (Op::Unary(UnaryOp::Not), DType::S32, 1),
            (Op::Unary(UnaryOp::RoundNearestEven), DType::F32, 1),
        ];
        for (op, dtype, arity) in accepted {
            let out = infer(op.clone(), dtype, arity).unwrap_or_else(|e| panic!("{op:?} on {dtype}: {e}"));
            assert_eq!(out, ArrayType::new(dtype, vec![2, 3]));
        }
    }
}
