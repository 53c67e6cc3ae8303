//! Lowering of an HLO module to engine instructions (the work of `neuron-cc compile`).
//!
//! Every HLO instruction becomes at most one engine instruction on the engine its
//! operator belongs to (matrix products on `PE`, transcendental functions on `ACT`,
//! arithmetic, compare, select, reduce and layout on `DVE`, iota on `POOL`); parameters,
//! constants and results become DMA transfers. `call`, `tuple` and `get-tuple-element`
//! disappear: calls are inlined and tuples are resolved at compile time. Intermediate
//! buffers are then planned into one scratchpad, reusing space once a buffer is dead.
//!
//! An operator or element type the backend cannot execute is a [`CompileError`] naming
//! the operator, the instruction and the source line; nothing is produced.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::dtype::{ArrayType, DType, DTypeClass};
use crate::hlo::{self, Computation, HloModule, Payload, Shape};
use crate::isa::{
    ActivationFn, BinaryOp, Buffer, BufferKind, CollectiveKind, CollectiveOp, CompareDirection, DmaQueue, DmaQueueKind,
    DmaTransfer, DotDims, EngineStream, FloatFormat, GatherDims, Instruction, IoTensor, Op, Program, ReduceOp, Region,
    RegionStep, RegionValue, RngAlgorithm, RngResult, ScatterCombine, ScatterDims, UnaryOp, Window, infer_output,
};
use crate::simplify;
use neuron_datastore::Engine;
use neuron_datastore::topology::NeuronCoreVersion;

/// Alignment of intermediate buffers in the scratchpad.
pub const SCRATCHPAD_ALIGNMENT: u64 = 64;

/// How deeply `call`s may nest before the module is rejected as recursive.
const MAX_CALL_DEPTH: usize = 64;
/// How deeply tuples may nest.
const MAX_TUPLE_DEPTH: usize = 64;
/// How many HLO instructions a module may expand to once calls are inlined; a few
/// lines that call a computation twice per level would otherwise expand exponentially.
pub const MAX_LOWERED_INSTRUCTIONS: usize = 1_000_000;

/// `neuron-cc --target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Target {
    #[default]
    Trn1,
    Trn1n,
    Inf2,
    Trn2,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::Trn1, Target::Trn1n, Target::Inf2, Target::Trn2];

    pub fn name(self) -> &'static str {
        match self {
            Target::Trn1 => "trn1",
            Target::Trn1n => "trn1n",
            Target::Inf2 => "inf2",
            Target::Trn2 => "trn2",
        }
    }

    pub fn core_version(self) -> NeuronCoreVersion {
        match self {
            Target::Trn2 => NeuronCoreVersion::V3,
            Target::Trn1 | Target::Trn1n | Target::Inf2 => NeuronCoreVersion::V2,
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown target `{s}`; use trn1, trn1n, inf2 or trn2"))
    }
}

/// `neuron-cc --auto-cast`: which f32 operations compute in the `--auto-cast-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCast {
    /// f32 stays f32 everywhere.
    None,
    /// The operands of f32 matrix products are rounded to the auto-cast type; the
    /// product accumulates and returns f32 (the PE array's accumulators are f32).
    #[default]
    MatMult,
    /// Every f32 value is rounded to the auto-cast type: parameters, constants and the
    /// result of every operation that computes new values.
    All,
}

impl FromStr for AutoCast {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(AutoCast::None),
            "matmult" => Ok(AutoCast::MatMult),
            "all" => Ok(AutoCast::All),
            _ => Err(format!("unknown auto-cast mode `{s}`; use none, matmult or all")),
        }
    }
}

/// `neuron-cc --auto-cast-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCastType {
    #[default]
    Bf16,
    Fp16,
    Tf32,
    Fp8E4m3,
}

impl AutoCastType {
    pub fn format(self) -> FloatFormat {
        match self {
            AutoCastType::Bf16 => FloatFormat::Bf16,
            AutoCastType::Fp16 => FloatFormat::Fp16,
            AutoCastType::Tf32 => FloatFormat::Tf32,
            AutoCastType::Fp8E4m3 => FloatFormat::Fp8E4m3,
        }
    }
}

impl FromStr for AutoCastType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(AutoCastType::Bf16),
            "fp16" => Ok(AutoCastType::Fp16),
            "tf32" => Ok(AutoCastType::Tf32),
            "fp8_e4m3" => Ok(AutoCastType::Fp8E4m3),
            _ => Err(format!("unknown auto-cast type `{s}`; use bf16, fp16, tf32 or fp8_e4m3")),
        }
    }
}

/// `neuron-cc --optlevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum OptLevel {
    /// Every HLO instruction as written; each intermediate keeps its own scratchpad space.
    O1,
    /// Also computes at compile time what depends on constants alone (except
    /// broadcasts and iotas, cheaper to run than to store), lets matrix products read
    /// transposed operands in place (when the result's order allows), removes
    /// instructions whose results are never used, and reuses the scratchpad space of
    /// intermediates once they are dead.
    #[default]
    O2,
    /// Also removes copies that change nothing (`copy` and sharding annotations,
    /// reshapes to the same shape, identity transposes), so their readers use the
    /// original buffer.
    O3,
}

impl FromStr for OptLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1" => Ok(OptLevel::O1),
            "2" => Ok(OptLevel::O2),
            "3" => Ok(OptLevel::O3),
            _ => Err(format!("unknown optimisation level `{s}`; use 1, 2 or 3")),
        }
    }
}

/// Everything `neuron-cc compile` can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileOptions {
    pub target: Target,
    pub auto_cast: AutoCast,
    pub auto_cast_type: AutoCastType,
    /// Reductions over bf16 or fp16 values (and, with `--auto-cast all`, over f32
    /// values) accumulate in f32 and round once; otherwise every partial result is
    /// rounded to the narrow type.
    pub mixed_precision_accumulation: bool,
    /// The roundings the compiler inserts turn out-of-range values and infinities into
    /// the largest finite value of the narrow type instead of infinity.
    pub saturate_infinity: bool,
    pub optlevel: OptLevel,
}

impl CompileOptions {
    /// The defaults (as on trn1: matrix-product operands in bf16, fp32 accumulation) for `target`.
    pub fn new(target: Target) -> CompileOptions {
        CompileOptions { target, ..CompileOptions::default() }
    }

    /// Options under which a program computes as XLA:CPU computes it: f32 stays f32
    /// and reductions over narrow floats accumulate in f32.
    pub fn exact(target: Target) -> CompileOptions {
        CompileOptions {
            target,
            auto_cast: AutoCast::None,
            mixed_precision_accumulation: true,
            ..CompileOptions::default()
        }
    }
}

/// A module that cannot be compiled: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CompileError {
    /// 1-based source line, when the error belongs to one.
    pub line: Option<usize>,
    /// The HLO instruction, when the error belongs to one.
    pub instruction: Option<String>,
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.instruction, self.line) {
            (Some(name), Some(line)) => {
                write!(f, "line {line}, instruction `{name}`: {}", self.message)
            }
            (None, Some(line)) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl From<hlo::ParseError> for CompileError {
    fn from(e: hlo::ParseError) -> Self {
        CompileError {
            line: Some(e.line),
            instruction: None,
            message: format!("syntax error at column {}: {}", e.column, e.message),
        }
    }
}

/// Parses and lowers HLO text for `target` with the default options.
pub fn compile_hlo(text: &str, target: Target) -> Result<Program, CompileError> {
    compile_hlo_with(text, &CompileOptions::new(target))
}

/// Parses and lowers HLO text.
pub fn compile_hlo_with(text: &str, options: &CompileOptions) -> Result<Program, CompileError> {
    let module = hlo::parse_module(text)?;
    lower_module(&module, options)
}

/// Lowers a parsed module.
pub fn lower_module(module: &HloModule, options: &CompileOptions) -> Result<Program, CompileError> {
    let mut lowering = Lowering {
        module,
        options: *options,
        buffers: Vec::new(),
        instructions: Vec::new(),
        constants: Vec::new(),
        hlo_names: Vec::new(),
        inputs: Vec::new(),
        visited: 0,
        cast: HashMap::new(),
    };
    let result = lowering.computation(module.entry(), None, 0)?;
    let mut outputs = Vec::new();
    flatten(&result, &mut outputs);
    let outputs: Vec<IoTensor> = outputs
        .into_iter()
        .enumerate()
        .map(|(i, (buffer, hlo_name))| IoTensor { name: format!("output{i}"), hlo_name, buffer })
        .collect();
    lowering.finish(outputs)
}

/// What an HLO instruction evaluates to after lowering.
#[derive(Debug, Clone)]
enum Lowered {
    Buffer { id: u32, hlo_name: String },
    Tuple(Vec<Lowered>),
}

impl Lowered {
    /// How many tuples deep the value is (0 for an array).
    fn depth(&self) -> usize {
        match self {
            Lowered::Buffer { .. } => 0,
            Lowered::Tuple(parts) => 1 + parts.iter().map(Lowered::depth).max().unwrap_or(0),
        }
    }
}

fn flatten(value: &Lowered, out: &mut Vec<(u32, String)>) {
    match value {
        Lowered::Buffer { id, hlo_name } => out.push((*id, hlo_name.clone())),
        Lowered::Tuple(parts) => parts.iter().for_each(|p| flatten(p, out)),
    }
}

struct Lowering<'m> {
    module: &'m HloModule,
    options: CompileOptions,
    buffers: Vec<Buffer>,
    instructions: Vec<Instruction>,
    constants: Vec<Vec<u8>>,
    hlo_names: Vec<String>,
    /// (parameter number, parameter name, buffer).
    inputs: Vec<(u64, String, u32)>,
    /// HLO instructions visited so far, counting each inlined call again.
    visited: usize,
    /// Each f32 buffer already rounded to the auto-cast type, and its rounded copy
    /// (itself, for buffers computed in that type).
    cast: HashMap<u32, u32>,
}

impl<'m> Lowering<'m> {
    fn computation(
        &mut self,
        computation: &Computation,
        args: Option<&[Lowered]>,
        depth: usize,
    ) -> Result<Lowered, CompileError> {
        if depth > MAX_CALL_DEPTH {
            return Err(CompileError {
                line: Some(computation.line),
                instruction: None,
                message: format!(
                    "calls nest deeper than {MAX_CALL_DEPTH} at computation `{}`; recursion is not supported",
                    computation.name
                ),
            });
        }
        let mut env: HashMap<&str, Lowered> = HashMap::new();
        for instruction in &computation.instructions {
            let value = self.instruction(instruction, &env, args, depth).map_err(|message| CompileError {
                line: Some(instruction.line),
                instruction: Some(instruction.name.clone()),
                message,
            })?;
            env.insert(&instruction.name, value);
        }
        let root = &computation.instructions[computation.root];
        env.remove(root.name.as_str()).ok_or_else(|| CompileError {
            line: Some(root.line),
            instruction: Some(root.name.clone()),
            message: "ROOT was not lowered".into(),
        })
    }

    fn instruction(
        &mut self,
        inst: &hlo::Instruction,
        env: &HashMap<&str, Lowered>,
        args: Option<&[Lowered]>,
        depth: usize,
    ) -> Result<Lowered, String> {
        self.visited += 1;
        if self.visited > MAX_LOWERED_INSTRUCTIONS {
            return Err(format!(
                "the module expands to more than {MAX_LOWERED_INSTRUCTIONS} instructions once calls are inlined"
            ));
        }
        let operand = |name: &str| -> Result<&Lowered, String> {
            env.get(strip_percent(name))
                .ok_or_else(|| format!("operand `{name}` is not defined before this instruction"))
        };
        let mut buffer_operands = Vec::with_capacity(inst.operands.len());
        if !matches!(inst.opcode.as_str(), "tuple" | "get-tuple-element" | "call") {
            for name in &inst.operands {
                match operand(name)? {
                    Lowered::Buffer { id, .. } => buffer_operands.push(*id),
                    Lowered::Tuple(_) => {
                        return Err(format!("operand `{name}` is a tuple; `{}` takes arrays", inst.opcode));
                    }
                }
            }
        }
        let auto_cast_all = self.options.auto_cast == AutoCast::All;
        let op = match inst.opcode.as_str() {
            "parameter" => {
                let Some(Payload::ParameterNumber(n)) = inst.payload else {
                    return Err("parameter without a number".into());
                };
                return match args {
                    Some(args) => args
                        .get(n as usize)
                        .cloned()
                        .ok_or_else(|| format!("parameter({n}) but the call passes {} argument(s)", args.len())),
                    None => {
                        let parameter = self.entry_parameter(inst, n)?;
                        self.cast_value_if_all(parameter, &inst.name)
                    }
                };
            }
            "constant" => {
                let constant = self.constant(inst)?;
                return self.cast_value_if_all(constant, &inst.name);
            }
            "tuple" => {
                let parts = inst.operands.iter().map(|n| operand(n).cloned()).collect::<Result<Vec<_>, _>>()?;
                let tuple = Lowered::Tuple(parts);
                if tuple.depth() > MAX_TUPLE_DEPTH {
                    return Err(format!("tuples nest deeper than {MAX_TUPLE_DEPTH} levels"));
                }
                return Ok(tuple);
            }
            "get-tuple-element" => {
                let index: usize =
                    attr(inst, "index")?.parse().map_err(|_| "`index` must be a non-negative integer".to_string())?;
                let [name] = inst.operands.as_slice() else {
                    return Err("get-tuple-element takes one operand".into());
                };
                return match operand(name)? {
                    Lowered::Tuple(parts) => parts
                        .get(index)
                        .cloned()
                        .ok_or_else(|| format!("index {index} is out of range for a {}-tuple", parts.len())),
                    Lowered::Buffer { .. } => Err(format!("operand `{name}` is not a tuple")),
                };
            }
            "call" => {
                let callee_name = strip_percent(attr(inst, "to_apply")?);
                let callee = self
                    .module
                    .computation(callee_name)
                    .ok_or_else(|| format!("calls computation `{callee_name}`, which is not defined"))?;
                let call_args = inst.operands.iter().map(|n| operand(n).cloned()).collect::<Result<Vec<_>, _>>()?;
                return self
                    .computation(callee, Some(&call_args), depth + 1)
                    .map_err(|e| format!("in called computation `{callee_name}`: {e}"));
            }
            "dot" => {
                if self.options.auto_cast != AutoCast::None {
                    for b in &mut buffer_operands {
                        *b = self.auto_cast(*b, &inst.name)?;
                    }
                }
                Op::MatMul(DotDims {
                    lhs_batch: dim_list(inst, "lhs_batch_dims", true)?,
                    lhs_contracting: dim_list(inst, "lhs_contracting_dims", true)?,
                    rhs_batch: dim_list(inst, "rhs_batch_dims", true)?,
                    rhs_contracting: dim_list(inst, "rhs_contracting_dims", true)?,
                })
            }
            "broadcast" => Op::Broadcast { dims: dim_list(inst, "dimensions", false)? },
            "reshape" => Op::Reshape,
            "transpose" => Op::Transpose { perm: dim_list(inst, "dimensions", false)? },
            "copy" => Op::Copy,
            "reduce" => {
                let region = self.region(inst)?;
                let dims = dim_list(inst, "dimensions", false)?;
                match reduction_kind(region) {
                    Ok(op) if inst.operands.len() == 2 => {
                        let dtype = self.buffers[buffer_operands[0] as usize].ty.dtype;
                        self.plain_reduce(op, dims, dtype)
                    }
                    _ => return self.reduce_with_region(inst, region, dims, buffer_operands),
                }
            }
            "select-and-scatter" => {
                let computation = |name: &str| -> Result<&Computation, String> {
                    let name = strip_percent(attr(inst, name)?);
                    self.module.computation(name).ok_or_else(|| format!("computation `{name}` is not defined"))
                };
                let (select, total_order) = select_comparison(computation("select")?)?;
                let rank = self.buffers[buffer_operands[0] as usize].ty.rank();
                Op::SelectAndScatter {
                    window: window_attr(attr(inst, "window")?, rank)?,
                    select,
                    total_order,
                    combine: scatter_combine(computation("scatter")?)?,
                }
            }
            "rng-bit-generator" => return self.rng_bit_generator(inst, buffer_operands),
            "rng" => match attr(inst, "distribution")? {
                "rng_uniform" => Op::RngUniform,
                other => {
                    return Err(format!("rng distribution `{other}` is not supported (supported: rng_uniform)"));
                }
            },
            "batch-norm-inference" | "batch-norm-training" | "batch-norm-grad" => {
                return self.batch_norm(inst, buffer_operands);
            }
            "iota" => Op::Iota {
                dim: attr(inst, "iota_dimension")?
                    .parse()
                    .map_err(|_| "`iota_dimension` must be a non-negative integer".to_string())?,
            },
            "concatenate" => {
                let dims = dim_list(inst, "dimensions", false)?;
                let [dim] = dims.as_slice() else {
                    return Err("concatenate needs exactly one dimension in `dimensions`".into());
                };
                Op::Concatenate { dim: *dim }
            }
            "slice" => slice_op(attr(inst, "slice")?)?,
            "reverse" => Op::Reverse { dims: dim_list(inst, "dimensions", false)? },
            "pad" => pad_op(attr(inst, "padding")?)?,
            "dynamic-slice" => Op::DynamicSlice { sizes: u64_list(inst, "dynamic_slice_sizes")? },
            "dynamic-update-slice" => Op::DynamicUpdateSlice,
            "bitcast-convert" => Op::BitcastConvert,
            "gather" => Op::Gather(GatherDims {
                offset_dims: dim_list(inst, "offset_dims", true)?,
                collapsed_slice_dims: dim_list(inst, "collapsed_slice_dims", true)?,
                start_index_map: dim_list(inst, "start_index_map", true)?,
                operand_batching_dims: dim_list(inst, "operand_batching_dims", true)?,
                start_indices_batching_dims: dim_list(inst, "start_indices_batching_dims", true)?,
                index_vector_dim: index_attr(inst, "index_vector_dim")?,
                slice_sizes: u64_list(inst, "slice_sizes")?,
            }),
            "scatter" => {
                if inst.operands.len() != 3 {
                    return Err(
                        "variadic scatter (several arrays at once) is not supported; scatter one array at a time"
                            .into(),
                    );
                }
                Op::Scatter {
                    dims: ScatterDims {
                        update_window_dims: dim_list(inst, "update_window_dims", true)?,
                        inserted_window_dims: dim_list(inst, "inserted_window_dims", true)?,
                        scatter_dims_to_operand_dims: dim_list(inst, "scatter_dims_to_operand_dims", true)?,
                        input_batching_dims: dim_list(inst, "input_batching_dims", true)?,
                        scatter_indices_batching_dims: dim_list(inst, "scatter_indices_batching_dims", true)?,
                        index_vector_dim: index_attr(inst, "index_vector_dim")?,
                    },
                    combine: scatter_combine(self.region(inst)?)?,
                }
            }
            "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" => {
                if inst.operands.len() != 1 {
                    return Err(format!("`{}` of several arrays at once is not supported", inst.opcode));
                }
                let dim = || -> Result<u32, String> {
                    match dim_list(inst, "dimensions", false)?.as_slice() {
                        &[d] => Ok(d),
                        _ => Err(format!("`{}` needs exactly one dimension in `dimensions`", inst.opcode)),
                    }
                };
                let kind = match inst.opcode.as_str() {
                    "all-reduce" => CollectiveKind::AllReduce(reduction_kind(self.region(inst)?)?),
                    "all-gather" => CollectiveKind::AllGather { dim: dim()? },
                    "reduce-scatter" => {
                        CollectiveKind::ReduceScatter { op: reduction_kind(self.region(inst)?)?, dim: dim()? }
                    }
                    _ => CollectiveKind::AllToAll { dim: dim()? },
                };
                Op::Collective(CollectiveOp { kind, groups: replica_groups(inst)? })
            }
            "custom-call" => {
                let target = attr(inst, "custom_call_target")?.trim_matches('"');
                if !CUSTOM_CALL_TARGETS.contains(&target) || inst.operands.len() != 1 {
                    return Err(format!(
                        "custom-call target `{target}` is not supported (supported, with one operand: {})",
                        CUSTOM_CALL_TARGETS.join(", ")
                    ));
                }
                Op::Copy
            }
            other => {
                let dtypes: Vec<DType> = buffer_operands.iter().map(|&b| self.buffers[b as usize].ty.dtype).collect();
                match elementwise_op(inst, &dtypes)? {
                    Some(op) => op,
                    None => {
                        return Err(format!(
                            "operator `{other}` is not supported by this compiler (supported: {})",
                            SUPPORTED_OPERATORS.join(", ")
                        ));
                    }
                }
            }
        };
        let declared = array_type(&inst.shape)?;
        let operand_types: Vec<&ArrayType> = buffer_operands.iter().map(|&b| &self.buffers[b as usize].ty).collect();
        let inferred = infer_output(&op, &operand_types, &declared)?;
        if inferred != declared {
            return Err(format!("`{}` produces {inferred} but the instruction declares {declared}", inst.opcode));
        }
        // Under `--auto-cast all`, operations that compute new f32 values round them.
        let computes = matches!(
            op,
            Op::MatMul(_) | Op::Activation(_) | Op::Binary(_) | Op::Reduce { .. } | Op::Convert | Op::Iota { .. }
        );
        let rounded_already = matches!(op, Op::ReduceRounded { .. });
        let mut output = self.emit(op, buffer_operands, declared, &inst.name);
        if auto_cast_all && self.buffers[output as usize].ty.dtype == DType::F32 {
            if computes {
                output = self.auto_cast(output, &inst.name)?;
            } else if rounded_already {
                self.cast.insert(output, output);
            }
        }
        Ok(Lowered::Buffer { id: output, hlo_name: inst.name.clone() })
    }

    /// A reduction by a plain `op`, accumulating in a narrower format when the data is
    /// bf16 or f16 (or f32 under `--auto-cast all`) unless mixed-precision accumulation
    /// is on.
    fn plain_reduce(&self, op: ReduceOp, dims: Vec<u32>, dtype: DType) -> Op {
        let narrow = match dtype {
            DType::BF16 => Some(FloatFormat::Bf16),
            DType::F16 => Some(FloatFormat::Fp16),
            DType::F32 if self.options.auto_cast == AutoCast::All => Some(self.options.auto_cast_type.format()),
            _ => None,
        };
        match narrow {
            Some(format) if !self.options.mixed_precision_accumulation => {
                Op::ReduceRounded { op, dims, format, saturate: self.options.saturate_infinity }
            }
            _ => Op::Reduce { op, dims },
        }
    }

    /// Emits `op` after checking its output against `declared`.
    fn emit_checked(&mut self, op: Op, operands: Vec<u32>, declared: ArrayType, hlo_name: &str) -> Result<u32, String> {
        let types: Vec<&ArrayType> = operands.iter().map(|&b| &self.buffers[b as usize].ty).collect();
        let inferred = infer_output(&op, &types, &declared)?;
        if inferred != declared {
            return Err(format!("`{}` produces {inferred} but the instruction declares {declared}", op.opcode()));
        }
        Ok(self.emit(op, operands, declared, hlo_name))
    }

    /// A `reduce` whose reducer is not a plain add, multiply, maximum or minimum of one
    /// array: one `ReduceRegion` instruction per result.
    fn reduce_with_region(
        &mut self,
        inst: &hlo::Instruction,
        region: &Computation,
        dims: Vec<u32>,
        operands: Vec<u32>,
    ) -> Result<Lowered, String> {
        let n = operands.len() / 2;
        if n == 0 || !operands.len().is_multiple_of(2) {
            return Err(format!("reduce takes arrays and as many initial values, got {} operand(s)", operands.len()));
        }
        let arrays: Vec<DType> = operands[..n].iter().map(|&b| self.buffers[b as usize].ty.dtype).collect();
        let params: Vec<DType> = arrays.iter().chain(&arrays).copied().collect();
        let lowered = lower_region(region, &params).map_err(|e| format!("reducer `{}`: {e}", region.name))?;
        let declared = result_types(&inst.shape)?;
        if declared.len() != n {
            return Err(format!("reduce of {n} array(s) declares {} result(s)", declared.len()));
        }
        let mut results = Vec::with_capacity(n);
        for (j, ty) in declared.into_iter().enumerate() {
            let op = Op::ReduceRegion { dims: dims.clone(), region: lowered.clone(), result: j as u32 };
            results.push(self.emit_checked(op, operands.clone(), ty, &inst.name)?);
        }
        Ok(lowered_results(inst, results))
    }

    /// `rng-bit-generator`: one instruction for the new state, one for the bits.
    fn rng_bit_generator(&mut self, inst: &hlo::Instruction, operands: Vec<u32>) -> Result<Lowered, String> {
        let algorithm = match inst.attribute("algorithm").unwrap_or("rng_default") {
            "rng_default" | "rng_philox" => RngAlgorithm::Philox,
            "rng_three_fry" => RngAlgorithm::ThreeFry,
            other => {
                return Err(format!(
                    "rng-bit-generator algorithm `{other}` is not supported (supported: rng_default, rng_philox, rng_three_fry)"
                ));
            }
        };
        let types = result_types(&inst.shape)?;
        let (Shape::Tuple(_), [state_ty, bits_ty]) = (&inst.shape, types.as_slice()) else {
            return Err("rng-bit-generator must return a (state, bits) tuple".into());
        };
        let (state_ty, bits_ty) = (state_ty.clone(), bits_ty.clone());
        let state = self.emit_checked(
            Op::RngBitGenerator { algorithm, result: RngResult::State, bits: bits_ty.clone() },
            operands.clone(),
            state_ty,
            &inst.name,
        )?;
        let bits = self.emit_checked(
            Op::RngBitGenerator { algorithm, result: RngResult::Bits, bits: bits_ty.clone() },
            operands,
            bits_ty,
            &inst.name,
        )?;
        Ok(lowered_results(inst, vec![state, bits]))
    }

    /// The batch-norm operators, expanded into reductions and element-wise arithmetic
    /// as XLA's `BatchNormExpander` does. Every instruction keeps the batch-norm
    /// instruction's name, so profiles attribute the time to it.
    fn batch_norm(&mut self, inst: &hlo::Instruction, operands: Vec<u32>) -> Result<Lowered, String> {
        let expected = if inst.opcode == "batch-norm-training" { 3 } else { 5 };
        if operands.len() != expected {
            return Err(format!("{} takes {expected} operands, got {}", inst.opcode, operands.len()));
        }
        let x_ty = self.buffers[operands[0] as usize].ty.clone();
        if !x_ty.dtype.is_float() {
            return Err(format!("{} needs a floating-point operand, got {x_ty}", inst.opcode));
        }
        let feature: u32 = index_attr(inst, "feature_index")?;
        if feature as usize >= x_ty.rank() {
            return Err(format!("feature_index {feature} is out of range for {x_ty}"));
        }
        let epsilon = match inst.attribute("epsilon") {
            Some(e) => parse_f64(e).ok_or_else(|| format!("`epsilon={e}` is not a number"))?,
            None => 0.0,
        };
        let channels = x_ty.dims[feature as usize];
        let feature_ty = ArrayType::new(x_ty.dtype, vec![channels]);
        for (k, &b) in operands.iter().enumerate().skip(1) {
            let ty = &self.buffers[b as usize].ty;
            let want = if inst.opcode == "batch-norm-grad" && k == 4 { &x_ty } else { &feature_ty };
            if ty != want {
                return Err(format!("{} operand {k} is {ty}; expected {want}", inst.opcode));
            }
        }
        let per_feature = x_ty.element_count().unwrap_or(0) / channels.max(1);
        let other_dims: Vec<u32> = (0..x_ty.rank() as u32).filter(|&d| d != feature).collect();
        let mut bn = Expander { lowering: self, hlo: &inst.name, x_ty: x_ty.clone(), feature_ty, feature };
        let eps = bn.constant_like_feature(epsilon)?;
        let results = match inst.opcode.as_str() {
            "batch-norm-inference" => {
                let [x, scale, offset, mean, var] = operands[..] else { unreachable!("checked above") };
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let true_scale = bn.feature(BinaryOp::Multiply, scale, rsqrt)?;
                let mean_scaled = bn.feature(BinaryOp::Multiply, mean, true_scale)?;
                let true_shift = bn.feature(BinaryOp::Subtract, offset, mean_scaled)?;
                let scale_b = bn.broadcast(true_scale)?;
                let shift_b = bn.broadcast(true_shift)?;
                let scaled = bn.full(BinaryOp::Multiply, x, scale_b)?;
                vec![bn.full(BinaryOp::Add, scaled, shift_b)?]
            }
            "batch-norm-training" => {
                let [x, scale, offset] = operands[..] else { unreachable!("checked above") };
                let count = bn.constant_like_feature(per_feature as f64)?;
                let sum = bn.sum(x, &other_dims)?;
                let squares = bn.full(BinaryOp::Multiply, x, x)?;
                let square_sum = bn.sum(squares, &other_dims)?;
                let mean = bn.feature(BinaryOp::Divide, sum, count)?;
                let square_mean = bn.feature(BinaryOp::Divide, square_sum, count)?;
                let mean_square = bn.feature(BinaryOp::Multiply, mean, mean)?;
                let var = bn.feature(BinaryOp::Subtract, square_mean, mean_square)?;
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let mean_b = bn.broadcast(mean)?;
                let centred = bn.full(BinaryOp::Subtract, x, mean_b)?;
                let rsqrt_b = bn.broadcast(rsqrt)?;
                let normalized = bn.full(BinaryOp::Multiply, centred, rsqrt_b)?;
                let scale_b = bn.broadcast(scale)?;
                let scaled = bn.full(BinaryOp::Multiply, normalized, scale_b)?;
                let offset_b = bn.broadcast(offset)?;
                vec![bn.full(BinaryOp::Add, scaled, offset_b)?, mean, var]
            }
            _ => {
                let [x, scale, mean, var, grad] = operands[..] else { unreachable!("checked above") };
                let var_eps = bn.feature(BinaryOp::Add, var, eps)?;
                let rsqrt = bn.feature_activation(ActivationFn::Rsqrt, var_eps)?;
                let mean_b = bn.broadcast(mean)?;
                let centred = bn.full(BinaryOp::Subtract, x, mean_b)?;
                let grad_centred = bn.full(BinaryOp::Multiply, grad, centred)?;
                let sum_grad_centred = bn.sum(grad_centred, &other_dims)?;
                let grad_offset = bn.sum(grad, &other_dims)?;
                let grad_scale = bn.feature(BinaryOp::Multiply, sum_grad_centred, rsqrt)?;
                // grad_x = scale * rsqrt(var + eps) / N * (N * grad - sum(grad)
                //          - (x - mean) * sum(grad * (x - mean)) / (var + eps))
                let i2 = bn.broadcast(grad_offset)?;
                let i3 = bn.broadcast(sum_grad_centred)?;
                let i4 = bn.full(BinaryOp::Multiply, centred, i3)?;
                let var_eps_b = bn.broadcast(var_eps)?;
                let i5 = bn.full(BinaryOp::Divide, i4, var_eps_b)?;
                let scale_b = bn.broadcast(scale)?;
                let rsqrt_b = bn.broadcast(rsqrt)?;
                let scale_rsqrt = bn.full(BinaryOp::Multiply, scale_b, rsqrt_b)?;
                let inverse_count = bn.constant_like_x(1.0 / per_feature.max(1) as f64)?;
                let scale_rsqrt = bn.full(BinaryOp::Multiply, scale_rsqrt, inverse_count)?;
                let count = bn.constant_like_x(per_feature as f64)?;
                let i1 = bn.full(BinaryOp::Multiply, grad, count)?;
                let i6 = bn.full(BinaryOp::Subtract, i1, i2)?;
                let i6 = bn.full(BinaryOp::Subtract, i6, i5)?;
                vec![bn.full(BinaryOp::Multiply, scale_rsqrt, i6)?, grad_scale, grad_offset]
            }
        };
        let produced: Vec<ArrayType> = results.iter().map(|&id| self.buffers[id as usize].ty.clone()).collect();
        if result_types(&inst.shape)? != produced {
            let produced: Vec<String> = produced.iter().map(ToString::to_string).collect();
            return Err(format!("{} produces ({}) but declares {}", inst.opcode, produced.join(", "), inst.shape));
        }
        Ok(lowered_results(inst, results))
    }

    /// Appends an instruction of HLO instruction `hlo_name`; returns its output buffer.
    fn emit(&mut self, op: Op, operands: Vec<u32>, ty: ArrayType, hlo_name: &str) -> u32 {
        let output = self.new_buffer(ty, BufferKind::Intermediate { offset: 0 });
        let hlo = self.hlo_names.len() as u32;
        self.hlo_names.push(hlo_name.to_string());
        self.instructions.push(Instruction { step: self.instructions.len() as u32, op, operands, output, hlo });
        output
    }

    /// The buffer rounded to the auto-cast type: a constant is rounded here, once; any
    /// other f32 buffer by a `RoundPrecision` instruction of `hlo_name`. Buffers of
    /// other types are returned as they are.
    fn auto_cast(&mut self, buffer: u32, hlo_name: &str) -> Result<u32, String> {
        if self.buffers[buffer as usize].ty.dtype != DType::F32 {
            return Ok(buffer);
        }
        if let Some(&rounded) = self.cast.get(&buffer) {
            return Ok(rounded);
        }
        let (format, saturate) = (self.options.auto_cast_type.format(), self.options.saturate_infinity);
        let ty = self.buffers[buffer as usize].ty.clone();
        let rounded = match self.buffers[buffer as usize].kind {
            BufferKind::Constant { index } => {
                let blob: Vec<u8> = self.constants[index as usize]
                    .chunks_exact(4)
                    .flat_map(|word| {
                        let x = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                        crate::backend::round_to_format(x, format, saturate).to_le_bytes()
                    })
                    .collect();
                let index = self.constants.len() as u32;
                self.constants.push(blob);
                self.new_buffer(ty, BufferKind::Constant { index })
            }
            _ => self.emit(Op::RoundPrecision { format, saturate }, vec![buffer], ty, hlo_name),
        };
        self.cast.insert(buffer, rounded);
        self.cast.insert(rounded, rounded);
        Ok(rounded)
    }

    /// Under `--auto-cast all`, an f32 parameter or constant rounded to the auto-cast type.
    fn cast_value_if_all(&mut self, value: Lowered, hlo_name: &str) -> Result<Lowered, String> {
        match value {
            Lowered::Buffer { id, hlo_name: name } if self.options.auto_cast == AutoCast::All => {
                Ok(Lowered::Buffer { id: self.auto_cast(id, hlo_name)?, hlo_name: name })
            }
            other => Ok(other),
        }
    }

    /// The computation an instruction's `to_apply` names.
    fn region(&self, inst: &hlo::Instruction) -> Result<&'m Computation, String> {
        let name = strip_percent(attr(inst, "to_apply")?);
        self.module.computation(name).ok_or_else(|| format!("computation `{name}` is not defined"))
    }

    fn new_buffer(&mut self, ty: ArrayType, kind: BufferKind) -> u32 {
        self.buffers.push(Buffer { ty, kind });
        (self.buffers.len() - 1) as u32
    }

    fn entry_parameter(&mut self, inst: &hlo::Instruction, number: u64) -> Result<Lowered, String> {
        if self.inputs.iter().any(|(n, _, _)| *n == number) {
            return Err(format!("parameter number {number} is used twice"));
        }
        let ty = array_type(&inst.shape)?;
        // The buffer's input index is fixed once every parameter is known (`finish`).
        let id = self.new_buffer(ty, BufferKind::Input { index: 0 });
        self.inputs.push((number, inst.name.clone(), id));
        Ok(Lowered::Buffer { id, hlo_name: inst.name.clone() })
    }

    fn constant(&mut self, inst: &hlo::Instruction) -> Result<Lowered, String> {
        let ty = array_type(&inst.shape)?;
        let Some(Payload::Literal(tokens)) = &inst.payload else {
            return Err("constant without a literal".into());
        };
        let count = ty.element_count().ok_or("constant is too large")?;
        if tokens.len() as u64 != count {
            return Err(format!("literal has {} value(s) but {ty} holds {count}", tokens.len()));
        }
        let mut bytes = Vec::with_capacity(tokens.len() * ty.dtype.size_bytes() as usize);
        for token in tokens {
            let element = literal_element(ty.dtype, token)
                .ok_or_else(|| format!("`{token}` is not a valid {} value", ty.dtype))?;
            bytes.extend(element);
        }
        let index = self.constants.len() as u32;
        self.constants.push(bytes);
        let id = self.new_buffer(ty, BufferKind::Constant { index });
        Ok(Lowered::Buffer { id, hlo_name: inst.name.clone() })
    }

    fn finish(mut self, mut outputs: Vec<IoTensor>) -> Result<Program, CompileError> {
        let target = self.options.target;
        let whole_module = |message: String| CompileError { line: None, instruction: None, message };
        self.inputs.sort_by_key(|(n, _, _)| *n);
        for (expected, (n, name, _)) in self.inputs.iter().enumerate() {
            if *n != expected as u64 {
                return Err(whole_module(format!(
                    "entry parameters must be numbered 0 to {}; `{name}` is parameter({n})",
                    self.inputs.len() - 1
                )));
            }
        }
        let mut inputs: Vec<IoTensor> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (_, name, buffer))| IoTensor {
                name: format!("input{i}"),
                hlo_name: name.clone(),
                buffer: *buffer,
            })
            .collect();
        for (i, io) in inputs.iter().enumerate() {
            self.buffers[io.buffer as usize].kind = BufferKind::Input { index: i as u32 };
        }

        if self.options.optlevel >= OptLevel::O2 {
            simplify::fold_constants(&mut self.buffers, &mut self.constants, &mut self.instructions, &outputs);
            simplify::fold_transposes(&mut self.instructions);
        }
        if self.options.optlevel >= OptLevel::O3 {
            forward_copies(&self.buffers, &mut self.instructions, &mut outputs);
        }
        if self.options.optlevel >= OptLevel::O2 {
            remove_dead_instructions(&mut self.instructions, &outputs);
        }
        compact_buffers(&mut self.buffers, &mut self.constants, &mut self.instructions, &mut outputs, &mut inputs);
        let reuse = self.options.optlevel >= OptLevel::O2;
        let scratchpad_bytes =
            plan_scratchpad(&mut self.buffers, &self.instructions, &outputs, reuse).map_err(whole_module)?;

        let mut streams: Vec<EngineStream> = Vec::new();
        for instruction in self.instructions {
            let engine = instruction.op.engine();
            match streams.iter_mut().find(|s| s.engine == engine) {
                Some(stream) => stream.instructions.push(instruction),
                None => streams.push(EngineStream { engine, instructions: vec![instruction] }),
            }
        }
        streams.sort_by_key(|s| s.engine);

        let transfer = |buffer: u32, index: usize| DmaTransfer {
            buffer,
            index: index as u32,
            bytes: self.buffers[buffer as usize].ty.size_bytes().unwrap_or(0),
        };
        let constant_buffers = self.buffers.iter().enumerate().filter_map(|(id, b)| match b.kind {
            BufferKind::Constant { index } => Some((id as u32, index as usize)),
            _ => None,
        });
        let dma_queues = vec![
            DmaQueue {
                kind: DmaQueueKind::Input,
                transfers: inputs.iter().enumerate().map(|(i, io)| transfer(io.buffer, i)).collect(),
            },
            DmaQueue {
                kind: DmaQueueKind::Weights,
                transfers: constant_buffers.map(|(id, index)| transfer(id, index)).collect(),
            },
            DmaQueue {
                kind: DmaQueueKind::Output,
                transfers: outputs.iter().enumerate().map(|(i, io)| transfer(io.buffer, i)).collect(),
            },
        ];

        let program = Program {
            target: target.core_version(),
            buffers: self.buffers,
            inputs,
            outputs,
            streams,
            dma_queues,
            constants: self.constants,
            hlo_names: self.hlo_names,
            scratchpad_bytes,
        };
        program
            .validate()
            .map_err(|e| whole_module(format!("internal error: lowered program is inconsistent: {e}")))?;
        Ok(program)
    }
}

/// Places intermediates in one scratchpad: first fit, reusing a buffer's space after
/// its last reader. Program outputs stay live to the end. Returns the scratchpad size.
fn plan_scratchpad(
    buffers: &mut [Buffer],
    instructions: &[Instruction],
    outputs: &[IoTensor],
    reuse: bool,
) -> Result<u64, String> {
    let too_large =
        || "the intermediates of this module need more scratchpad than 64-bit offsets can address".to_string();
    let end = instructions.len();
    let mut last_use = vec![0usize; buffers.len()];
    for (step, instruction) in instructions.iter().enumerate() {
        for &b in &instruction.operands {
            last_use[b as usize] = step;
        }
    }
    for io in outputs {
        last_use[io.buffer as usize] = end;
    }
    if !reuse {
        last_use.iter_mut().for_each(|last| *last = end);
    }
    // Live allocations: (offset, size, last use).
    let mut live: Vec<(u64, u64, usize)> = Vec::new();
    let mut high_water = 0u64;
    for (step, instruction) in instructions.iter().enumerate() {
        live.retain(|&(_, _, last)| last >= step);
        let out = instruction.output as usize;
        let size = buffers[out]
            .ty
            .size_bytes()
            .and_then(|s| s.checked_next_multiple_of(SCRATCHPAD_ALIGNMENT))
            .ok_or_else(too_large)?;
        live.sort_unstable_by_key(|&(offset, _, _)| offset);
        let mut offset = 0u64;
        for &(o, s, _) in &live {
            if offset.checked_add(size).is_some_and(|end| o >= end) {
                break;
            }
            offset = offset.max(o.checked_add(s).ok_or_else(too_large)?);
        }
        let end = offset.checked_add(size).ok_or_else(too_large)?;
        live.push((offset, size, last_use[out].max(step)));
        high_water = high_water.max(end);
        buffers[out].kind = BufferKind::Intermediate { offset };
    }
    Ok(high_water)
}

/// Instructions that leave their operand unchanged (`--optlevel 3` removes them):
/// copies, reshapes to the same shape, identity transposes.
fn is_identity(op: &Op, operand: &Buffer, output: &Buffer) -> bool {
    match op {
        Op::Copy | Op::Reshape => operand.ty == output.ty,
        Op::Transpose { perm } => perm.iter().enumerate().all(|(i, &p)| i as u32 == p),
        _ => false,
    }
}

/// Removes identity instructions whose operand is an intermediate: later readers and
/// the outputs use the operand's buffer instead.
fn forward_copies(buffers: &[Buffer], instructions: &mut Vec<Instruction>, outputs: &mut [IoTensor]) {
    let mut replaced: HashMap<u32, u32> = HashMap::new();
    instructions.retain_mut(|instruction| {
        for b in &mut instruction.operands {
            if let Some(&to) = replaced.get(b) {
                *b = to;
            }
        }
        let [operand] = instruction.operands[..] else { return true };
        let forward = matches!(buffers[operand as usize].kind, BufferKind::Intermediate { .. })
            && is_identity(&instruction.op, &buffers[operand as usize], &buffers[instruction.output as usize]);
        if forward {
            replaced.insert(instruction.output, operand);
        }
        !forward
    });
    for io in outputs {
        if let Some(&to) = replaced.get(&io.buffer) {
            io.buffer = to;
        }
    }
}

/// Removes instructions whose results nothing reads (transitively) and no output returns.
fn remove_dead_instructions(instructions: &mut Vec<Instruction>, outputs: &[IoTensor]) {
    let mut live: std::collections::HashSet<u32> = outputs.iter().map(|io| io.buffer).collect();
    let mut keep = vec![false; instructions.len()];
    for (i, instruction) in instructions.iter().enumerate().rev() {
        if live.contains(&instruction.output) {
            keep[i] = true;
            live.extend(&instruction.operands);
        }
    }
    let mut index = 0;
    instructions.retain(|_| {
        index += 1;
        keep[index - 1]
    });
}

/// Drops the intermediates no instruction writes any more and the constants nothing
/// reads (a weight replaced by its auto-cast copy), and renumbers buffers, constants
/// and the instructions' steps.
fn compact_buffers(
    buffers: &mut Vec<Buffer>,
    constants: &mut Vec<Vec<u8>>,
    instructions: &mut [Instruction],
    outputs: &mut [IoTensor],
    inputs: &mut [IoTensor],
) {
    let mut used = vec![false; buffers.len()];
    for instruction in instructions.iter() {
        used[instruction.output as usize] = true;
        instruction.operands.iter().for_each(|&b| used[b as usize] = true);
    }
    outputs.iter().for_each(|io| used[io.buffer as usize] = true);
    let mut renumbered = vec![u32::MAX; buffers.len()];
    let mut kept = Vec::with_capacity(buffers.len());
    let mut kept_constants = Vec::with_capacity(constants.len());
    for (id, mut buffer) in buffers.drain(..).enumerate() {
        let keep = match &mut buffer.kind {
            BufferKind::Input { .. } => true,
            BufferKind::Intermediate { .. } => used[id],
            BufferKind::Constant { index } if used[id] => {
                kept_constants.push(std::mem::take(&mut constants[*index as usize]));
                *index = kept_constants.len() as u32 - 1;
                true
            }
            BufferKind::Constant { .. } => false,
        };
        if keep {
            renumbered[id] = kept.len() as u32;
            kept.push(buffer);
        }
    }
    *buffers = kept;
    *constants = kept_constants;
    for (step, instruction) in instructions.iter_mut().enumerate() {
        instruction.step = step as u32;
        instruction.output = renumbered[instruction.output as usize];
        instruction.operands.iter_mut().for_each(|b| *b = renumbered[*b as usize]);
    }
    for io in outputs.iter_mut().chain(inputs.iter_mut()) {
        io.buffer = renumbered[io.buffer as usize];
    }
}

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
    "ceil",
    "clamp",
    "compare",
    "concatenate",
    "constant",
    "convert",
    "copy",
    "cosine",
    "custom-call",
    "divide",
    "dot",
    "dynamic-slice",
    "dynamic-update-slice",
    "exponential",
    "exponential-minus-one",
    "floor",
    "gather",
    "get-tuple-element",
    "iota",
    "log",
    "log-plus-one",
    "logistic",
    "maximum",
    "minimum",
    "multiply",
    "negate",
    "not",
    "or",
    "pad",
    "parameter",
    "power",
    "reduce",
    "reduce-precision",
    "reduce-scatter",
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
    "sine",
    "slice",
    "sqrt",
    "subtract",
    "tanh",
    "transpose",
    "tuple",
    "xor",
];

/// Engine each operator runs on, for `neuron-cc` summaries.
pub fn engine_of_operator(opcode: &str) -> Option<Engine> {
    Some(match opcode {
        "dot" => Engine::Pe,
        "exponential"
        | "exponential-minus-one"
        | "log"
        | "log-plus-one"
        | "tanh"
        | "logistic"
        | "rsqrt"
        | "sqrt"
        | "sine"
        | "cosine" => Engine::Act,
        "iota"
        | "dynamic-slice"
        | "dynamic-update-slice"
        | "gather"
        | "scatter"
        | "select-and-scatter"
        | "rng"
        | "rng-bit-generator" => Engine::Pool,
        "parameter" | "constant" | "tuple" | "get-tuple-element" | "call" => return None,
        _ => Engine::Dve,
    })
}

fn strip_percent(name: &str) -> &str {
    name.strip_prefix('%').unwrap_or(name)
}

fn attr<'i>(inst: &'i hlo::Instruction, name: &str) -> Result<&'i str, String> {
    inst.attribute(name).ok_or_else(|| format!("`{}` needs the attribute `{name}`", inst.opcode))
}

/// `{1,0}` → `[1, 0]`; a missing optional attribute is an empty list.
fn dim_list(inst: &hlo::Instruction, name: &str, optional: bool) -> Result<Vec<u32>, String> {
    let value = match inst.attribute(name) {
        Some(v) => v,
        None if optional => return Ok(Vec::new()),
        None => return Err(format!("`{}` needs the attribute `{name}`", inst.opcode)),
    };
    let inner = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .ok_or_else(|| format!("`{name}={value}` should be a list like {{0,1}}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| format!("`{name}={value}`: `{s}` is not a dimension index")))
        .collect()
}

/// `slice={[0:4:2], [1:5]}` → the slice operation.
fn slice_op(value: &str) -> Result<Op, String> {
    let bad = || format!("`slice={value}` should look like {{[0:4:2], [1:5]}}");
    let inner = value.strip_prefix('{').and_then(|v| v.strip_suffix('}')).ok_or_else(bad)?;
    let (mut start, mut limit, mut stride) = (Vec::new(), Vec::new(), Vec::new());
    for part in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let range = part.strip_prefix('[').and_then(|p| p.strip_suffix(']')).ok_or_else(bad)?;
        let numbers =
            range.split(':').map(|n| n.trim().parse::<u64>().map_err(|_| bad())).collect::<Result<Vec<_>, _>>()?;
        match numbers.as_slice() {
            [a, b] => (start.push(*a), limit.push(*b), stride.push(1)),
            [a, b, s] => (start.push(*a), limit.push(*b), stride.push(*s)),
            _ => return Err(bad()),
        };
    }
    Ok(Op::Slice { start, limit, stride })
}

/// `custom-call` targets `neuron-cc` lowers: sharding annotations, which on one core
/// leave their operand unchanged.
pub const CUSTOM_CALL_TARGETS: &[&str] = &["Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"];

/// A collective's replica groups: `{}` (one group of every rank, given as no groups),
/// `{{0,1},{2,3}}`, or the iota form `[G,S]<=[N]` (G groups of S consecutive ranks).
/// Which ranks exist is checked when the model is loaded.
fn replica_groups(inst: &hlo::Instruction) -> Result<Vec<Vec<u32>>, String> {
    let text = inst.attribute("replica_groups").unwrap_or("{}").trim();
    let bad = || {
        format!(
            "replica_groups={text} is not understood (forms: {{}}, {{{{0,1}},{{2,3}}}}, or [2,2]<=[4] without a transpose)"
        )
    };
    if let Some(iota) = text.strip_prefix('[') {
        let (shape, rest) = iota.split_once("]<=[").ok_or_else(bad)?;
        let total: u32 = rest.strip_suffix(']').and_then(|n| n.trim().parse().ok()).ok_or_else(bad)?;
        let (groups, size) = shape.split_once(',').ok_or_else(bad)?;
        let (groups, size): (u32, u32) =
            (groups.trim().parse().map_err(|_| bad())?, size.trim().parse().map_err(|_| bad())?);
        if size == 0 || groups.checked_mul(size) != Some(total) {
            return Err(bad());
        }
        return Ok((0..groups).map(|g| (g * size..(g + 1) * size).collect()).collect());
    }
    let inner = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).ok_or_else(bad)?.trim();
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    inner
        .split('}')
        .map(|g| g.trim_start_matches([',', ' ']).trim())
        .filter(|g| !g.is_empty())
        .map(|g| {
            let members = g.strip_prefix('{').ok_or_else(bad)?;
            members.split(',').map(|m| m.trim().parse::<u32>().map_err(|_| bad())).collect()
        })
        .collect()
}

/// How a scatter region combines: `(a, b) -> b` replaces, otherwise a reduction.
fn scatter_combine(region: &Computation) -> Result<ScatterCombine, String> {
    let root = &region.instructions[region.root];
    if root.opcode == "parameter" {
        return match root.payload {
            Some(Payload::ParameterNumber(1)) => Ok(ScatterCombine::Replace),
            _ => {
                Err(format!("scatter computation `{}` returns its first parameter; nothing would change", region.name))
            }
        };
    }
    reduction_kind(region).map(ScatterCombine::Reduce)
}

/// `index_vector_dim=1` and similar single indices.
fn index_attr(inst: &hlo::Instruction, name: &str) -> Result<u32, String> {
    attr(inst, name)?.trim().parse().map_err(|_| format!("`{name}` must be a non-negative integer"))
}

/// A small non-negative integer attribute (`exponent_bits=5`).
fn small_attr(inst: &hlo::Instruction, name: &str) -> Result<u8, String> {
    attr(inst, name)?.trim().parse().map_err(|_| format!("`{name}` must be an integer from 0 to 255"))
}

/// `{2,3}` → `[2, 3]`, for sizes.
fn u64_list(inst: &hlo::Instruction, name: &str) -> Result<Vec<u64>, String> {
    let value = attr(inst, name)?;
    let inner = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .ok_or_else(|| format!("`{name}={value}` should be a list like {{2,3}}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().map_err(|_| format!("`{name}={value}`: `{s}` is not a size")))
        .collect()
}

/// `padding=0_0x1_2_1` (per dimension `low_high` or `low_high_interior`) → the pad op.
fn pad_op(value: &str) -> Result<Op, String> {
    let bad = || format!("`padding={value}` should look like 0_0x1_2_1 (low_high[_interior] per dimension)");
    let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
    for part in value.split('x').map(str::trim).filter(|p| !p.is_empty()) {
        let numbers: Vec<&str> = part.split('_').collect();
        let edge = |s: &str| s.parse::<i64>().map_err(|_| bad());
        match numbers.as_slice() {
            [l, h] => (low.push(edge(l)?), high.push(edge(h)?), interior.push(0)),
            [l, h, i] => (low.push(edge(l)?), high.push(edge(h)?), interior.push(i.parse::<u64>().map_err(|_| bad())?)),
            _ => return Err(bad()),
        };
    }
    Ok(Op::Pad { low, high, interior })
}

/// The operation of an element-wise HLO instruction (arithmetic, activations,
/// comparisons, selection, conversion), or `None` for any other opcode.
/// `operand_dtypes` are the element types of its operands.
fn elementwise_op(inst: &hlo::Instruction, operand_dtypes: &[DType]) -> Result<Option<Op>, String> {
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

/// A `compare` instruction's `direction`.
fn comparison_direction(name: &str) -> Result<CompareDirection, String> {
    Ok(match name {
        "EQ" => CompareDirection::Eq,
        "NE" => CompareDirection::Ne,
        "LT" => CompareDirection::Lt,
        "LE" => CompareDirection::Le,
        "GT" => CompareDirection::Gt,
        "GE" => CompareDirection::Ge,
        other => return Err(format!("unknown comparison direction `{other}`")),
    })
}

/// Whether a `compare` orders NaNs (`type=TOTALORDER`), after checking that its
/// `type`, if given, fits the operands: FLOAT or TOTALORDER for floats, SIGNED for
/// signed integers, UNSIGNED for unsigned integers and pred.
fn comparison_type(inst: &hlo::Instruction, compared: DType) -> Result<bool, String> {
    let Some(kind) = inst.attribute("type") else {
        return Ok(false);
    };
    let fits = match kind {
        "FLOAT" | "TOTALORDER" => compared.is_float(),
        "SIGNED" => compared.class() == DTypeClass::Signed,
        "UNSIGNED" => matches!(compared.class(), DTypeClass::Unsigned | DTypeClass::Pred),
        other => {
            return Err(format!("unknown comparison type `{other}` (expected FLOAT, TOTALORDER, SIGNED or UNSIGNED)"));
        }
    };
    if !fits {
        return Err(format!("comparison type {kind} does not fit {compared} operands"));
    }
    Ok(kind == "TOTALORDER")
}

/// Emits the instructions of an expanded batch-norm operator.
struct Expander<'l, 'm> {
    lowering: &'l mut Lowering<'m>,
    hlo: &'l str,
    x_ty: ArrayType,
    feature_ty: ArrayType,
    feature: u32,
}

impl Expander<'_, '_> {
    /// A scalar constant of the operand's element type.
    fn scalar(&mut self, value: f64) -> Result<u32, String> {
        let dtype = self.x_ty.dtype;
        let bytes = literal_element(dtype, &format!("{value:e}"))
            .ok_or_else(|| format!("{value} is not representable as {dtype}"))?;
        let index = self.lowering.constants.len() as u32;
        self.lowering.constants.push(bytes);
        Ok(self.lowering.new_buffer(ArrayType::new(dtype, vec![]), BufferKind::Constant { index }))
    }

    /// A constant of type `ty` with every element `value`.
    fn constant(&mut self, value: f64, ty: ArrayType) -> Result<u32, String> {
        let scalar = self.scalar(value)?;
        self.lowering.emit_checked(Op::Broadcast { dims: vec![] }, vec![scalar], ty, self.hlo)
    }

    fn constant_like_feature(&mut self, value: f64) -> Result<u32, String> {
        self.constant(value, self.feature_ty.clone())
    }

    fn constant_like_x(&mut self, value: f64) -> Result<u32, String> {
        self.constant(value, self.x_ty.clone())
    }

    fn feature(&mut self, op: BinaryOp, a: u32, b: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Binary(op), vec![a, b], self.feature_ty.clone(), self.hlo)
    }

    fn feature_activation(&mut self, f: ActivationFn, a: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Activation(f), vec![a], self.feature_ty.clone(), self.hlo)
    }

    fn full(&mut self, op: BinaryOp, a: u32, b: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Binary(op), vec![a, b], self.x_ty.clone(), self.hlo)
    }

    fn broadcast(&mut self, a: u32) -> Result<u32, String> {
        self.lowering.emit_checked(Op::Broadcast { dims: vec![self.feature] }, vec![a], self.x_ty.clone(), self.hlo)
    }

    /// The per-feature sum of `a` over `dims`.
    fn sum(&mut self, a: u32, dims: &[u32]) -> Result<u32, String> {
        let zero = self.scalar(0.0)?;
        let op = self.lowering.plain_reduce(ReduceOp::Add, dims.to_vec(), self.x_ty.dtype);
        self.lowering.emit_checked(op, vec![a, zero], self.feature_ty.clone(), self.hlo)
    }
}

/// The array types an instruction declares: a tuple's elements, or its one array.
fn result_types(shape: &Shape) -> Result<Vec<ArrayType>, String> {
    match shape {
        Shape::Tuple(parts) => parts.iter().map(array_type).collect(),
        array => Ok(vec![array_type(array)?]),
    }
}

/// The buffers an instruction lowered to, as its declared shape has them: a tuple, or
/// the one array.
fn lowered_results(inst: &hlo::Instruction, ids: Vec<u32>) -> Lowered {
    let buffer = |id| Lowered::Buffer { id, hlo_name: inst.name.clone() };
    match (&inst.shape, ids.as_slice()) {
        (Shape::Array { .. }, [id]) => buffer(*id),
        _ => Lowered::Tuple(ids.into_iter().map(buffer).collect()),
    }
}

/// Lowers a reducer computation whose parameters have the element types `params`.
fn lower_region(region: &Computation, params: &[DType]) -> Result<Region, String> {
    let mut values: HashMap<&str, RegionValue> = HashMap::new();
    let mut steps: Vec<RegionStep> = Vec::new();
    let dtype_of = |steps: &[RegionStep], v: RegionValue| match v {
        RegionValue::Parameter(p) => params[p as usize],
        RegionValue::Step(s) => steps[s as usize].dtype,
        RegionValue::Constant { dtype, .. } => dtype,
    };
    let root = &region.instructions[region.root];
    for (i, inst) in region.instructions.iter().enumerate() {
        let at = |e: String| format!("`{}` (line {}): {e}", inst.name, inst.line);
        let scalar = || -> Result<DType, String> {
            let ty = array_type(&inst.shape).map_err(at)?;
            if ty.rank() != 0 {
                return Err(at(format!("reducers work on scalars, not {ty}")));
            }
            Ok(ty.dtype)
        };
        let value = match inst.opcode.as_str() {
            "tuple" if i == region.root => continue,
            "parameter" => {
                let Some(Payload::ParameterNumber(n)) = inst.payload else {
                    return Err(at("parameter without a number".into()));
                };
                let expected = params
                    .get(n as usize)
                    .copied()
                    .ok_or_else(|| at(format!("parameter({n}) but the reducer takes {} parameters", params.len())))?;
                if scalar()? != expected {
                    return Err(at(format!("parameter({n}) must be a {expected} scalar")));
                }
                RegionValue::Parameter(n as u32)
            }
            "constant" => {
                let dtype = scalar()?;
                let Some(Payload::Literal(tokens)) = &inst.payload else {
                    return Err(at("constant without a literal".into()));
                };
                let [token] = tokens.as_slice() else {
                    return Err(at("a scalar constant holds one value".into()));
                };
                let bytes =
                    literal_element(dtype, token).ok_or_else(|| at(format!("`{token}` is not a valid {dtype}")))?;
                let mut word = [0u8; 8];
                word[..bytes.len()].copy_from_slice(&bytes);
                RegionValue::Constant { dtype, bits: u64::from_le_bytes(word) }
            }
            _ => {
                let operands = inst
                    .operands
                    .iter()
                    .map(|o| values.get(strip_percent(o)).copied())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| at("an operand is not defined before this instruction".into()))?;
                let dtypes: Vec<DType> = operands.iter().map(|&v| dtype_of(&steps, v)).collect();
                let op = elementwise_op(inst, &dtypes).map_err(at)?.ok_or_else(|| {
                    at(format!("`{}` is not supported in a reducer (element-wise operations only)", inst.opcode))
                })?;
                steps.push(RegionStep { op, operands, dtype: scalar()? });
                RegionValue::Step(steps.len() as u32 - 1)
            }
        };
        values.insert(&inst.name, value);
    }
    let result_names: Vec<&str> = if root.opcode == "tuple" {
        root.operands.iter().map(|o| strip_percent(o)).collect()
    } else {
        vec![root.name.as_str()]
    };
    let results = result_names
        .iter()
        .map(|name| values.get(name).copied().ok_or_else(|| format!("reducer result `{name}` is not a scalar value")))
        .collect::<Result<Vec<_>, _>>()?;
    let region = Region { params: params.to_vec(), steps, results };
    region.check()?;
    Ok(region)
}

/// The comparison of a `select-and-scatter` selector `(a, b) -> compare(a, b)`:
/// the element `a` selected so far is kept over candidate `b` while it holds.
fn select_comparison(region: &Computation) -> Result<(CompareDirection, bool), String> {
    let root = &region.instructions[region.root];
    let param = |name: &str| {
        region.instructions.iter().find(|i| i.name == strip_percent(name)).and_then(|i| match i.payload {
            Some(Payload::ParameterNumber(n)) if i.opcode == "parameter" => Some(n),
            _ => None,
        })
    };
    let order: Vec<Option<u64>> = root.operands.iter().map(|o| param(o)).collect();
    let bad = || {
        format!(
            "select computation `{}` must be a comparison of its two parameters (such as GE for max pooling)",
            region.name
        )
    };
    if root.opcode != "compare" || region.instructions.len() != 3 {
        return Err(bad());
    }
    let direction = comparison_direction(attr(root, "direction")?)?;
    let direction = match order.as_slice() {
        [Some(0), Some(1)] => direction,
        // compare(b, a): the mirrored direction.
        [Some(1), Some(0)] => match direction {
            CompareDirection::Lt => CompareDirection::Gt,
            CompareDirection::Le => CompareDirection::Ge,
            CompareDirection::Gt => CompareDirection::Lt,
            CompareDirection::Ge => CompareDirection::Le,
            symmetric => symmetric,
        },
        _ => return Err(bad()),
    };
    let compared = region
        .instructions
        .iter()
        .find(|i| i.opcode == "parameter")
        .map(|p| array_type(&p.shape))
        .transpose()?
        .map_or(DType::F32, |t| t.dtype);
    Ok((direction, comparison_type(root, compared)?))
}

/// Parses `window={size=2x2 stride=2x2 pad=0_0x0_0}` for an array of `rank` dimensions.
fn window_attr(value: &str, rank: usize) -> Result<Window, String> {
    let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
    let mut window =
        Window { size: vec![1; rank], stride: vec![1; rank], pad_low: vec![0; rank], pad_high: vec![0; rank] };
    let numbers = |key: &str, v: &str| -> Result<Vec<u64>, String> {
        let parsed: Vec<u64> = v
            .split('x')
            .map(|n| n.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("window `{key}={v}` must be non-negative integers separated by `x`"))?;
        if parsed.len() != rank {
            return Err(format!("window `{key}={v}` gives {} dimension(s); the array has {rank}", parsed.len()));
        }
        Ok(parsed)
    };
    for part in inner.split_whitespace() {
        let (key, v) = part.split_once('=').ok_or_else(|| format!("window part `{part}` is not key=value"))?;
        match key {
            "size" => window.size = numbers(key, v)?,
            "stride" => window.stride = numbers(key, v)?,
            "pad" => {
                let pairs: Vec<&str> = v.split('x').collect();
                if pairs.len() != rank {
                    return Err(format!("window `pad={v}` gives {} dimension(s); the array has {rank}", pairs.len()));
                }
                for (d, pair) in pairs.iter().enumerate() {
                    let (lo, hi) = pair
                        .split_once('_')
                        .and_then(|(l, h)| Some((l.parse::<u64>().ok()?, h.parse::<u64>().ok()?)))
                        .ok_or_else(|| format!("window `pad={v}` must be low_high pairs of non-negative integers"))?;
                    (window.pad_low[d], window.pad_high[d]) = (lo, hi);
                }
            }
            "lhs_dilate" | "rhs_dilate" | "rhs_reversal" => {
                return Err(format!("window `{key}` is not supported in select-and-scatter"));
            }
            other => return Err(format!("unknown window attribute `{other}`")),
        }
    }
    Ok(window)
}

/// Recognises a reduction region `(a, b) -> op(a, b)`.
fn reduction_kind(region: &Computation) -> Result<ReduceOp, String> {
    let root = &region.instructions[region.root];
    let params: Vec<&str> =
        region.instructions.iter().filter(|i| i.opcode == "parameter").map(|i| i.name.as_str()).collect();
    let operands: Vec<&str> = root.operands.iter().map(|o| strip_percent(o)).collect();
    let plain = region.instructions.len() == 3
        && params.len() == 2
        && operands.len() == 2
        && params.iter().all(|p| operands.contains(p));
    let on_pred = matches!(&root.shape, Shape::Array { element_type, .. } if element_type == "pred");
    let kind = match root.opcode.as_str() {
        "add" => Some(ReduceOp::Add),
        "multiply" => Some(ReduceOp::Multiply),
        "maximum" => Some(ReduceOp::Maximum),
        "minimum" => Some(ReduceOp::Minimum),
        // On pred, `or` is the maximum and `and` the minimum.
        "or" if on_pred => Some(ReduceOp::Maximum),
        "and" if on_pred => Some(ReduceOp::Minimum),
        _ => None,
    };
    match kind {
        Some(kind) if plain => Ok(kind),
        _ => Err(format!(
            "computation `{}` is not a plain add, multiply, maximum or minimum (or, on pred, `or` and `and`) of its two parameters",
            region.name
        )),
    }
}

fn unsupported_element_type(name: &str) -> String {
    let supported: Vec<&str> = DType::ALL.iter().map(|t| t.hlo_name()).collect();
    let why = match name {
        "f64" => ": NeuronCores have no 64-bit floating point; export in f32 (in JAX, leave jax_enable_x64 off)",
        "c64" | "c128" => ": complex numbers are not supported",
        _ => "",
    };
    format!("element type `{name}` is not supported{why} (supported: {})", supported.join(", "))
}

fn array_type(shape: &Shape) -> Result<ArrayType, String> {
    match shape {
        Shape::Array { element_type, dims } => {
            let dtype = DType::from_hlo_name(element_type).ok_or_else(|| unsupported_element_type(element_type))?;
            let ty = ArrayType::new(dtype, dims.clone());
            if !ty.is_addressable() || ty.size_bytes().is_none() {
                return Err(format!("shape {ty} is too large to address on this host"));
            }
            Ok(ty)
        }
        Shape::Tuple(_) => Err(format!("expected an array shape, found the tuple {shape}")),
    }
}

/// One literal element as little-endian bytes, or `None` if `token` is not a value of
/// `dtype` (out of range integers included).
fn literal_element(dtype: DType, token: &str) -> Option<Vec<u8>> {
    let int = || token.parse::<i128>().ok();
    let bytes = match dtype {
        DType::Pred => vec![match token {
            "true" | "1" => 1,
            "false" | "0" => 0,
            _ => return None,
        }],
        DType::S8 => i8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S16 => i16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S32 => i32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::S64 => i64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U8 => u8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::F32 => parse_f32(token)?.to_le_bytes().to_vec(),
        // Parsed in double precision so that the value is rounded once.
        DType::F16 => half::f16::from_f64(parse_f64(token)?).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(parse_f64(token)?).to_le_bytes().to_vec(),
    };
    Some(bytes)
}

fn parse_f64(token: &str) -> Option<f64> {
    match token {
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" | "-nan" => Some(f64::NAN),
        _ => token.parse::<f64>().ok(),
    }
}

fn parse_f32(token: &str) -> Option<f32> {
    match token {
        "inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        "nan" | "-nan" => Some(f32::NAN),
        _ => token.parse::<f32>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let message = error_of(
            " s = u64[2] parameter(0)\n ROOT r = (u64[2], u32[4]) rng-bit-generator(s), algorithm=rng_mersenne",
        );
        assert!(message.contains("algorithm `rng_mersenne` is not supported"), "{message}");
        let message = error_of(
            " s = u64[3] parameter(0)\n ROOT r = (u64[3], u32[4]) rng-bit-generator(s), algorithm=rng_three_fry",
        );
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
        let err = compile("HloModule m\nENTRY e {\n a = f32[2] parameter(0)\n ROOT b = f32[2] erf(a)\n}\n")
            .expect_err("erf is unsupported");
        assert_eq!(err.line, Some(4));
        assert_eq!(err.instruction.as_deref(), Some("b"));
        assert!(err.message.contains("`erf`"), "{err}");
    }

    #[test]
    fn f64_is_refused_at_compile_time_with_a_hint() {
        let err = compile("HloModule m\nENTRY e {\n ROOT a = f64[2] parameter(0)\n}\n").expect_err("f64");
        assert_eq!(err.line, Some(3));
        assert!(err.message.starts_with("element type `f64` is not supported: NeuronCores have no 64-bit"), "{err}");
        assert!(
            err.message.ends_with("(supported: pred, s8, s16, s32, s64, u8, u16, u32, u64, f16, bf16, f32)"),
            "{err}"
        );
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
}
