//! The lowered program a NEFF carries: buffers, per-engine instruction streams, DMA
//! queues and constants.
//!
//! The compiler produces a [`Program`], the NEFF codec stores it, and the backend runs
//! it. [`Program::validate`] re-derives every instruction's output type from its
//! operands with the same [`infer_output`] the compiler uses, so a program that passes
//! validation cannot make the backend index out of bounds, whatever file it came from.

mod control;
mod conv;
mod infer;
mod program;
mod results;

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
    /// A matrix product of f32 operands first rounded to `format` (`--auto-cast
    /// matmult`), accumulated in f32: the same result as `RoundPrecision` of each operand
    /// followed by `MatMul`, up to the order of the additions. With bf16 on a CPU that
    /// multiplies bf16 natively, the products run in bf16.
    MatMulRounded {
        dims: DotDims,
        format: FloatFormat,
        saturate: bool,
    },
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
    /// instructions. Elements combine pairwise (a tree), then with the initial value;
    /// a reducer that only picks one of its operands (an arg-max) combines them in
    /// XLA's order instead: the initial value, then each element in turn.
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
    /// XLA `reduce-window`: every window of the `n` arrays (padded with their initial
    /// values) reduced by `region`, starting from the initial values and taking the
    /// window's elements in row-major order, as XLA does. Operands: the `n` arrays,
    /// then their `n` scalar initial values; results: `n` arrays of windows.
    ReduceWindow {
        window: DilatedWindow,
        region: Region,
    },
    /// XLA `convolution` (see [`ConvDims`]). Operands: the input and the kernel. Each
    /// output element is the sum, over its window and over the input features of its
    /// group, of input times kernel; floats multiply and accumulate in f32.
    Convolution(ConvDims),
    /// XLA `sort`: the `n` arrays (operands, of one shape) permuted alike along `dim`
    /// so that `comparator` (parameters `2i` and `2i + 1` are array `i`'s two elements)
    /// holds between each element and the ones after it; elements it finds equal keep
    /// their order. Results: the `n` sorted arrays.
    Sort {
        dim: u32,
        comparator: Region,
    },
    /// XLA `topk` along the last dimension: the `k` largest elements of each row, or
    /// the smallest when `largest` is false, first to last, with their positions
    /// (`s32`). Results: the values, then the positions.
    TopK {
        k: u64,
        largest: bool,
    },
    /// XLA `while` (see [`Loop`]). Operands: the initial state; results: the final state.
    While(Nested<Loop>),
    /// XLA `conditional` (see [`Branches`]). Operands: the selector, then each branch's
    /// inputs; results: the selected branch's outputs.
    Conditional(Nested<Branches>),
    /// XLA `partition-id`: the executing rank's device id (`u32[]`), its global rank in
    /// the communicator it is loaded as (0 for a model of one device). JAX's
    /// `jax.lax.axis_index` in a `shard_map` computes its mesh coordinates from it.
    PartitionId,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
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
    /// `all-reduce`, `all-gather`, `reduce-scatter` or `all-to-all`.
    pub fn name(self) -> &'static str {
        self.into()
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
        self.step_types().map_err(TypeError)
    }

    fn step_types(&self) -> Result<Vec<DType>, String> {
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

/// A window with dilations (`reduce-window`): the array is dilated by
/// `base_dilation` (holes between its elements, filled with the initial value) and the
/// window's elements are `window_dilation` apart, before padding and striding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DilatedWindow {
    pub window: Window,
    pub base_dilation: Vec<u64>,
    pub window_dilation: Vec<u64>,
}

impl DilatedWindow {
    /// How many windows fit along each dimension of an array of `dims` (`None` when a
    /// size, stride or dilation is zero or a length overflows).
    pub fn counts(&self, dims: &[u64]) -> Option<Vec<u64>> {
        let w = &self.window;
        (0..dims.len())
            .map(|d| {
                let (base, dilation) = (self.base_dilation[d], self.window_dilation[d]);
                if w.size[d] == 0 || w.stride[d] == 0 || base == 0 || dilation == 0 {
                    return None;
                }
                let dilated = if dims[d] == 0 { 0 } else { (dims[d] - 1).checked_mul(base)?.checked_add(1)? };
                let padded = dilated.checked_add(w.pad_low[d])?.checked_add(w.pad_high[d])?;
                let extent = (w.size[d] - 1).checked_mul(dilation)?.checked_add(1)?;
                Some(if padded >= extent { (padded - extent) / w.stride[d] + 1 } else { 0 })
            })
            .collect()
    }

    /// The element of dimension `d` (of `len` elements) that window `j` reads at window
    /// position `k`, or `None` where that falls into padding or between the elements of
    /// a dilated array.
    pub fn source(&self, d: usize, j: usize, k: usize, len: usize) -> Option<usize> {
        let w = &self.window;
        let at = (j as u64).checked_mul(w.stride[d])?.checked_add((k as u64).checked_mul(self.window_dilation[d])?)?;
        let dilated = at.checked_sub(w.pad_low[d])?;
        let base = self.base_dilation[d];
        if dilated % base != 0 {
            return None;
        }
        let i = usize::try_from(dilated / base).ok()?;
        (i < len).then_some(i)
    }

    /// The dimension along which this window makes a cumulative reduction of an array
    /// of `in_dims` into one of `out_dims` (as JAX lowers `cumsum`): there, a window as
    /// long as the dimension, padded low by that less one, stride 1; elsewhere, windows
    /// of one element; no dilation, no other padding.
    pub fn running_axis(&self, in_dims: &[u64], out_dims: &[u64]) -> Option<usize> {
        let w = &self.window;
        if in_dims != out_dims {
            return None;
        }
        let mut axis = None;
        for (d, &len) in in_dims.iter().enumerate() {
            if self.base_dilation[d] != 1 || self.window_dilation[d] != 1 || w.stride[d] != 1 || w.pad_high[d] != 0 {
                return None;
            }
            match (w.size[d], w.pad_low[d]) {
                (1, 0) => {}
                (size, pad) if size == len && pad + 1 == len && len > 1 && axis.is_none() => axis = Some(d),
                _ => return None,
            }
        }
        axis
    }
}

/// The dimension numbers of XLA `convolution` (`dim_labels=b01f_01io->b01f`): which
/// dimension of each array is the batch, the feature (input and output feature, for
/// the kernel) and each spatial dimension, in the window's order; the window over the
/// spatial dimensions (`lhs_dilate` is its base dilation, `rhs_dilate` its window
/// dilation); and the feature and batch group counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvDims {
    pub lhs_batch: u32,
    pub lhs_feature: u32,
    pub lhs_spatial: Vec<u32>,
    pub rhs_input: u32,
    pub rhs_output: u32,
    pub rhs_spatial: Vec<u32>,
    pub out_batch: u32,
    pub out_feature: u32,
    pub out_spatial: Vec<u32>,
    pub window: DilatedWindow,
    pub feature_groups: u64,
    pub batch_groups: u64,
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
    Tan,
    /// The real cube root.
    Cbrt,
    /// The error function (exact `gelu`).
    Erf,
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
    /// Whether a float is neither infinite nor NaN (the result is `pred`).
    IsFinite,
    /// The number of bits set in an integer.
    PopCount,
    /// The number of leading zero bits of an integer.
    CountLeadingZeros,
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
            Op::MatMul(_) | Op::MatMulRounded { .. } | Op::Convolution(_) => Engine::Pe,
            Op::Activation(_) => Engine::Act,
            Op::Iota { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Gather(_)
            | Op::Scatter { .. }
            | Op::ReduceRegion { .. }
            | Op::SelectAndScatter { .. }
            | Op::RngBitGenerator { .. }
            | Op::RngUniform
            | Op::TopK { .. }
            | Op::ReduceWindow { .. }
            | Op::Sort { .. } => Engine::Pool,
            // The sync engine drives the collective DMA rings and their semaphores, and
            // sequences loops and branches.
            Op::Collective(_) | Op::While(_) | Op::Conditional(_) | Op::PartitionId => Engine::Sp,
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
            // Named for the products' type, so that profiles show which ran rounded.
            Op::MatMulRounded { format, .. } => match format {
                FloatFormat::Bf16 => "MatMulBf16",
                FloatFormat::Fp16 => "MatMulFp16",
                FloatFormat::Tf32 => "MatMulTf32",
                FloatFormat::Fp8E4m3 => "MatMulFp8",
                FloatFormat::Bits { .. } => "MatMulRounded",
            },
            Op::Convolution(_) => "Convolution",
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
                ActivationFn::Tan => "Tan",
                ActivationFn::Cbrt => "Cbrt",
                ActivationFn::Erf => "Erf",
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
                UnaryOp::IsFinite => "IsFinite",
                UnaryOp::PopCount => "PopCount",
                UnaryOp::CountLeadingZeros => "CountLeadingZeros",
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
            Op::TopK { .. } => "TopK",
            Op::Sort { .. } => "Sort",
            Op::ReduceWindow { .. } => "ReduceWindow",
            Op::While(_) => "While",
            Op::Conditional(_) => "Conditional",
            Op::PartitionId => "PartitionId",
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
            Op::MatMul(d) | Op::MatMulRounded { dims: d, .. } => {
                let k: u64 = operands
                    .first()
                    .map(|lhs| d.lhs_contracting.iter().fold(1u64, |k, &i| k.saturating_mul(lhs.dims[i as usize])))
                    .unwrap_or(0);
                out_elems.saturating_mul(k).saturating_mul(2)
            }
            Op::Convolution(c) => {
                // Each output element multiplies and adds its window over its group's input features.
                let window: u64 = c.window.window.size.iter().product();
                let inputs = operands.get(1).map_or(0, |k| k.dims.get(c.rhs_input as usize).copied().unwrap_or(0));
                out_elems.saturating_mul(window).saturating_mul(inputs).saturating_mul(2)
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
            // A cumulative reduction runs once per element (when its initial value
            // settles under the reducer, as JAX's always do: see the kernel).
            Op::ReduceWindow { window, region } => {
                let cumulative = operands.first().and_then(|a| window.running_axis(&a.dims, &output.dims)).is_some();
                let per_output = if cumulative { 1 } else { window.window.size.iter().product::<u64>() };
                out_elems.saturating_mul(per_output).saturating_mul(region.steps.len() as u64)
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

pub use control::{Branches, Loop, MAX_NESTING, Nested, Selector, nesting_exceeded};
pub use infer::{TypeError, infer_output};
pub use program::InvalidProgram;
pub use results::check_results;

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
            assert_eq!(infer(op, dtype, arity).err().map(|e| e.0).as_deref(), Some(message));
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
    #[test]
    fn a_cumulative_reduce_window_counts_one_reducer_step_per_element() {
        let add = Region {
            params: vec![DType::F32; 2],
            steps: vec![RegionStep {
                op: Op::Binary(BinaryOp::Add),
                operands: vec![RegionValue::Parameter(0), RegionValue::Parameter(1)],
                dtype: DType::F32,
            }],
            results: vec![RegionValue::Step(0)],
        };
        let window = |size: Vec<u64>, pad_low: Vec<u64>| DilatedWindow {
            window: Window { stride: vec![1; 2], pad_high: vec![0; 2], size, pad_low },
            base_dilation: vec![1; 2],
            window_dilation: vec![1; 2],
        };
        let ty = ArrayType::new(DType::F32, vec![64, 1024]);
        // `jnp.cumsum(x, axis=1)`: once per element, not once per element of each window.
        let cumsum = Op::ReduceWindow { window: window(vec![1, 1024], vec![0, 1023]), region: add.clone() };
        assert_eq!(cumsum.flops(&[&ty, &ArrayType::new(DType::F32, vec![])], &ty), 64 * 1024);
        // A sliding window of 4: each of its elements.
        let sliding = Op::ReduceWindow { window: window(vec![1, 4], vec![0, 3]), region: add };
        assert_eq!(sliding.flops(&[&ty], &ty), 64 * 1024 * 4);
    }
}
