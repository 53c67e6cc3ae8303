//! Lowering proper: each HLO instruction of the entry computation (calls inlined,
//! tuples resolved) becomes engine instructions on buffers ([`Lowering`]); batch-norm
//! operators expand into existing ones (`batch_norm.rs`); `finish.rs` runs the
//! optimisation passes, plans the scratchpad and assembles the program.

mod batch_norm;
mod control;
mod finish;

use std::collections::HashMap;

use super::attributes::{
    array_type, attr, conv_dims, dilated_window_attr, dim_list, index_attr, literal_element, pad_op, parse_f64,
    replica_groups, result_types, slice_op, strip_percent, u64_list, window_attr,
};
use super::operators::{CUSTOM_CALL_TARGETS, SUPPORTED_OPERATORS, custom_call_origin, elementwise_op};
use super::regions::{lower_region, reduction_kind, scatter_combine, select_comparison};
use super::*;
use crate::dtype::{ArrayType, DType};
use crate::hlo::{self, Computation, HloModule, Payload, Shape};
use crate::isa::{
    ActivationFn, BinaryOp, Buffer, BufferKind, CollectiveKind, CollectiveOp, DotDims, FloatFormat, GatherDims,
    Instruction, IoTensor, MAX_NESTING, Op, Program, ReduceOp, Region, RngAlgorithm, RngResult, ScatterDims,
    infer_output,
};

/// Lowers a parsed module: the entry computation, then the passes.
pub(super) fn lower(module: &HloModule, options: &CompileOptions) -> Result<Program, CompileError> {
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
pub(super) enum Lowered {
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

pub(super) fn flatten(value: &Lowered, out: &mut Vec<(u32, String)>) {
    match value {
        Lowered::Buffer { id, hlo_name } => out.push((*id, hlo_name.clone())),
        Lowered::Tuple(parts) => parts.iter().for_each(|p| flatten(p, out)),
    }
}

pub(super) struct Lowering<'m> {
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
        if !matches!(
            inst.opcode.as_str(),
            "tuple" | "get-tuple-element" | "call" | "while" | "conditional" | "opt-barrier"
        ) {
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
            // `jax.checkpoint` keeps XLA from moving recomputation across this point;
            // instructions here run in program order anyway, so it passes its operand on.
            "opt-barrier" => {
                let [name] = inst.operands.as_slice() else {
                    return Err("opt-barrier takes one operand".into());
                };
                return operand(name).cloned();
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
            "while" => {
                let [state] = inst.operands.as_slice() else {
                    return Err("while takes one operand, its initial state".into());
                };
                let state = operand(state)?.clone();
                return self.while_loop(inst, &state, depth);
            }
            "conditional" => return self.conditional(inst, env, depth),
            "reduce-window" => {
                let lowered = self.reducer(inst, &buffer_operands[..buffer_operands.len() / 2])?;
                let rank = buffer_operands.first().map_or(0, |&b| self.buffers[b as usize].ty.rank());
                let window = dilated_window_attr(attr(inst, "window")?, rank)?;
                return self.emit_declared(inst, Op::ReduceWindow { window, region: lowered }, buffer_operands);
            }
            "sort" => {
                let comparator = self.region(inst)?;
                let params: Vec<DType> = buffer_operands
                    .iter()
                    .flat_map(|&b| [self.buffers[b as usize].ty.dtype, self.buffers[b as usize].ty.dtype])
                    .collect();
                let comparator = lower_region(self.module, comparator, &params)
                    .map_err(|e| format!("comparator `{}`: {e}", comparator.name))?;
                let dims = dim_list(inst, "dimensions", false)?;
                let [dim] = dims.as_slice() else {
                    return Err("sort needs exactly one dimension in `dimensions`".into());
                };
                return self.emit_declared(inst, Op::Sort { dim: *dim, comparator }, buffer_operands);
            }
            "topk" => {
                let k: u64 = attr(inst, "k")?.parse().map_err(|_| "`k` must be a non-negative integer".to_string())?;
                let largest = match inst.attribute("largest") {
                    None | Some("true") => true,
                    Some("false") => false,
                    Some(other) => return Err(format!("`largest={other}` must be true or false")),
                };
                return self.emit_declared(inst, Op::TopK { k, largest }, buffer_operands);
            }
            "dot" | "convolution" => {
                // Matrix products round their f32 operands to the auto-cast type. Under
                // `--auto-cast matmult`, a dot of f32 operands rounds them itself while it
                // packs them (`MatMulRounded`); only constants are rounded here, once.
                let f32_operands = buffer_operands.iter().all(|&b| self.buffers[b as usize].ty.dtype == DType::F32);
                let rounds_itself = inst.opcode == "dot" && self.options.auto_cast == AutoCast::MatMult && f32_operands;
                if self.options.auto_cast != AutoCast::None {
                    for b in &mut buffer_operands {
                        let constant = matches!(self.buffers[*b as usize].kind, BufferKind::Constant { .. });
                        if !rounds_itself || constant {
                            *b = self.auto_cast(*b, &inst.name)?;
                        }
                    }
                }
                if inst.opcode == "convolution" {
                    Op::Convolution(conv_dims(inst)?)
                } else {
                    let dims = DotDims {
                        lhs_batch: dim_list(inst, "lhs_batch_dims", true)?,
                        lhs_contracting: dim_list(inst, "lhs_contracting_dims", true)?,
                        rhs_batch: dim_list(inst, "rhs_batch_dims", true)?,
                        rhs_contracting: dim_list(inst, "rhs_contracting_dims", true)?,
                    };
                    if rounds_itself {
                        let (format, saturate) = (self.options.auto_cast_type.format(), self.options.saturate_infinity);
                        Op::MatMulRounded { dims, format, saturate }
                    } else {
                        Op::MatMul(dims)
                    }
                }
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
                    _ => return self.reduce_with_region(inst, dims, buffer_operands),
                }
            }
            "select-and-scatter" => {
                let (select, total_order) = select_comparison(self.called(inst, "select")?)?;
                let rank = self.buffers[buffer_operands[0] as usize].ty.rank();
                Op::SelectAndScatter {
                    window: window_attr(attr(inst, "window")?, rank)?,
                    select,
                    total_order,
                    combine: scatter_combine(self.called(inst, "scatter")?)?,
                }
            }
            "rng-bit-generator" => return self.rng_bit_generator(inst, buffer_operands),
            "partition-id" => Op::PartitionId,
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
                if let Some(origin) = custom_call_origin(target) {
                    return Err(format!(
                        "custom-call target `{target}` is a host library routine, which NeuronCores do not run; \
                         JAX emits it for {origin}; compute it outside the model, or express it with \
                         matrix products and loops"
                    ));
                }
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
        let inferred = infer_output(&op, &operand_types, &declared).map_err(|e| e.to_string())?;
        if inferred != declared {
            return Err(format!("`{}` produces {inferred} but the instruction declares {declared}", inst.opcode));
        }
        // Under `--auto-cast all`, operations that compute new f32 values round them.
        let computes = matches!(
            op,
            Op::MatMul(_)
                | Op::MatMulRounded { .. }
                | Op::Convolution(_)
                | Op::Activation(_)
                | Op::Binary(_)
                | Op::Reduce { .. }
                | Op::Convert
                | Op::Iota { .. }
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
        let inferred = infer_output(&op, &types, &declared).map_err(|e| e.to_string())?;
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
        dims: Vec<u32>,
        operands: Vec<u32>,
    ) -> Result<Lowered, String> {
        let n = operands.len() / 2;
        if n == 0 || !operands.len().is_multiple_of(2) {
            return Err(format!("reduce takes arrays and as many initial values, got {} operand(s)", operands.len()));
        }
        let lowered = self.reducer(inst, &operands[..n])?;
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
        self.called(inst, "to_apply")
    }

    /// The computation an instruction names in attribute `key`.
    fn called(&self, inst: &hlo::Instruction, key: &str) -> Result<&'m Computation, String> {
        let name = strip_percent(attr(inst, key)?);
        self.module.computation(name).ok_or_else(|| format!("computation `{name}` is not defined"))
    }

    /// The reducer (`to_apply`) of an instruction over `arrays` (and as many initial
    /// values): its parameters are the accumulated values, then the incoming ones.
    fn reducer(&self, inst: &hlo::Instruction, arrays: &[u32]) -> Result<Region, String> {
        let region = self.region(inst)?;
        let dtypes: Vec<DType> = arrays.iter().map(|&b| self.buffers[b as usize].ty.dtype).collect();
        let params: Vec<DType> = dtypes.iter().chain(&dtypes).copied().collect();
        lower_region(self.module, region, &params).map_err(|e| format!("reducer `{}`: {e}", region.name))
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
}

/// The buffers an instruction lowered to, as its declared shape has them: a tuple, or
/// the one array.
pub(super) fn lowered_results(inst: &hlo::Instruction, ids: Vec<u32>) -> Lowered {
    let buffer = |id| Lowered::Buffer { id, hlo_name: inst.name.clone() };
    match (&inst.shape, ids.as_slice()) {
        (Shape::Array { .. }, [id]) => buffer(*id),
        _ => Lowered::Tuple(ids.into_iter().map(buffer).collect()),
    }
}
