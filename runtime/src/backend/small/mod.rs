//! Small loops: a `while` whose condition and body hold only small values runs on
//! arrays kept from one iteration to the next.
//!
//! A small loop's iteration is a few element-wise operations and a reduction on tens
//! of elements: a microsecond of a general run goes to building the run's buffer
//! table, allocating every result and looking up its kernel, where the arithmetic
//! takes a tenth of that. Here each nested program gets, once per execution, a flat
//! array for every buffer it has (constants already in place), and each instruction
//! writes its result into its array with a flat kernel (`kernels::execute_flat`, the
//! array kernels' bits; an f32 product through `kernels::matmul_flat`); an instruction
//! without one runs its array kernel on views of the arrays, and its result takes its
//! array's place. The loop state moves between the programs' input arrays and the
//! state by swapping arrays, never copying, except where a body returns a constant, a
//! value computed once or one buffer twice. The arrays are kept for the loop's next
//! execution.
//! Instructions that only lay out constants (a constant's broadcast, an iota) run once,
//! when the loop is prepared; the trace shows them at each iteration, taking no time,
//! so that an iteration's instructions stay one run of the device ring's records.
//!
//! What the trace shows is what a general run reports: each instruction of the
//! condition and the body with its own interval, inside one interval per iteration of
//! the loop instruction. Reading the clock (about 10 ns on a virtual machine) after
//! every instruction would cost a third of an iteration, so it is read after each
//! instruction only in the first two iterations and every [`TIMED_EVERY`]th. The
//! iterations between run their steps as `fast` plans them, without the clock; when it
//! is next read (at the next timed iteration, or when the loop ends), the interval since
//! is split evenly between them, and each iteration's between its instructions in
//! proportion to the times last measured, as a fused group's interval is split. They
//! are reported to the observer in one call.

use std::sync::{Mutex, PoisonError};

use neuron_datastore::InstructionSpan;
use neuron_datastore::clock::ticks;

use super::element::{Element, with_element};
use super::kernels::{self, Flat, FlatMut, Prepared};
use super::{Executable, InstructionObserver, OutOfBounds, RunError, Value, ValueRef};
use crate::dtype::ArrayType;
use crate::isa::{BufferKind, Op, ScatterCombine};
use crate::pool::HostPool;

mod fast;
mod windows;

/// The most elements a value of a small loop may have.
const MAX_ELEMENTS: u64 = 1 << 14;

/// The most bytes the arrays of a small loop's two programs may take together (each
/// execution at once has a set, kept until the model is unloaded).
const MAX_BYTES: u64 = 4 << 20;

/// Every how many iterations each instruction's time is measured (a timed iteration
/// takes about twice as long as an untimed one).
const TIMED_EVERY: usize = 32;

/// The precision of the shares an untimed iteration's interval is split by.
const SHARE_BITS: u32 = 20;

/// The most sets of arrays kept for later executions (one per execution at once).
const MAX_KEPT: usize = 4;

/// A loop prepared to run on kept arrays.
#[derive(Debug)]
pub(super) struct SmallLoop {
    condition: Compact,
    body: Compact,
    /// The arrays of earlier executions: the condition's and the body's.
    kept: Mutex<Vec<[Vec<Data>; 2]>>,
}

/// A nested program as a list of instructions on numbered arrays.
#[derive(Debug)]
struct Compact {
    /// Each buffer's array before a run: a constant's value, zeros for the others.
    arrays: Vec<Data>,
    /// Each buffer's shape.
    shapes: Vec<Vec<usize>>,
    steps: Vec<Step>,
    /// The calls an untimed iteration makes to run the steps.
    fast: Vec<fast::Fast>,
    /// Each step's entry in the trace table.
    entries: Vec<usize>,
    inputs: Vec<usize>,
    /// For each output: its buffer, and whether it must be copied out (a constant, a
    /// value computed once, or a buffer returned twice) rather than swapped out.
    outputs: Vec<(usize, bool)>,
}

#[derive(Debug)]
struct Step {
    op: Op,
    operands: Vec<usize>,
    output: usize,
    ty: ArrayType,
    /// The instruction's entry in the trace table.
    entry: usize,
    /// Whether its result was computed when the loop was prepared.
    hoisted: bool,
    /// For a dynamic update whose first operand dies here (read by no later
    /// instruction, not an output, not a constant): the operand's row-major strides,
    /// and the update writes into the operand's array in place.
    in_place: Option<Vec<usize>>,
    /// For a dynamic slice: the operand's row-major strides, to copy the slice's rows.
    sliced: Option<Vec<usize>>,
    /// For a scatter of one element into a vector whose operand dies here (as for
    /// `in_place`): the element is written into the operand's array in place.
    scatters_one: bool,
    /// The kernel chosen when the loop was prepared, and its two operands.
    prepared: Option<(Prepared, [usize; 2])>,
}

/// The most dimensions of an array a dynamic update writes in place.
const MAX_IN_PLACE_RANK: usize = 8;

impl SmallLoop {
    /// The loop of `condition` and `body` prepared as a small loop; `None` when a value
    /// or all of them are too large, or an instruction runs nested programs, writes
    /// several results or is a collective.
    pub(super) fn new(condition: &Executable, body: &Executable) -> Option<SmallLoop> {
        let bytes =
            |e: &Executable| e.program.buffers.iter().map(|b| b.ty.size_bytes().unwrap_or(u64::MAX)).sum::<u64>();
        if bytes(condition).saturating_add(bytes(body)) > MAX_BYTES {
            return None;
        }
        let (condition, body) = (Compact::new(condition, true)?, Compact::new(body, false)?);
        Some(SmallLoop { condition, body, kept: Mutex::new(Vec::new()) })
    }

    /// Runs the loop on `operands`, reporting every instruction and each iteration
    /// (as entry `index`) to `on_instruction`; its final state.
    pub(super) fn run(
        &self,
        index: usize,
        operands: &[ValueRef<'_>],
        deadline_ticks: u64,
        helpers: &HostPool,
        on_instruction: &mut InstructionObserver<'_>,
    ) -> Result<Vec<Value>, RunError> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let [mut condition, mut body] =
            kept.unwrap_or_else(|| [self.condition.arrays.clone(), self.body.arrays.clone()]);
        let result =
            self.iterate(index, operands, [&mut condition, &mut body], deadline_ticks, helpers, on_instruction);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < MAX_KEPT {
            kept.push([condition, body]);
        }
        result
    }

    fn iterate(
        &self,
        index: usize,
        operands: &[ValueRef<'_>],
        [condition, body]: [&mut Vec<Data>; 2],
        deadline_ticks: u64,
        helpers: &HostPool,
        on_instruction: &mut InstructionObserver<'_>,
    ) -> Result<Vec<Value>, RunError> {
        let mut state: Vec<Data> = operands.iter().map(|v| Data::from(standard(v))).collect();
        let entries = self.condition.entries.iter().chain(&self.body.entries).copied().collect();
        let mut report = Iterations::new(index, entries);
        // Each iteration starts where the one before ended; untimed ones since `start`
        // are reported when the clock is next read.
        let mut start = ticks();
        for iteration in 0.. {
            let timed = iteration < 2 || iteration % TIMED_EVERY == 0;
            // The deadline is checked when the clock is read: at least every
            // `TIMED_EVERY` iterations.
            if timed {
                start = report.flush(start, None, on_instruction);
                if start > deadline_ticks {
                    return Err(RunError::DeadlineExceeded { step: index });
                }
            }
            self.condition.enter(condition, &mut state);
            // An untimed run has no end of its own: `start` stands in, unused.
            let ran = match timed {
                true => self.condition.run_timed(condition, start, report.timed(0), helpers),
                false => self.condition.run_fast(condition, helpers).map(|()| start),
            };
            let go = ran.map(|end| (end, self.condition.verdict(condition)));
            // The same swaps again give the state back.
            self.condition.enter(condition, &mut state);
            let (end, go) = match go {
                Ok(went) => went,
                Err(error) => return Err(report.failed(start, (&self.condition, 0), error, on_instruction)),
            };
            if !go {
                match timed {
                    true => report.send_timed(start, end, on_instruction),
                    false => _ = report.flush(start, Some(Last::Ended(self.condition.steps.len())), on_instruction),
                }
                let shapes = self.body.inputs.iter().map(|&b| &self.body.shapes[b]);
                return Ok(state.into_iter().zip(shapes).map(|(data, shape)| data.into_value(shape)).collect());
            }
            self.body.enter(body, &mut state);
            let ran = match timed {
                true => self.body.run_timed(body, end, report.timed(self.condition.steps.len()), helpers),
                false => self.body.run_fast(body, helpers).map(|()| start),
            };
            let end = match ran {
                Ok(end) => end,
                Err(error) => {
                    let body = (&self.body, self.condition.steps.len());
                    return Err(report.failed(start, body, error, on_instruction));
                }
            };
            self.body.leave(body, &mut state);
            if timed {
                report.send_timed(start, end, on_instruction);
                report.measured(start, end);
                start = end;
            } else {
                report.pending += 1;
            }
        }
        unreachable!("a loop ends by returning")
    }
}

/// How the last iteration a flush reports ended, when it did not run whole.
#[derive(Debug, Clone, Copy)]
enum Last {
    /// The condition, of this many instructions, ended the loop.
    Ended(usize),
    /// The instruction after this many of the iteration's failed.
    Failed(usize),
}

/// Where a timed run notes its instructions' ends and intervals.
struct Timed<'u> {
    ends: &'u mut [u64],
    spans: &'u mut Vec<InstructionSpan>,
}

/// What a small loop reports of its iterations. A timed iteration's intervals go in
/// one call when it ends. Untimed ones are reported when the clock is next read: the
/// interval since the last read split evenly between them, and each iteration's
/// between its instructions by the shares the last timed iteration measured.
struct Iterations {
    /// The loop instruction's entry in the trace table.
    index: usize,
    /// The condition's and then the body's entries.
    entries: Vec<usize>,
    /// Each instruction's end in the last timed iteration, as a share of the
    /// iteration in 1/2^[`SHARE_BITS`].
    shares: Vec<u64>,
    /// Room for an iteration's ends (a timed one's, measured) or its instructions'
    /// offsets from its start (split, in the others).
    ends: Vec<u64>,
    /// Iterations run since the clock was last read.
    pending: u64,
    /// Room for the intervals of the pending iterations, or of a timed one.
    spans: Vec<InstructionSpan>,
}

impl Iterations {
    /// For loop entry `index`, whose condition's and then body's instructions have
    /// trace `entries`.
    fn new(index: usize, entries: Vec<usize>) -> Iterations {
        let n = entries.len();
        // Room for the most iterations one flush reports.
        let spans = Vec::with_capacity(TIMED_EVERY * (n + 1));
        Iterations { index, entries, shares: vec![0; n], ends: vec![0; n], pending: 0, spans }
    }

    /// Where a timed run of the program whose instructions start at `first` among
    /// the iteration's writes its instructions' ends and intervals.
    fn timed(&mut self, first: usize) -> Timed<'_> {
        Timed { ends: &mut self.ends[first..], spans: &mut self.spans }
    }

    /// Reports a timed iteration's intervals and its own, from `start` to `end`.
    fn send_timed(&mut self, start: u64, end: u64, on_instruction: &mut InstructionObserver<'_>) {
        self.spans.push(InstructionSpan { entry: self.index as u32, start, end });
        on_instruction.spans(&self.spans);
        self.spans.clear();
    }

    /// Reports the iterations since `start` and what ran of the one that failed with
    /// `error` in `program`, whose instructions start at `first` among the iteration's:
    /// a timed iteration's intervals as measured, an untimed one's finished
    /// instructions as a last partial iteration. The error.
    fn failed(
        &mut self,
        start: u64,
        (program, first): (&Compact, usize),
        error: RunError,
        on_instruction: &mut InstructionObserver<'_>,
    ) -> RunError {
        if self.spans.is_empty() {
            let position = match &error {
                RunError::OutOfBounds { step, .. } => program.entries.iter().position(|e| e == step),
                _ => None,
            };
            self.flush(start, Some(Last::Failed(first + position.unwrap_or(0))), on_instruction);
        } else {
            on_instruction.spans(&self.spans);
            self.spans.clear();
        }
        error
    }

    /// Takes the shares of each instruction's end from a timed iteration that ran
    /// from `start` to `end`, whose ends are in `self.ends`.
    fn measured(&mut self, start: u64, end: u64) {
        let total = end.saturating_sub(start).max(1);
        for (share, &at) in self.shares.iter_mut().zip(&self.ends) {
            *share = ((u128::from(at.saturating_sub(start)) << SHARE_BITS) / u128::from(total)) as u64;
        }
    }

    /// Reads the clock and reports the pending iterations between `start` and now,
    /// then the `last` one when it did not run whole; the tick read (`start` when there
    /// was nothing to report).
    fn flush(&mut self, start: u64, last: Option<Last>, on_instruction: &mut InstructionObserver<'_>) -> u64 {
        if self.pending == 0 && last.is_none() {
            return start;
        }
        let now = ticks();
        self.report(start, now, last, on_instruction);
        now
    }

    /// Reports the pending iterations as having run between `start` and `now` (see
    /// [`Iterations::flush`]).
    fn report(&mut self, start: u64, now: u64, last: Option<Last>, on_instruction: &mut InstructionObserver<'_>) {
        let whole = 1u64 << SHARE_BITS;
        // A last iteration of its first instructions only weighs what they took of a
        // whole one.
        let ran = last.map(|last| match last {
            Last::Ended(n) | Last::Failed(n) => n.min(self.entries.len()),
        });
        let partial = ran.map(|n| n.checked_sub(1).map_or(1, |i| self.shares[i].clamp(1, whole)));
        let weight = (self.pending * whole + partial.unwrap_or(0)).max(1);
        // Ticks per unit of weight; the last iteration ends now.
        let scale = now.saturating_sub(start) as f64 / weight as f64;
        let at = |w: u64| if w >= weight { now } else { (start + (w as f64 * scale + 0.5) as u64).min(now) };
        for k in 0..=self.pending {
            let (from, until, n) = match (k < self.pending, ran) {
                (true, _) => (at(k * whole), at((k + 1) * whole), self.entries.len()),
                (false, Some(n)) => (at(k * whole), now, n),
                (false, None) => break,
            };
            // The instructions' ends by their shares of a whole iteration (the last of
            // them ending with it), each instruction starting where the one before
            // ended. The whole iterations of one flush differ in length by a tick at
            // most: their offsets are computed once.
            let length = until - from;
            if k == 0 || k == self.pending {
                let full = match partial {
                    Some(partial) if k == self.pending => (length as f64 * whole as f64 / partial as f64) as u64,
                    _ => length,
                };
                for (&share, offset) in self.shares.iter().zip(&mut self.ends) {
                    *offset = ((u128::from(full) * u128::from(share)) >> SHARE_BITS) as u64;
                }
            }
            let mut previous = from;
            for (i, (&entry, &offset)) in self.entries[..n].iter().zip(&self.ends).enumerate() {
                let end = if i + 1 < n { (from + offset).min(until) } else { until };
                self.spans.push(InstructionSpan { entry: entry as u32, start: previous, end });
                previous = end;
            }
            // An iteration that failed has no interval of its own, as in a general run.
            if k < self.pending || !matches!(last, Some(Last::Failed(_))) {
                self.spans.push(InstructionSpan { entry: self.index as u32, start: from, end: until });
            }
        }
        on_instruction.spans(&self.spans);
        self.spans.clear();
        self.pending = 0;
    }
}

impl Compact {
    /// `program` prepared; a `condition` keeps its inputs' arrays, which go back to
    /// the state after each run.
    fn new(program: &Executable, condition: bool) -> Option<Compact> {
        let p = &program.program;
        let small = p.buffers.iter().all(|b| b.ty.dims.iter().product::<u64>() <= MAX_ELEMENTS);
        if !small || program.nested.iter().any(|n| !n.is_empty()) {
            return None;
        }
        let mut arrays: Vec<Data> = p
            .buffers
            .iter()
            .map(|b| match b.kind {
                BufferKind::Constant { index } => {
                    program.constant_slot(index as usize, &b.ty).get().map(|v| standard(&v))
                }
                _ => Some(Value::zeros(&b.ty)),
            })
            .map(|v| Data::from(v.unwrap_or_else(|| kernels::unvalidated("a constant without its data"))))
            .collect();
        let shapes: Vec<Vec<usize>> = p.buffers.iter().map(|b| kernels::to_usize(&b.ty.dims)).collect();
        // Constants laid out anew (a constant's broadcast, an iota) are the same at
        // every iteration: computed here, once.
        let mut fixed: Vec<bool> = p.buffers.iter().map(|b| matches!(b.kind, BufferKind::Constant { .. })).collect();
        let mut steps = Vec::with_capacity(program.order.len());
        for (k, &(s, i)) in program.order.iter().enumerate() {
            let instruction = &p.streams[s].instructions[i];
            if instruction.op.result_count() != 1 || matches!(instruction.op, Op::Collective(_)) {
                return None;
            }
            let output = instruction.output as usize;
            let step = Step {
                op: instruction.op.clone(),
                operands: instruction.operands.iter().map(|&o| o as usize).collect(),
                output,
                ty: p.buffers[output].ty.clone(),
                entry: program.base + k,
                hoisted: false,
                in_place: None,
                sliced: None,
                scatters_one: false,
                prepared: None,
            };
            let layout = matches!(step.op, Op::Broadcast { .. } | Op::Iota { .. } | Op::Reshape | Op::Copy);
            let hoisted = layout
                && step.operands.iter().all(|&b| fixed[b])
                && step.run(&mut arrays, &shapes, &HostPool::new(1)).is_ok();
            fixed[output] = hoisted;
            let prepared = match step.operands[..] {
                [a, b] => {
                    let ty = |b: usize| p.buffers[b].ty.dtype;
                    let out = shapes[output].iter().product::<usize>();
                    Prepared::new(&step.op, [ty(a), ty(b)], [&shapes[a], &shapes[b]], step.ty.dtype, out)
                        .map(|k| (k, [a, b]))
                }
                _ => None,
            };
            let sliced = match (&step.op, step.operands.first()) {
                (Op::DynamicSlice { .. }, Some(&a)) if (1..=MAX_IN_PLACE_RANK).contains(&shapes[a].len()) => {
                    Some(kernels::row_major_strides(&shapes[a]))
                }
                _ => None,
            };
            steps.push(Step { hoisted, prepared, sliced, ..step });
        }
        // A dynamic update of an array no later instruction reads (a scan's outputs, row
        // by row) updates it in place instead of copying it whole.
        for k in 0..steps.len() {
            let Some((&operand, rest)) = steps[k].operands.split_first() else { continue };
            let read_later = rest.contains(&operand) || steps[k + 1..].iter().any(|s| s.operands.contains(&operand));
            let returned = p.outputs.iter().any(|o| o.buffer as usize == operand);
            let state = condition && matches!(p.buffers[operand].kind, BufferKind::Input { .. });
            let dies = !read_later && !returned && !state && !fixed[operand];
            let rank = shapes[operand].len();
            match &steps[k].op {
                Op::DynamicUpdateSlice if dies && (1..=MAX_IN_PLACE_RANK).contains(&rank) => {
                    steps[k].in_place = Some(kernels::row_major_strides(&shapes[operand]));
                }
                Op::Scatter { dims, combine: ScatterCombine::Replace } if dies && rank == 1 => {
                    steps[k].scatters_one = windows::one_element(dims, &steps[k].operands, &shapes);
                }
                _ => {}
            }
        }
        let inputs = p.inputs.iter().map(|io| io.buffer as usize).collect();
        let outputs = p
            .outputs
            .iter()
            .map(|io| {
                let b = io.buffer as usize;
                // An input returned as it is (a weight carried through a scan) is swapped
                // out too: `enter` swaps the next state into its array before anything
                // reads it.
                let swapped = match p.buffers[b].kind {
                    BufferKind::Intermediate { .. } => !fixed[b],
                    BufferKind::Input { .. } => true,
                    BufferKind::Constant { .. } => false,
                };
                (b, !swapped || p.outputs.iter().filter(|o| o.buffer == io.buffer).count() > 1)
            })
            .collect();
        let entries = steps.iter().map(|s| s.entry).collect();
        let types: Vec<_> = p.buffers.iter().map(|b| b.ty.dtype).collect();
        let fast = fast::plan(&steps, &shapes, &types);
        Some(Compact { arrays, shapes, steps, fast, entries, inputs, outputs })
    }

    /// Swaps the state into the input arrays (or back out of them).
    fn enter(&self, arrays: &mut [Data], state: &mut [Data]) {
        for (&b, value) in self.inputs.iter().zip(state) {
            std::mem::swap(&mut arrays[b], value);
        }
    }

    /// Moves the outputs into the state, whose arrays (the inputs' arrays of the run,
    /// swapped out by `enter`) take their place.
    fn leave(&self, arrays: &mut [Data], state: &mut [Data]) {
        for (&(b, copied), value) in self.outputs.iter().zip(state) {
            if copied {
                value.copy_from(&arrays[b]);
            } else {
                std::mem::swap(&mut arrays[b], value);
            }
        }
    }

    /// The condition's `pred[]` result.
    fn verdict(&self, arrays: &[Data]) -> bool {
        match self.outputs.first().map(|&(b, _)| &arrays[b]) {
            Some(Data::Pred(p)) => p.first().copied().unwrap_or(false),
            _ => kernels::unvalidated("a loop condition that is not pred[]"),
        }
    }

    /// Runs every instruction without reading the clock (see `fast`).
    fn run_fast(&self, arrays: &mut [Data], helpers: &HostPool) -> Result<(), RunError> {
        fast::run(&self.fast, &self.steps, arrays, &self.shapes, helpers)
    }

    /// Runs every instruction one by one, the first starting at `start`, noting each
    /// one's interval and end in `timed`; the tick the last one ended.
    fn run_timed(
        &self,
        arrays: &mut [Data],
        start: u64,
        timed: Timed<'_>,
        helpers: &HostPool,
    ) -> Result<u64, RunError> {
        let mut previous = start;
        for (step, end) in self.steps.iter().zip(timed.ends) {
            if !step.hoisted {
                step.execute(arrays, &self.shapes, helpers)?;
            }
            let now = if step.hoisted { previous } else { ticks() };
            timed.spans.push(InstructionSpan { entry: step.entry as u32, start: previous, end: now });
            *end = now;
            previous = now;
        }
        Ok(previous)
    }
}

impl Step {
    /// Whether the step writes into its operand's array or copies rows (see
    /// `in_place`, `sliced` and `scatters_one`), which only `run` knows how to do.
    fn special(&self) -> bool {
        self.in_place.is_some() || self.sliced.is_some() || self.scatters_one
    }

    /// [`Step::run`], an error naming the step's trace entry.
    fn execute(&self, arrays: &mut [Data], shapes: &[Vec<usize>], helpers: &HostPool) -> Result<(), RunError> {
        self.run(arrays, shapes, helpers)
            .map_err(|OutOfBounds(detail)| RunError::OutOfBounds { step: self.entry, detail })
    }

    fn run(&self, arrays: &mut [Data], shapes: &[Vec<usize>], helpers: &HostPool) -> Result<(), OutOfBounds> {
        if let Some(strides) = &self.in_place
            && self.update_in_place(arrays, shapes, strides)
        {
            return Ok(());
        }
        if let Some(strides) = &self.sliced
            && self.slice_rows(arrays, shapes, strides)
        {
            return Ok(());
        }
        if self.scatters_one && self.scatter_in_place(arrays) {
            return Ok(());
        }
        let (before, rest) = arrays.split_at_mut(self.output);
        let Some((out, after)) = rest.split_first_mut() else { kernels::unvalidated("an output") };
        // Validation keeps an instruction from reading the buffer it writes.
        let operand = |b: usize| if b < self.output { &before[b] } else { &after[b - self.output - 1] };
        if let Some((kernel, [a, b])) = self.prepared
            && let (Some(x), Some(y), Some(o)) = (operand(a).flat(), operand(b).flat(), out.flat_mut())
            && kernel.run(x, y, o)
        {
            return Ok(());
        }
        let mut flats = [Flat::F32(&[]); 4];
        let flat = self.operands.len() <= flats.len()
            && self.operands.iter().zip(&mut flats).all(|(&b, f)| operand(b).flat().map(|v| *f = v).is_some());
        if flat
            && let Some(written) = out.flat_mut()
            && let Some(&first) = self.operands.first()
            && kernels::execute_flat(&self.op, &flats[..self.operands.len()], &shapes[first], written)
        {
            return Ok(());
        }
        let views: Vec<ValueRef<'_>> = self.operands.iter().map(|&b| operand(b).view(&shapes[b])).collect();
        // A product of f32 operands is computed into its array too.
        if let (Op::MatMul(d), [ValueRef::F32(l), ValueRef::F32(r)], Data::F32(product)) =
            (&self.op, views.as_slice(), &mut *out)
        {
            kernels::matmul_flat(l, r, d, product, &shapes[self.output], helpers);
            return Ok(());
        }
        let value = kernels::execute(&self.op, &views, &self.ty, helpers)?;
        *out = Data::from(value);
        Ok(())
    }
}

/// A buffer's array: flat for the types the flat kernels take, an array otherwise.
#[derive(Debug, Clone)]
enum Data {
    F32(Vec<f32>),
    S32(Vec<i32>),
    Pred(Vec<bool>),
    /// Boxed: the state moves by swapping arrays, which a whole array value would make
    /// four times as long.
    Other(Box<Value>),
}

impl From<Value> for Data {
    /// `value`'s elements in row-major order: its own memory where it is laid out so.
    fn from(value: Value) -> Data {
        fn elements<T: Clone>(a: ndarray::ArrayD<T>) -> Vec<T> {
            if !a.is_standard_layout() {
                return a.iter().cloned().collect();
            }
            let n = a.len();
            let (mut v, offset) = a.into_raw_vec_and_offset();
            let offset = offset.unwrap_or(0);
            // Standard layout: the elements are contiguous from the offset.
            if offset != 0 || v.len() != n {
                v = v[offset..offset + n].to_vec();
            }
            v
        }
        match value {
            Value::F32(a) => Data::F32(elements(a)),
            Value::S32(a) => Data::S32(elements(a)),
            Value::Pred(a) => Data::Pred(elements(a)),
            other => Data::Other(Box::new(other)),
        }
    }
}

impl Data {
    fn flat(&self) -> Option<Flat<'_>> {
        match self {
            Data::F32(v) => Some(Flat::F32(v)),
            Data::S32(v) => Some(Flat::S32(v)),
            Data::Pred(v) => Some(Flat::Pred(v)),
            Data::Other(_) => None,
        }
    }

    fn flat_mut(&mut self) -> Option<FlatMut<'_>> {
        match self {
            Data::F32(v) => Some(FlatMut::F32(v)),
            Data::S32(v) => Some(FlatMut::S32(v)),
            Data::Pred(v) => Some(FlatMut::Pred(v)),
            Data::Other(_) => None,
        }
    }

    /// A view of the array, of `shape`.
    fn view(&self, shape: &[usize]) -> ValueRef<'_> {
        fn of<'a, T>(v: &'a [T], shape: &[usize]) -> ndarray::ArrayViewD<'a, T> {
            ndarray::ArrayViewD::from_shape(ndarray::IxDyn(shape), v).unwrap_or_else(|_| kernels::unvalidated("shape"))
        }
        match self {
            Data::F32(v) => ValueRef::F32(of(v, shape)),
            Data::S32(v) => ValueRef::S32(of(v, shape)),
            Data::Pred(v) => ValueRef::Pred(of(v, shape)),
            Data::Other(value) => value.view(),
        }
    }

    /// The array as a value of `shape`.
    fn into_value(self, shape: &[usize]) -> Value {
        fn of<T>(v: Vec<T>, shape: &[usize]) -> ndarray::ArrayD<T> {
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).unwrap_or_else(|_| kernels::unvalidated("shape"))
        }
        match self {
            Data::F32(v) => Value::F32(of(v, shape)),
            Data::S32(v) => Value::S32(of(v, shape)),
            Data::Pred(v) => Value::Pred(of(v, shape)),
            Data::Other(value) => *value,
        }
    }

    /// Copies `from`, an array of the same type and size, in place where both are flat.
    fn copy_from(&mut self, from: &Data) {
        match (&mut *self, from) {
            (Data::F32(to), Data::F32(from)) if to.len() == from.len() => to.copy_from_slice(from),
            (Data::S32(to), Data::S32(from)) if to.len() == from.len() => to.copy_from_slice(from),
            (Data::Pred(to), Data::Pred(from)) if to.len() == from.len() => to.copy_from_slice(from),
            _ => *self = from.clone(),
        }
    }
}

/// A copy of `v` in standard (row-major, contiguous) layout.
fn standard(v: &ValueRef<'_>) -> Value {
    with_element!(v.dtype(), T => T::wrap(kernels::arr::<T>(v).as_standard_layout().into_owned()))
}

#[cfg(test)]
mod tests;
