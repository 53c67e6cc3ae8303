//! Lowering of `while` and `conditional`: each computation they run (a loop's
//! condition and body, a conditional's branches) is lowered on its own into a nested
//! [`Program`] whose inputs are the computation's parameter (flattened when it is a
//! tuple) and whose outputs are its result, with the same options and passes as the
//! entry computation. The instruction then writes one buffer per flattened result, and
//! the tuple structure is rebuilt around those buffers at compile time.

use super::*;
use crate::isa::{Branches, Loop, Nested, check_results};

impl<'m> Lowering<'m> {
    /// `while(state), condition=…, body=…`.
    pub(super) fn while_loop(
        &mut self,
        inst: &hlo::Instruction,
        state: &Lowered,
        depth: usize,
    ) -> Result<Lowered, String> {
        let condition = self.called(inst, "condition")?;
        let body = self.called(inst, "body")?;
        let condition = self
            .nested_program(condition, std::slice::from_ref(state), depth)
            .map_err(|e| format!("in loop condition `{}`: {e}", condition.name))?;
        let body = self
            .nested_program(body, std::slice::from_ref(state), depth)
            .map_err(|e| format!("in loop body `{}`: {e}", body.name))?;
        let mut init = Vec::new();
        flatten(state, &mut init);
        let operands: Vec<u32> = init.iter().map(|(b, _)| *b).collect();
        self.emit_declared(inst, Op::While(Nested::new(Loop { condition, body })), operands)
    }

    /// `conditional(selector, operands…)` with `true_computation`/`false_computation` or
    /// `branch_computations={…}`.
    pub(super) fn conditional(
        &mut self,
        inst: &hlo::Instruction,
        env: &HashMap<&str, Lowered>,
        depth: usize,
    ) -> Result<Lowered, String> {
        let operand = |name: &str| -> Result<&Lowered, String> {
            env.get(strip_percent(name))
                .ok_or_else(|| format!("operand `{name}` is not defined before this instruction"))
        };
        let Some((selector, branch_operands)) = inst.operands.split_first() else {
            return Err("conditional takes a selector and one operand per branch".into());
        };
        let selector = match operand(selector)? {
            Lowered::Buffer { id, .. } => *id,
            Lowered::Tuple(_) => return Err("the conditional's selector must be a pred[] or s32[] array".into()),
        };
        let computations: Vec<&Computation> = if inst.attribute("branch_computations").is_some() {
            let list = attr(inst, "branch_computations")?.trim().trim_start_matches('{').trim_end_matches('}');
            list.split(',')
                .map(|name| {
                    let name = strip_percent(name.trim());
                    self.module.computation(name).ok_or_else(|| format!("computation `{name}` is not defined"))
                })
                .collect::<Result<_, _>>()?
        } else {
            vec![self.called(inst, "true_computation")?, self.called(inst, "false_computation")?]
        };
        if computations.len() != branch_operands.len() {
            return Err(format!(
                "conditional has {} branch(es) but {} branch operand(s)",
                computations.len(),
                branch_operands.len()
            ));
        }
        let mut operands = vec![selector];
        let mut branches = Vec::with_capacity(computations.len());
        for (computation, name) in computations.iter().zip(branch_operands) {
            let arg = operand(name)?.clone();
            let program = self
                .nested_program(computation, std::slice::from_ref(&arg), depth)
                .map_err(|e| format!("in branch `{}`: {e}", computation.name))?;
            let mut leaves = Vec::new();
            flatten(&arg, &mut leaves);
            operands.extend(leaves.iter().map(|(b, _)| *b));
            branches.push(program);
        }
        self.emit_declared(inst, Op::Conditional(Nested::new(Branches { branches })), operands)
    }

    /// Lowers `computation` into a program of its own whose parameters take the
    /// values of `args` (this lowering's values: their types and structure).
    fn nested_program(&self, computation: &Computation, args: &[Lowered], depth: usize) -> Result<Program, String> {
        if depth >= MAX_NESTING {
            return Err(format!("loops and conditionals nest deeper than {MAX_NESTING} levels"));
        }
        let mut nested = Lowering {
            module: self.module,
            options: self.options,
            buffers: Vec::new(),
            instructions: Vec::new(),
            constants: Vec::new(),
            hlo_names: Vec::new(),
            inputs: Vec::new(),
            visited: self.visited,
            cast: HashMap::new(),
        };
        let params: Vec<Lowered> = args.iter().map(|a| nested.mirror_as_inputs(a, &self.buffers)).collect();
        let result = nested.computation(computation, Some(&params), depth + 1).map_err(|e| e.to_string())?;
        let mut outputs = Vec::new();
        flatten(&result, &mut outputs);
        let outputs = outputs
            .into_iter()
            .enumerate()
            .map(|(i, (buffer, hlo_name))| IoTensor { name: format!("output{i}"), hlo_name, buffer })
            .collect();
        nested.finish(outputs).map_err(|e| e.to_string())
    }

    /// A value of this (nested) lowering with the structure and types of `value`, whose
    /// arrays are new inputs, numbered in order.
    fn mirror_as_inputs(&mut self, value: &Lowered, outer: &[Buffer]) -> Lowered {
        match value {
            Lowered::Buffer { id, hlo_name } => {
                let buffer = self.new_buffer(outer[*id as usize].ty.clone(), BufferKind::Intermediate { offset: 0 });
                self.inputs.push((self.inputs.len() as u64, hlo_name.clone(), buffer));
                Lowered::Buffer { id: buffer, hlo_name: hlo_name.clone() }
            }
            Lowered::Tuple(parts) => Lowered::Tuple(parts.iter().map(|p| self.mirror_as_inputs(p, outer)).collect()),
        }
    }

    /// Emits `op` writing the arrays `inst` declares (one, or a tuple of them) and
    /// returns them as the instruction's value.
    pub(super) fn emit_declared(
        &mut self,
        inst: &hlo::Instruction,
        op: Op,
        operands: Vec<u32>,
    ) -> Result<Lowered, String> {
        let mut types = Vec::new();
        flatten_shape(&inst.shape, &mut types)?;
        let first = self.emit_results(op, operands, types, &inst.name)?;
        Ok(rebuild(&declared_structure(&inst.shape), &mut (first..), &inst.name))
    }

    /// Emits an instruction that writes one buffer per type in `types`, consecutive;
    /// returns the first.
    fn emit_results(
        &mut self,
        op: Op,
        operands: Vec<u32>,
        types: Vec<ArrayType>,
        hlo_name: &str,
    ) -> Result<u32, String> {
        {
            let operand_types: Vec<&ArrayType> = operands.iter().map(|&b| &self.buffers[b as usize].ty).collect();
            let result_types: Vec<&ArrayType> = types.iter().collect();
            check_results(&op, &operand_types, &result_types).map_err(|e| e.to_string())?;
        }
        let first = self.buffers.len() as u32;
        for ty in types {
            self.new_buffer(ty, BufferKind::Intermediate { offset: 0 });
        }
        let hlo = self.hlo_names.len() as u32;
        self.hlo_names.push(hlo_name.to_string());
        self.instructions.push(Instruction { step: self.instructions.len() as u32, op, operands, output: first, hlo });
        Ok(first)
    }
}

/// `structure` with its arrays replaced, in order, by buffers from `ids`.
fn rebuild(structure: &Lowered, ids: &mut std::ops::RangeFrom<u32>, hlo_name: &str) -> Lowered {
    match structure {
        Lowered::Buffer { .. } => {
            Lowered::Buffer { id: ids.next().unwrap_or(u32::MAX), hlo_name: hlo_name.to_string() }
        }
        Lowered::Tuple(parts) => Lowered::Tuple(parts.iter().map(|p| rebuild(p, ids, hlo_name)).collect()),
    }
}

/// A placeholder value with the tuple structure of `shape`.
fn declared_structure(shape: &Shape) -> Lowered {
    match shape {
        Shape::Tuple(parts) => Lowered::Tuple(parts.iter().map(declared_structure).collect()),
        Shape::Array { .. } => Lowered::Buffer { id: 0, hlo_name: String::new() },
    }
}

fn flatten_shape(shape: &Shape, out: &mut Vec<ArrayType>) -> Result<(), String> {
    match shape {
        Shape::Tuple(parts) => parts.iter().try_for_each(|p| flatten_shape(p, out)),
        array => {
            out.push(array_type(array)?);
            Ok(())
        }
    }
}
