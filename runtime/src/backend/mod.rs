//! The CPU execution backend: runs a validated [`Program`] with real numerics.
//!
//! An [`Executable`] is prepared once per load: constants are made resident (the weights DMA
//! queue), the engine streams are merged into their global step order, chains of
//! element-wise instructions are grouped to run fused (see `fusion`), and each
//! intermediate's last reader is found so its memory is released as soon as it is dead.
//! [`Executable::run`] then moves the inputs in, runs every instruction, and hands the
//! outputs back. It checks the deadline between instructions.

mod control;
mod element;
mod fusion;
mod kernels;
mod small;
mod value;
mod working;

use std::sync::{Mutex, PoisonError};

pub(crate) use kernels::{choose_product_kernel, round_to_format};
pub(crate) use value::{CollectiveRunner, CollectiveStep, Destination, Input, Output, Value, ValueRef};

use crate::dtype::{ArrayType, DType};
use crate::error::NrtError;
use crate::isa::{BinaryOp, BufferKind, Instruction, Op, Program, ReduceOp};
use crate::pool::HostPool;
use neuron_datastore::InstructionSpan;
use neuron_datastore::clock::ticks;

/// A gather or scatter index that reaches outside its array: what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutOfBounds(pub(crate) String);

/// Why a run stopped early. Instructions are named by their position in
/// [`Executable::trace_table`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunError {
    /// The deadline passed before instruction `step` could start (or, for a loop,
    /// before its next iteration; a small loop checks at least every 32 iterations).
    DeadlineExceeded { step: usize },
    /// Instruction `step` indexed outside an array.
    OutOfBounds { step: usize, detail: String },
    /// Instruction `step` (or the fused group it starts) needs `bytes` of working
    /// memory that the host cannot allocate now.
    OutOfMemory { step: usize, bytes: u64 },
    /// The collective at `step` failed.
    Collective { step: usize, error: NrtError },
}

/// Sees the tick interval of each instruction that ran: its position in
/// [`Executable::trace_table`], its start and its end. A closure of those three is one.
pub(crate) trait Observe {
    fn instruction(&mut self, k: usize, start: u64, end: u64);

    /// Intervals in the order they ran, each with its own start: what a small loop
    /// reports of a timed iteration, or of the untimed ones since its last clock read,
    /// in one call.
    fn spans(&mut self, spans: &[InstructionSpan]) {
        spans.iter().for_each(|s| self.instruction(s.entry as usize, s.start, s.end));
    }
}

impl<F: FnMut(usize, u64, u64)> Observe for F {
    fn instruction(&mut self, k: usize, start: u64, end: u64) {
        self(k, start, end);
    }
}

/// What [`Executable::run`] reports the instructions that ran to.
pub(crate) type InstructionObserver<'o> = dyn Observe + 'o;

/// A program prepared for repeated execution.
#[derive(Debug)]
pub(crate) struct Executable {
    program: Program,
    /// Instructions in the order they execute: (stream index, instruction index). This
    /// is the global step order, except that the members of a fused group are moved
    /// next to each other (past instructions that do not depend on them).
    order: Vec<(usize, usize)>,
    /// Runs of `order` that execute as one: a single instruction or a fused group.
    units: Vec<fusion::Unit>,
    /// Decoded copies of the constants that cannot be viewed in place, by constant index.
    decoded_constants: Vec<Option<Value>>,
    /// Buffers to release after each unit.
    release_after: Vec<Vec<u32>>,
    /// For each buffer, the first program output it is returned as.
    output_of_buffer: Vec<Option<usize>>,
    /// `f32` arrays that died in earlier runs, reused for the outputs of fused groups
    /// and of `f32` matrix products, which write every element (a new array would be
    /// zeroed and then faulted in page by page).
    spare: Mutex<Vec<Vec<f32>>>,
    /// The lengths of those outputs: only arrays of these lengths are kept as spares
    /// (others would fill the spares with arrays nothing asks for).
    spare_lengths: Vec<usize>,
    /// Position of this program's first instruction in the trace table of the
    /// outermost program (see [`Executable::trace_table`]).
    base: usize,
    /// For each position of `order`, the prepared programs of a loop or conditional
    /// (empty for other instructions).
    nested: Vec<Vec<Executable>>,
    /// For each position of `order`, the loop prepared to run on kept arrays, where it
    /// is small (see `small`) and fusion is on.
    small: Vec<Option<small::SmallLoop>>,
    /// Entries this program and its nested ones take in the trace table.
    table_len: usize,
    /// For each unit, an upper bound of the host memory it allocates while it runs.
    working_bytes: Vec<u64>,
}

/// Constants of at most this many bytes are decoded once, at load, rather than viewed
/// in place at every run.
const SMALL_CONSTANT_BYTES: usize = 4096;

/// The most dead arrays of one length kept for reuse.
const MAX_SPARE: usize = 8;

/// The most elements the dead arrays kept for reuse may hold together (64 MiB): they
/// stay allocated between runs.
const MAX_SPARE_ELEMENTS: usize = 16 << 20;

/// The elements of an array of type `ty` (a validated program's types fit in memory).
fn elements(ty: &ArrayType) -> usize {
    ty.element_count().unwrap_or(0) as usize
}

/// A buffer's contents during a run.
enum Slot<'a> {
    Empty,
    Borrowed(ValueRef<'a>),
    Owned(Value),
}

impl Slot<'_> {
    fn get(&self) -> Option<ValueRef<'_>> {
        match self {
            Slot::Empty => None,
            Slot::Borrowed(v) => Some(v.view()),
            Slot::Owned(v) => Some(v.view()),
        }
    }
}

impl Executable {
    /// Prepares a program that has passed [`Program::validate`]; with `fuse`, chains of
    /// element-wise instructions run fused.
    pub(crate) fn new(program: Program, fuse: bool) -> Executable {
        Executable::at(program, fuse, 0)
    }

    /// Prepares a program whose first instruction is entry `base` of the trace table.
    fn at(program: Program, fuse: bool, base: usize) -> Executable {
        let mut by_step: Vec<(u32, usize, usize)> = Vec::new();
        for (s, stream) in program.streams.iter().enumerate() {
            for (i, instruction) in stream.instructions.iter().enumerate() {
                by_step.push((instruction.step, s, i));
            }
        }
        by_step.sort_unstable();
        let steps: Vec<&Instruction> = by_step.iter().map(|&(_, s, i)| &program.streams[s].instructions[i]).collect();
        let schedule = fusion::schedule(&program, &steps, fuse);
        let order: Vec<(usize, usize)> = schedule.order.iter().map(|&p| (by_step[p].1, by_step[p].2)).collect();
        let units = schedule.units;
        let mut spare_lengths: Vec<usize> =
            units.iter().filter_map(|u| u.group.as_ref()).flat_map(|g| g.output_lengths()).collect();
        let products = steps.iter().map(|i| (&i.op, &program.buffers[i.output as usize].ty));
        spare_lengths
            .extend(products.filter(|(op, ty)| kernels::product_into_spare(op, ty)).map(|(_, ty)| elements(ty)));
        // Small arrays are left to the allocator.
        spare_lengths.retain(|&n| n >= kernels::SPARE_MIN_ELEMENTS);
        spare_lengths.sort_unstable();
        spare_lengths.dedup();

        // Constants are viewed in place in the program's blobs at each run; those that
        // cannot be (predicates, unaligned blobs), and small ones, whose views would cost
        // more to build at every run (a loop body runs once per iteration) than their
        // copy does to keep, are decoded, once, here.
        let mut decoded_constants: Vec<Option<Value>> = vec![None; program.constants.len()];
        for b in &program.buffers {
            if let BufferKind::Constant { index } = b.kind
                && let Some(blob) = program.constants.get(index as usize)
                && (blob.len() <= SMALL_CONSTANT_BYTES || ValueRef::from_le_bytes(&b.ty, blob).is_none())
            {
                decoded_constants[index as usize] = Some(Value::from_le_bytes(&b.ty, blob));
            }
        }

        let mut last_reader: Vec<Option<usize>> = vec![None; program.buffers.len()];
        for (u, unit) in units.iter().enumerate() {
            for &(s, i) in &order[unit.first..unit.first + unit.len] {
                for &b in &program.streams[s].instructions[i].operands {
                    last_reader[b as usize] = Some(u);
                }
            }
        }
        let is_output: Vec<bool> =
            (0..program.buffers.len()).map(|b| program.outputs.iter().any(|o| o.buffer as usize == b)).collect();
        let mut release_after = vec![Vec::new(); units.len()];
        for (b, last) in last_reader.iter().enumerate() {
            if let Some(u) = last
                && !is_output[b]
            {
                release_after[*u].push(b as u32);
            }
        }
        let mut output_of_buffer = vec![None; program.buffers.len()];
        for (k, io) in program.outputs.iter().enumerate().rev() {
            output_of_buffer[io.buffer as usize] = Some(k);
        }
        // The trace table lists this program's instructions in execution order, then
        // the nested programs' entries, loop after loop.
        let mut next = base + order.len();
        let nested: Vec<Vec<Executable>> = order
            .iter()
            .map(|&(s, i)| {
                let op = &program.streams[s].instructions[i].op;
                op.nested_programs()
                    .into_iter()
                    .map(|p| {
                        let e = Executable::at(p.clone(), fuse, next);
                        next += e.table_len;
                        e
                    })
                    .collect()
            })
            .collect();
        let small = order
            .iter()
            .zip(&nested)
            .map(|(&(s, i), programs)| match (&program.streams[s].instructions[i].op, programs.as_slice()) {
                (Op::While(_), [condition, body]) if fuse => small::SmallLoop::new(condition, body),
                _ => None,
            })
            .collect();
        let working_bytes = units
            .iter()
            .map(|unit| match &unit.group {
                // A fused group allocates only the values it writes out.
                Some(group) => group
                    .output_buffers()
                    .map(|b| program.buffers[b as usize].ty.size_bytes().unwrap_or(u64::MAX))
                    .fold(0, u64::saturating_add),
                None => {
                    let (s, i) = order[unit.first];
                    working::working_bytes(&program.streams[s].instructions[i], &program)
                }
            })
            .collect();
        Executable {
            working_bytes,
            program,
            order,
            units,
            decoded_constants,
            release_after,
            output_of_buffer,
            spare: Mutex::new(Vec::new()),
            spare_lengths,
            base,
            nested,
            small,
            table_len: next - base,
        }
    }

    /// Every instruction that can run, with the program it belongs to, in the order
    /// traces name them: this program's in execution order, then each loop's and
    /// conditional's programs' (recursively), in the order of those instructions.
    pub(crate) fn trace_table(&self) -> Vec<(&Instruction, &Program)> {
        let mut table: Vec<(&Instruction, &Program)> = self.steps().map(|i| (i, &self.program)).collect();
        for nested in self.nested.iter().flatten() {
            table.extend(nested.trace_table());
        }
        table
    }

    /// For each entry of [`Executable::trace_table`], the bytes it reads and writes when
    /// it runs fused, where that differs from what its operands and result hold: a
    /// fused group's members move only the group's inputs and the values read after it.
    /// `None` for instructions that run on their own.
    pub(crate) fn moved_bytes(&self) -> Vec<Option<(u64, u64)>> {
        let mut moved: Vec<Option<(u64, u64)>> = vec![None; self.order.len()];
        for (u, unit) in self.units.iter().enumerate() {
            if let Some(group) = &unit.group {
                for (j, bytes) in group.moved_bytes(&self.program).into_iter().enumerate() {
                    moved[unit.first + j] = Some(bytes);
                }
            } else if self.reshape_of_dying(u).is_some() {
                // Not returned: the reshape takes its operand's array over (see `run`).
                let (s, i) = self.order[unit.first];
                let output = self.program.streams[s].instructions[i].output as usize;
                if self.output_of_buffer[output].is_none() {
                    moved[unit.first] = Some((0, 0));
                }
            }
        }
        for nested in self.nested.iter().flatten() {
            moved.extend(nested.moved_bytes());
        }
        moved
    }

    /// The operand of unit `u` when `u` is a reshape of an intermediate that dies with
    /// it: unless the reshape writes a returned output, `run` takes the operand's array
    /// over instead of copying it.
    fn reshape_of_dying(&self, u: usize) -> Option<u32> {
        let (s, i) = self.order[self.units[u].first];
        let instruction = &self.program.streams[s].instructions[i];
        match (&instruction.op, instruction.operands.as_slice()) {
            (Op::Reshape, &[operand])
                if self.release_after[u].contains(&operand)
                    && matches!(self.program.buffers[operand as usize].kind, BufferKind::Intermediate { .. }) =>
            {
                Some(operand)
            }
            _ => None,
        }
    }

    /// The instruction at position `step` of `order` if it writes several buffers or
    /// runs nested programs (a loop, a conditional, a top-k, a variadic window).
    fn writes_several(&self, step: usize) -> Option<&Instruction> {
        let (s, i) = self.order[step];
        let instruction = &self.program.streams[s].instructions[i];
        (!self.nested[step].is_empty() || instruction.op.result_count() > 1).then_some(instruction)
    }

    /// An `f32` array of `n` elements with unspecified contents, for the output of a
    /// fused group or of a product.
    fn spare_f32(&self, n: usize) -> Vec<f32> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        match spare.iter().position(|v| v.len() == n) {
            Some(i) => spare.swap_remove(i),
            None => vec![0.0; n],
        }
    }

    /// Keeps a dead intermediate's array for reuse, if it is an `f32` one.
    fn recycle(&self, slot: Slot<'_>) {
        if let Slot::Owned(Value::F32(array)) = slot
            && self.spare_lengths.binary_search(&array.len()).is_ok()
            && array.is_standard_layout()
            && let (data, Some(0)) = array.into_raw_vec_and_offset()
        {
            let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
            let same = spare.iter().filter(|v| v.len() == data.len()).count();
            if same < MAX_SPARE && spare.iter().map(Vec::len).sum::<usize>() + data.len() <= MAX_SPARE_ELEMENTS {
                spare.push(data);
            }
        }
    }

    /// `Opcode, HLO `name``: what trace table entry `k` is, for error messages.
    pub(crate) fn describe_entry(&self, k: usize) -> String {
        match self.trace_table().get(k) {
            Some((instruction, program)) => format!(
                "{}, HLO `{}`",
                instruction.op.opcode(),
                program.hlo_names.get(instruction.hlo as usize).map_or("", String::as_str)
            ),
            None => "no instruction".into(),
        }
    }

    pub(crate) fn program(&self) -> &Program {
        &self.program
    }

    /// Instructions in the order they execute.
    pub(crate) fn steps(&self) -> impl Iterator<Item = &Instruction> {
        self.order.iter().map(|&(s, i)| &self.program.streams[s].instructions[i])
    }

    fn constant_slot(&self, index: usize, ty: &ArrayType) -> Slot<'_> {
        if let Some(value) = &self.decoded_constants[index] {
            return Slot::Borrowed(value.view());
        }
        let blob = &self.program.constants[index];
        match ValueRef::from_le_bytes(ty, blob) {
            Some(view) => Slot::Borrowed(view),
            None => Slot::Owned(Value::from_le_bytes(ty, blob)),
        }
    }

    /// Runs the program on `inputs` (one value per program input, of its type). An
    /// output with a destination is computed straight into it; the others are returned
    /// as values. The deadline is in host ticks (`neuron_datastore::clock::ticks`), read before
    /// each instruction or fused group and each loop iteration; `on_instruction(k,
    /// start, end)` sees the tick interval of each instruction that ran, named by its
    /// entry `k` in [`Executable::trace_table`]: one program's instructions back to
    /// back, a fused group's interval split between its members in proportion to the
    /// time each took, and a loop's or conditional's instructions inside the intervals
    /// of its iterations. Large matrix products and element-wise work may borrow the
    /// idle slots of `helpers`.
    pub(crate) fn run<'a>(
        &'a self,
        inputs: Vec<Input<'a>>,
        mut destinations: Vec<Option<Destination<'a>>>,
        deadline_ticks: u64,
        helpers: &HostPool,
        collectives: &mut CollectiveRunner<'_, 'a>,
        on_instruction: &mut InstructionObserver<'_>,
    ) -> Result<Vec<Output<'a>>, RunError> {
        let mut collective_index = 0u32;
        let program = &self.program;
        let mut slots: Vec<Slot<'a>> = program
            .buffers
            .iter()
            .map(|b| match b.kind {
                BufferKind::Constant { index } => self.constant_slot(index as usize, &b.ty),
                _ => Slot::Empty,
            })
            .collect();
        for (io, input) in program.inputs.iter().zip(inputs) {
            slots[io.buffer as usize] = match input {
                Input::InPlace(view) => Slot::Borrowed(view),
                Input::Copied(value) => Slot::Owned(value),
            };
        }
        let mut written = vec![false; program.outputs.len()];
        // A single instruction's interval ends at the next clock read.
        let mut open: Option<usize> = None;
        let mut previous = ticks();
        for (u, unit) in self.units.iter().enumerate() {
            // Intervals are back to back: each starts where the one reported before ended.
            let now = ticks();
            if let Some(k) = open.take() {
                on_instruction.instruction(self.base + k, previous, now);
                previous = now;
            }
            if now > deadline_ticks {
                return Err(RunError::DeadlineExceeded { step: self.base + unit.first });
            }
            let bytes = self.working_bytes[u];
            if bytes > 0 && !working::can_allocate(bytes) {
                return Err(RunError::OutOfMemory { step: self.base + unit.first, bytes });
            }
            if let Some(group) = &unit.group {
                let (results, shares) = fusion::run(
                    group,
                    |b| slots[b as usize].get(),
                    |b| {
                        let k = self.output_of_buffer[b as usize]?;
                        let destination = destinations.get_mut(k)?.take()?;
                        written[k] = true;
                        Some(destination)
                    },
                    |n| self.spare_f32(n),
                    helpers,
                );
                let end = ticks();
                for (b, result) in results {
                    slots[b as usize] = match result {
                        Output::Written(view) => Slot::Borrowed(view),
                        Output::Value(value) => Slot::Owned(value),
                    };
                }
                for (k, (start, stop)) in split_interval(previous, end, &shares).into_iter().enumerate() {
                    on_instruction.instruction(self.base + unit.first + k, start, stop);
                }
                previous = end;
            } else if let Some(instruction) = self.writes_several(unit.first) {
                // A loop, a conditional, or a kernel with several results.
                let step = unit.first;
                let nested = &self.nested[step];
                let operands: Vec<ValueRef<'_>> =
                    instruction.operands.iter().filter_map(|&o| slots[o as usize].get()).collect();
                let results = if nested.is_empty() {
                    open = Some(step);
                    let out: Vec<&ArrayType> = instruction.outputs().map(|b| &program.buffers[b as usize].ty).collect();
                    kernels::execute_results(&instruction.op, &operands, &out, helpers)
                } else {
                    let index = self.base + step;
                    let results = match &self.small[step] {
                        Some(small) => small.run(index, &operands, deadline_ticks, helpers, on_instruction)?,
                        None => control::run(
                            &instruction.op,
                            nested,
                            index,
                            operands,
                            deadline_ticks,
                            helpers,
                            on_instruction,
                        )?,
                    };
                    // The loop reported its own intervals; the next one starts now.
                    previous = ticks();
                    results
                };
                for (b, value) in instruction.outputs().zip(results) {
                    slots[b as usize] = Slot::Owned(value);
                }
            } else {
                let step = unit.first;
                let (s, i) = self.order[step];
                let instruction = &program.streams[s].instructions[i];
                let b = instruction.output as usize;
                let out_ty = &program.buffers[b].ty;
                let slot = if let Op::Collective(collective) = &instruction.op {
                    // The result goes into its output tensor where it can, else it comes as
                    // a value (copied out later).
                    let operand_buffer = instruction.operands[0] as usize;
                    let operand =
                        slots[operand_buffer].get().unwrap_or_else(|| kernels::unvalidated("collective operand"));
                    let input = match (&program.buffers[operand_buffer].kind, &slots[operand_buffer]) {
                        (BufferKind::Input { index }, Slot::Borrowed(_)) => Some(*index as usize),
                        _ => None,
                    };
                    let destination =
                        self.output_of_buffer[b].and_then(|k| destinations.get_mut(k)?.take().map(|d| (k, d)));
                    let k = destination.as_ref().map(|(k, _)| *k);
                    let step_of = CollectiveStep {
                        index: collective_index,
                        op: collective,
                        operand,
                        input,
                        out: out_ty,
                        destination,
                    };
                    let output =
                        collectives(step_of).map_err(|error| RunError::Collective { step: self.base + step, error })?;
                    collective_index += 1;
                    match (output, k) {
                        (Output::Written(view), Some(k)) => {
                            written[k] = true;
                            Slot::Borrowed(view)
                        }
                        (Output::Written(view), None) => Slot::Owned(view.to_owned()),
                        (Output::Value(value), _) => Slot::Owned(value),
                    }
                } else {
                    let destination =
                        self.output_of_buffer[b].and_then(|k| destinations.get_mut(k)?.take().map(|d| (k, d)));
                    // A reshape of an array that dies here takes the array over: no copy.
                    let dying = match (self.reshape_of_dying(u), &destination) {
                        (Some(operand), None) if matches!(slots[operand as usize], Slot::Owned(_)) => {
                            match std::mem::replace(&mut slots[operand as usize], Slot::Empty) {
                                Slot::Owned(value) => Some(value),
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    let operands: Vec<ValueRef<'_>> =
                        instruction.operands.iter().filter_map(|&o| slots[o as usize].get()).collect();
                    let slot = match (dying, destination) {
                        (Some(value), _) => Ok(Slot::Owned(value.reshaped(&kernels::to_usize(&out_ty.dims)))),
                        (None, Some((k, destination))) => {
                            written[k] = true;
                            kernels::execute_into(&instruction.op, &operands, out_ty, destination, helpers)
                                .map(Slot::Borrowed)
                        }
                        // A product writes every element: into a spare array.
                        (None, None) if kernels::product_into_spare(&instruction.op, out_ty) => {
                            let spare = self.spare_f32(elements(out_ty));
                            kernels::execute_into_spare(&instruction.op, &operands, out_ty, spare, helpers)
                                .map(Slot::Owned)
                        }
                        (None, None) => kernels::execute(&instruction.op, &operands, out_ty, helpers).map(Slot::Owned),
                    };
                    let slot =
                        slot.map_err(|OutOfBounds(detail)| RunError::OutOfBounds { step: self.base + step, detail })?;
                    drop(operands);
                    slot
                };
                slots[b] = slot;
                open = Some(step);
            }
            for &r in &self.release_after[u] {
                if matches!(
                    program.buffers[r as usize].kind,
                    BufferKind::Intermediate { .. } | BufferKind::Input { .. }
                ) {
                    self.recycle(std::mem::replace(&mut slots[r as usize], Slot::Empty));
                }
            }
        }
        if let Some(k) = open {
            on_instruction.instruction(self.base + k, previous, ticks());
        }
        let mut outputs = Vec::with_capacity(program.outputs.len());
        for (k, io) in program.outputs.iter().enumerate() {
            let b = io.buffer as usize;
            let returned_again = program.outputs[k + 1..].iter().any(|o| o.buffer == io.buffer);
            let output = match std::mem::replace(&mut slots[b], Slot::Empty) {
                Slot::Borrowed(v) if written[k] => {
                    slots[b] = Slot::Borrowed(v.clone());
                    Output::Written(v)
                }
                Slot::Owned(v) if returned_again => {
                    let copy = v.clone();
                    slots[b] = Slot::Owned(v);
                    Output::Value(copy)
                }
                Slot::Owned(v) => Output::Value(v),
                Slot::Borrowed(v) => {
                    slots[b] = Slot::Borrowed(v.clone());
                    Output::Value(v.to_owned())
                }
                Slot::Empty => Output::Value(Value::zeros(&program.buffers[b].ty)),
            };
            outputs.push(output);
        }
        Ok(outputs)
    }
}

/// Combines `x` into `acc` element by element (`acc = acc op x`), both little-endian
/// arrays of `dtype`, with the arithmetic of the element-wise kernels (NaN propagates
/// through maximum and minimum; on `pred`, add is `or` and multiply is `and`).
pub(crate) fn combine_le_bytes(op: ReduceOp, dtype: DType, acc: &mut [u8], x: &[u8]) {
    if combine_in_place(op, dtype, acc, x) {
        return;
    }
    let ty = ArrayType::new(dtype, vec![acc.len() as u64 / dtype.size_bytes()]);
    let binary = match (op, dtype) {
        (ReduceOp::Add | ReduceOp::Maximum, DType::Pred) => BinaryOp::Or,
        (ReduceOp::Multiply | ReduceOp::Minimum, DType::Pred) => BinaryOp::And,
        (ReduceOp::Add, _) => BinaryOp::Add,
        (ReduceOp::Multiply, _) => BinaryOp::Multiply,
        (ReduceOp::Maximum, _) => BinaryOp::Maximum,
        (ReduceOp::Minimum, _) => BinaryOp::Minimum,
    };
    let (a, b) = (Value::from_le_bytes(&ty, acc), Value::from_le_bytes(&ty, x));
    match kernels::execute(&Op::Binary(binary), &[a.view(), b.view()], &ty, &HostPool::new(1)) {
        Ok(result) => result.write_le_bytes(acc),
        Err(_) => kernels::unvalidated("element-wise combine"),
    }
}

thread_local! {
    /// The device id `partition-id` gives to the programs this thread runs.
    static PARTITION: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` (an execution) as device `partition`: what its program's `partition-id`
/// instructions give, on this thread, which runs every instruction that is not a large
/// kernel's helper work.
pub(crate) fn as_partition<R>(partition: u32, f: impl FnOnce() -> R) -> R {
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            PARTITION.set(self.0);
        }
    }
    let _restore = Restore(PARTITION.replace(partition));
    f()
}

/// The device id of the execution running on this thread (0 outside [`as_partition`]).
fn partition() -> u32 {
    PARTITION.get()
}

/// `out = a (op) b` element-wise, in one pass where [`combine_le_bytes`] has a fast path
/// for the type and operation (else a copy, then the combine).
/// NaN and infinities among the little-endian `f32` values of `bytes`, 4-aligned.
pub(crate) fn non_finite_f32_le(bytes: &[u8]) -> u64 {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(values) if cfg!(target_endian = "little") => kernels::non_finite_f32(values),
        _ => bytes.chunks_exact(4).filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()).count() as u64,
    }
}

pub(crate) fn combine_le_bytes_into(op: ReduceOp, dtype: DType, out: &mut [u8], a: &[u8], b: &[u8]) {
    fn apply<T: bytemuck::Pod>(out: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) -> bool {
        let (Ok(out), Ok(a), Ok(b)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(out),
            bytemuck::try_cast_slice::<u8, T>(a),
            bytemuck::try_cast_slice::<u8, T>(b),
        ) else {
            return false;
        };
        out.iter_mut().zip(a).zip(b).for_each(|((o, &x), &y)| *o = f(x, y));
        true
    }
    let fused = !cfg!(target_endian = "big")
        && out.len() == a.len()
        && a.len() == b.len()
        && match (op, dtype) {
            (ReduceOp::Add, DType::F32) => apply::<f32>(out, a, b, |x, y| x + y),
            (ReduceOp::Multiply, DType::F32) => apply::<f32>(out, a, b, |x, y| x * y),
            (ReduceOp::Add, DType::S32 | DType::U32) => apply::<u32>(out, a, b, u32::wrapping_add),
            (ReduceOp::Multiply, DType::S32 | DType::U32) => apply::<u32>(out, a, b, u32::wrapping_mul),
            (ReduceOp::Add, DType::BF16) => apply::<half::bf16>(out, a, b, |x, y| widened(x, y, |x, y| x + y)),
            (ReduceOp::Multiply, DType::BF16) => apply::<half::bf16>(out, a, b, |x, y| widened(x, y, |x, y| x * y)),
            (ReduceOp::Add, DType::F16) => apply::<half::f16>(out, a, b, |x, y| widened(x, y, |x, y| x + y)),
            (ReduceOp::Multiply, DType::F16) => apply::<half::f16>(out, a, b, |x, y| widened(x, y, |x, y| x * y)),
            _ => false,
        };
    if !fused {
        out.copy_from_slice(a);
        combine_le_bytes(op, dtype, out, b);
    }
}

/// Sums and products of `f32`, `bf16`, `f16` and of wrapping 32-bit integers (what
/// collectives mostly reduce) combined where they lie, as the element-wise kernels
/// compute them (one IEEE operation per element, 16-bit floats through `f32`, no flush
/// of subnormals): the general path converts both buffers to values and back, three
/// full-size copies. `false` when the type, operation
/// or alignment is not one of these.
fn combine_in_place(op: ReduceOp, dtype: DType, acc: &mut [u8], x: &[u8]) -> bool {
    fn apply<T: bytemuck::Pod>(acc: &mut [u8], x: &[u8], f: impl Fn(T, T) -> T) -> bool {
        let (Ok(acc), Ok(x)) = (bytemuck::try_cast_slice_mut::<u8, T>(acc), bytemuck::try_cast_slice::<u8, T>(x))
        else {
            return false;
        };
        acc.iter_mut().zip(x).for_each(|(a, &b)| *a = f(*a, b));
        true
    }
    if cfg!(target_endian = "big") || acc.len() != x.len() {
        return false;
    }
    match (op, dtype) {
        (ReduceOp::Add, DType::F32) => apply::<f32>(acc, x, |a, b| a + b),
        (ReduceOp::Multiply, DType::F32) => apply::<f32>(acc, x, |a, b| a * b),
        (ReduceOp::Add, DType::S32 | DType::U32) => apply::<u32>(acc, x, u32::wrapping_add),
        (ReduceOp::Multiply, DType::S32 | DType::U32) => apply::<u32>(acc, x, u32::wrapping_mul),
        (ReduceOp::Add, DType::BF16) => apply::<half::bf16>(acc, x, |x, y| widened(x, y, |x, y| x + y)),
        (ReduceOp::Multiply, DType::BF16) => apply::<half::bf16>(acc, x, |x, y| widened(x, y, |x, y| x * y)),
        (ReduceOp::Add, DType::F16) => apply::<half::f16>(acc, x, |x, y| widened(x, y, |x, y| x + y)),
        (ReduceOp::Multiply, DType::F16) => apply::<half::f16>(acc, x, |x, y| widened(x, y, |x, y| x * y)),
        _ => false,
    }
}

/// A 16-bit float operation as the kernels compute it: widened to `f32`, then rounded
/// to nearest even.
#[inline(always)]
fn widened<T: element::Element>(x: T, y: T, f: impl Fn(f32, f32) -> f32) -> T {
    T::from_f32(f(x.to_f32(), y.to_f32()))
}

/// Evaluates one instruction on known operand values exactly as an execution would,
/// on the calling thread: the compiler's constant folding. `None` when the execution
/// would fail (an index out of bounds), so that the failure is left to the execution.
pub(crate) fn evaluate(op: &Op, operands: &[ValueRef<'_>], out: &ArrayType) -> Option<Value> {
    kernels::execute(op, operands, out, &HostPool::new(1)).ok()
}

/// Splits the tick interval `start..end` into consecutive pieces in proportion to
/// `shares` (equal pieces when no share was measured).
fn split_interval(start: u64, end: u64, shares: &[u64]) -> Vec<(u64, u64)> {
    let span = u128::from(end.saturating_sub(start));
    let total: u128 = shares.iter().map(|&s| u128::from(s)).sum();
    let mut pieces = Vec::with_capacity(shares.len());
    let mut at = start;
    let mut sum = 0u128;
    for (k, &share) in shares.iter().enumerate() {
        sum += if total == 0 { 1 } else { u128::from(share) };
        let whole = if total == 0 { shares.len() as u128 } else { total };
        let next = if k + 1 == shares.len() { end } else { start + (span * sum / whole) as u64 };
        pieces.push((at, next));
        at = next;
    }
    pieces
}

#[cfg(test)]
mod tests;
