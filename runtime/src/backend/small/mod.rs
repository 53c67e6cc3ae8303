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
//! the loop instruction. Reading the clock after every instruction would cost a third
//! of an iteration, so it is read after each instruction only in the first iterations
//! and every [`TIMED_EVERY`]th; the other iterations read it once per program and split
//! that interval between the instructions in proportion to the times last measured, as
//! a fused group's interval is split.

use std::sync::{Mutex, PoisonError};

use neuron_datastore::clock::ticks;

use super::element::{Element, with_element};
use super::kernels::{self, Flat, FlatMut, Prepared};
use super::{Executable, InstructionObserver, OutOfBounds, RunError, Value, ValueRef};
use crate::dtype::ArrayType;
use crate::isa::{BufferKind, Op, ScatterCombine};
use crate::pool::HostPool;

mod windows;

/// The most elements a value of a small loop may have.
const MAX_ELEMENTS: u64 = 1 << 14;

/// The most bytes the arrays of a small loop's two programs may take together (each
/// execution at once has a set, kept until the model is unloaded).
const MAX_BYTES: u64 = 4 << 20;

/// Every how many iterations each instruction's time is measured.
const TIMED_EVERY: usize = 16;

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
    /// Each step's entry in the trace table.
    entries: Vec<usize>,
    inputs: Vec<usize>,
    /// For each output: its buffer, and whether it must be copied out (a constant, a
    /// value computed once, or a buffer returned twice) rather than swapped out.
    outputs: Vec<(usize, bool)>,
}

/// Where a program's run starts, whether each of its instructions is timed, who sees
/// the intervals, and room for the ends of an untimed run's intervals (one per step).
struct Clock<'o, 'p> {
    start: u64,
    timed: bool,
    on_instruction: &'o mut InstructionObserver<'p>,
    ends: &'o mut [u64],
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
        // Where each instruction's time last ended, as a share of its program's.
        let mut times = [vec![0; self.condition.steps.len()], vec![0; self.body.steps.len()]];
        let mut ends = times.clone();
        // Each iteration starts where the one before ended.
        let mut start = ticks();
        for iteration in 0.. {
            if start > deadline_ticks {
                return Err(RunError::DeadlineExceeded { step: index });
            }
            let timed = iteration < 2 || iteration % TIMED_EVERY == 0;
            let clock = Clock { start, timed, on_instruction: &mut *on_instruction, ends: &mut ends[0] };
            self.condition.enter(condition, &mut state);
            let verdict = self.condition.run(condition, clock, &mut times[0], helpers);
            let go = verdict.map(|end| (end, self.condition.verdict(condition)));
            // The same swaps again give the state back.
            self.condition.enter(condition, &mut state);
            let (end, go) = go?;
            if !go {
                on_instruction.instruction(index, start, end);
                let shapes = self.body.inputs.iter().map(|&b| &self.body.shapes[b]);
                return Ok(state.into_iter().zip(shapes).map(|(data, shape)| data.into_value(shape)).collect());
            }
            self.body.enter(body, &mut state);
            let clock = Clock { start: end, timed, on_instruction: &mut *on_instruction, ends: &mut ends[1] };
            let end = self.body.run(body, clock, &mut times[1], helpers)?;
            self.body.leave(body, &mut state);
            on_instruction.instruction(index, start, end);
            start = end;
        }
        unreachable!("a loop ends by returning")
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
        Some(Compact { arrays, shapes, steps, entries, inputs, outputs })
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

    /// Runs every instruction, the first starting at `clock.start`, and reports each
    /// one's interval: measured when `clock.timed`, else the run's interval split by
    /// `shares`, where a timed run leaves the end of each instruction's share of the
    /// run, in 1/2^[`SHARE_BITS`]. The tick the last one ended.
    fn run(
        &self,
        arrays: &mut [Data],
        clock: Clock<'_, '_>,
        shares: &mut [u64],
        helpers: &HostPool,
    ) -> Result<u64, RunError> {
        let Clock { start, timed, on_instruction, ends } = clock;
        let mut previous = start;
        for (step, share) in self.steps.iter().zip(shares.iter_mut()) {
            if step.hoisted {
                if timed {
                    on_instruction.instruction(step.entry, previous, previous);
                    *share = previous - start;
                }
                continue;
            }
            step.run(arrays, &self.shapes, helpers)
                .map_err(|OutOfBounds(detail)| RunError::OutOfBounds { step: step.entry, detail })?;
            if timed {
                let now = ticks();
                on_instruction.instruction(step.entry, previous, now);
                *share = now - start;
                previous = now;
            }
        }
        if timed {
            let total = (previous - start).max(1);
            shares.iter_mut().for_each(|share| *share = (*share << SHARE_BITS) / total);
            return Ok(previous);
        }
        let end = ticks();
        let span = end.saturating_sub(start);
        for (k, (&share, at)) in shares.iter().zip(ends.iter_mut()).enumerate() {
            *at = match span.checked_mul(share) {
                Some(product) if k + 1 < self.steps.len() => start + (product >> SHARE_BITS),
                _ => end,
            };
        }
        on_instruction.instructions(&self.entries, start, ends);
        Ok(end)
    }
}

impl Step {
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
mod tests {
    use super::super::{Input, Output};
    use super::*;
    use crate::compile::{Target, compile_hlo};
    use crate::dtype::DType;

    /// Data-dependent: damped updates until the sum of |x| falls below 1 or 300 steps.
    const DAMPED: &str = r#"
HloModule damped
body {
  state = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[64] get-tuple-element(state), index=1
  c = f32[] constant(0.97)
  bc = f32[64] broadcast(c), dimensions={}
  scaled = f32[64] multiply(x, bc)
  t = f32[64] tanh(x)
  d = f32[] constant(0.001)
  bd = f32[64] broadcast(d), dimensions={}
  dt = f32[64] multiply(t, bd)
  y = f32[64] subtract(scaled, dt)
  ROOT out = (s32[], f32[64]) tuple(next, y)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
cond {
  state = (s32[], f32[64]) parameter(0)
  x = f32[64] get-tuple-element(state), index=1
  ax = f32[64] abs(x)
  zero = f32[] constant(0)
  total = f32[] reduce(ax, zero), dimensions={0}, to_apply=add
  limit = f32[] constant(1)
  big = pred[] compare(total, limit), direction=GT
  i = s32[] get-tuple-element(state), index=0
  cap = s32[] constant(300)
  more = pred[] compare(i, cap), direction=LT
  ROOT go = pred[] and(big, more)
}
ENTRY main {
  zero = s32[] constant(0)
  x = f32[64] parameter(0)
  init = (s32[], f32[64]) tuple(zero, x)
  w = (s32[], f32[64]) while(init), condition=cond, body=body
  n = s32[] get-tuple-element(w), index=0
  y = f32[64] get-tuple-element(w), index=1
  ROOT r = (s32[], f32[64]) tuple(n, y)
}
"#;

    /// A `fori_loop` of a small matrix-vector product (a kernel prepared with the
    /// loop), with the matrix carried through unchanged, rows reduced along both axes,
    /// a select, conversions, a maximum that sees NaNs, and a reversal (no flat kernel:
    /// its array kernel runs on views).
    const MIXED: &str = r#"
HloModule mixed
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
sum {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
body {
  state = (s32[], f32[8,8], f32[8], s32[4]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  w = f32[8,8] get-tuple-element(state), index=1
  v = f32[8] get-tuple-element(state), index=2
  k = s32[4] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  p = f32[8] dot(w, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[8] exponential(p)
  zero = f32[] constant(0)
  bz = f32[8] broadcast(zero), dimensions={}
  neg = pred[8] compare(p, bz), direction=LT
  q = f32[8] select(neg, e, p)
  ninf = f32[] constant(-inf)
  rows = f32[8] reduce(w, ninf), dimensions={1}, to_apply=max
  cols = f32[8] reduce(w, ninf), dimensions={0}, to_apply=max
  m = f32[8] maximum(rows, cols)
  fi = f32[] convert(i)
  bi = f32[8] broadcast(fi), dimensions={}
  s = f32[8] divide(m, bi)
  u0 = f32[8] add(q, s)
  ur = f32[8] reverse(u0), dimensions={0}
  u = f32[8] subtract(u0, ur)
  r = f32[8] tanh(u)
  ki = s32[4] broadcast(i), dimensions={}
  kk = s32[4] multiply(k, ki)
  z = s32[] constant(0)
  ks = s32[] reduce(kk, z), dimensions={0}, to_apply=sum
  kb = s32[4] broadcast(ks), dimensions={}
  knext = s32[4] subtract(kk, kb)
  ROOT out = (s32[], f32[8,8], f32[8], s32[4]) tuple(next, w, r, knext)
}
cond {
  state = (s32[], f32[8,8], f32[8], s32[4]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(12)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  one = s32[] constant(1)
  w = f32[8,8] parameter(0)
  v = f32[8] parameter(1)
  k = s32[4] parameter(2)
  init = (s32[], f32[8,8], f32[8], s32[4]) tuple(one, w, v, k)
  l = (s32[], f32[8,8], f32[8], s32[4]) while(init), condition=cond, body=body
  r = f32[8] get-tuple-element(l), index=2
  kr = s32[4] get-tuple-element(l), index=3
  ROOT t = (f32[8], s32[4]) tuple(r, kr)
}
"#;

    /// Sums along both axes accumulated over the iterations: the order of each
    /// reduction's partial sums shows in the results.
    const SUMS: &str = r#"
HloModule sums
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
body {
  state = (s32[], f32[4,40], f32[4], f32[40]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  x = f32[4,40] get-tuple-element(state), index=1
  rows = f32[4] get-tuple-element(state), index=2
  cols = f32[40] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  zero = f32[] constant(0)
  r = f32[4] reduce(x, zero), dimensions={1}, to_apply=add
  c = f32[40] reduce(x, zero), dimensions={0}, to_apply=add
  rows2 = f32[4] add(rows, r)
  cols2 = f32[40] add(cols, c)
  k = f32[] constant(1.37)
  bk = f32[4,40] broadcast(k), dimensions={}
  s = f32[4,40] sine(x)
  x2 = f32[4,40] multiply(s, bk)
  ROOT out = (s32[], f32[4,40], f32[4], f32[40]) tuple(next, x2, rows2, cols2)
}
cond {
  state = (s32[], f32[4,40], f32[4], f32[40]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(20)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  zero = s32[] constant(0)
  x = f32[4,40] parameter(0)
  z = f32[] constant(0)
  rows = f32[4] broadcast(z), dimensions={}
  cols = f32[40] broadcast(z), dimensions={}
  init = (s32[], f32[4,40], f32[4], f32[40]) tuple(zero, x, rows, cols)
  l = (s32[], f32[4,40], f32[4], f32[40]) while(init), condition=cond, body=body
  r = f32[4] get-tuple-element(l), index=2
  c = f32[40] get-tuple-element(l), index=3
  ROOT t = (f32[4], f32[40]) tuple(r, c)
}
"#;

    /// A state whose parts trade places: inputs returned at other positions, one of
    /// them twice, and a constant returned.
    const SWAPS: &str = r#"
HloModule swaps
body {
  state = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  a = f32[6] get-tuple-element(state), index=1
  b = f32[6] get-tuple-element(state), index=2
  c = f32[6] get-tuple-element(state), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  s = f32[6] add(a, b)
  k = f32[6] constant({1, 2, 3, 4, 5, 6})
  ROOT out = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(next, c, s, a, c, k)
}
cond {
  state = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  n = s32[] constant(7)
  ROOT go = pred[] compare(i, n), direction=LT
}
ENTRY main {
  zero = s32[] constant(0)
  a = f32[6] parameter(0)
  b = f32[6] parameter(1)
  init = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(zero, a, b, a, b, a)
  l = (s32[], f32[6], f32[6], f32[6], f32[6], f32[6]) while(init), condition=cond, body=body
  x = f32[6] get-tuple-element(l), index=1
  y = f32[6] get-tuple-element(l), index=2
  z = f32[6] get-tuple-element(l), index=3
  w = f32[6] get-tuple-element(l), index=4
  v = f32[6] get-tuple-element(l), index=5
  ROOT t = (f32[6], f32[6], f32[6], f32[6], f32[6]) tuple(x, y, z, w, v)
}
"#;

    /// An input: its type, dimensions and little-endian bytes.
    type Bound = (DType, Vec<u64>, Vec<u8>);

    /// An instruction's trace entry and tick interval, as a run reported it.
    type Reported = (usize, u64, u64);

    /// A scan: each iteration reads row `i` of `xs` (and windows of it whose starts
    /// clamp, past the end and below zero) and writes it into row `i` of `ys` from
    /// column 1 (in place, the updated array being dead after it), and scatters a token
    /// into element `i` of `tokens` (in place too), while the condition updates a copy
    /// of `ys` it must not write into the state (indices past the end clamp).
    const SCAN: &str = r#"
HloModule scan
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
assign {
  a = s32[] parameter(0)
  ROOT b = s32[] parameter(1)
}
body {
  state = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  xs = f32[6,4] get-tuple-element(state), index=1
  ys = f32[6,6] get-tuple-element(state), index=2
  h = f32[4] get-tuple-element(state), index=3
  zero = s32[] constant(0)
  x = f32[1,4] dynamic-slice(xs, i, zero), dynamic_slice_sizes={1,4}
  xr = f32[4] reshape(x)
  s0 = f32[4] add(h, xr)
  x2 = f32[2,4] dynamic-slice(xs, i, zero), dynamic_slice_sizes={2,4}
  z2 = f32[] constant(0)
  x2r = f32[4] reduce(x2, z2), dimensions={0}, to_apply=sum
  neg = s32[] negate(i)
  one2 = s32[] constant(1)
  x3 = f32[3,2] dynamic-slice(xs, neg, one2), dynamic_slice_sizes={3,2}
  x3r = f32[] reduce(x3, z2), dimensions={0,1}, to_apply=sum
  x3b = f32[4] broadcast(x3r), dimensions={}
  s1 = f32[4] add(s0, x2r)
  s = f32[4] subtract(s1, x3b)
  hn = f32[4] tanh(s)
  hr = f32[1,4] reshape(hn)
  column = s32[] constant(1)
  ys2 = f32[6,6] dynamic-update-slice(ys, hr, i, column)
  one = s32[] constant(1)
  next = s32[] add(i, one)
  tokens = s32[6] get-tuple-element(state), index=4
  at = s32[1] reshape(i)
  three = s32[] constant(3)
  token = s32[] multiply(next, three)
  tokens2 = s32[6] scatter(tokens, at, token), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=0, to_apply=assign
  ROOT out = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) tuple(next, xs, ys2, hn, tokens2)
}
cond {
  state = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  ys = f32[6,6] get-tuple-element(state), index=2
  zero = s32[] constant(0)
  probe = f32[1,4] constant({{0.5, -0.5, 2, 3}})
  ys3 = f32[6,6] dynamic-update-slice(ys, probe, i, zero)
  z = f32[] constant(0)
  t = f32[] reduce(ys3, z), dimensions={0,1}, to_apply=sum
  finite = pred[] compare(t, t), direction=EQ
  n = s32[] constant(6)
  more = pred[] compare(i, n), direction=LT
  ROOT go = pred[] and(more, finite)
}
ENTRY main {
  zero = s32[] constant(0)
  xs = f32[6,4] parameter(0)
  h = f32[4] parameter(1)
  z = f32[] constant(0)
  ys = f32[6,6] broadcast(z), dimensions={}
  seven = s32[] constant(-7)
  tokens = s32[6] broadcast(seven), dimensions={}
  init = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) tuple(zero, xs, ys, h, tokens)
  l = (s32[], f32[6,4], f32[6,6], f32[4], s32[6]) while(init), condition=cond, body=body
  y = f32[6,6] get-tuple-element(l), index=2
  hl = f32[4] get-tuple-element(l), index=3
  tl = s32[6] get-tuple-element(l), index=4
  ROOT r = (f32[6,6], f32[4], s32[6]) tuple(y, hl, tl)
}
"#;

    /// Runs `hlo` on `inputs` with small loops (`fuse`) or without; its outputs' bytes
    /// and the trace entries reported, in order.
    fn run(hlo: &str, inputs: &[Bound], fuse: bool) -> (Vec<Vec<u8>>, Vec<Reported>) {
        let program = compile_hlo(hlo, Target::Trn1).expect("compiles");
        let executable = Executable::new(program.clone(), fuse);
        assert_eq!(executable.small.iter().flatten().count(), usize::from(fuse), "the loop runs small when fused");
        let values = inputs
            .iter()
            .map(|(dtype, dims, bytes)| {
                Input::Copied(Value::from_le_bytes(&ArrayType::new(*dtype, dims.clone()), bytes))
            })
            .collect();
        let destinations = program.outputs.iter().map(|_| None).collect();
        let mut reported = Vec::new();
        let pool = HostPool::new(1);
        let outputs = executable
            .run(values, destinations, u64::MAX, &pool, &mut |_, _, _, _| unreachable!(), &mut |k, start, end| {
                reported.push((k, start, end))
            })
            .expect("runs");
        (outputs.iter().map(Output::le_bytes).collect(), reported)
    }

    /// Floats with NaNs, infinities and signed zeros among them, drawn from `seed`.
    fn floats(n: usize, seed: u32, scale: f32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| {
                let x = i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
                match x % 89 {
                    0 if seed.is_multiple_of(3) => f32::NAN,
                    1 if seed.is_multiple_of(4) => f32::NEG_INFINITY,
                    2 => -0.0,
                    _ => ((x % 2001) as f32 / 1000.0 - 1.0) * scale,
                }
            })
            .flat_map(f32::to_le_bytes)
            .collect()
    }

    #[test]
    fn small_loops_give_the_general_runs_bits() {
        for seed in 0..12 {
            let damped = [(DType::F32, vec![64], floats(64, seed, 1.0 + seed as f32))];
            let ints: Vec<u8> = [3i32, -7, i32::MAX - seed as i32, 12].iter().flat_map(|x| x.to_le_bytes()).collect();
            let mixed = [
                (DType::F32, vec![8, 8], floats(64, seed, 0.5)),
                (DType::F32, vec![8], floats(8, seed + 100, 2.0)),
                (DType::S32, vec![4], ints),
            ];
            let sums = [(DType::F32, vec![4, 40], floats(160, seed, 3.0))];
            let swaps = [(DType::F32, vec![6], floats(6, seed, 1.0)), (DType::F32, vec![6], floats(6, seed + 7, 5.0))];
            let scan =
                [(DType::F32, vec![6, 4], floats(24, seed, 2.0)), (DType::F32, vec![4], floats(4, seed + 3, 1.0))];
            let programs =
                [(DAMPED, &damped[..]), (MIXED, &mixed[..]), (SUMS, &sums[..]), (SWAPS, &swaps[..]), (SCAN, &scan[..])];
            for (hlo, inputs) in programs {
                let (small, _) = run(hlo, inputs, true);
                let (general, _) = run(hlo, inputs, false);
                assert_eq!(small, general, "seed {seed}");
            }
        }
    }

    #[test]
    fn a_scans_rows_are_written_in_place_but_never_into_the_conditions_state() {
        let executable = Executable::new(compile_hlo(SCAN, Target::Trn1).expect("compiles"), true);
        let small_loop = executable.small.iter().flatten().next().expect("a small loop");
        let in_place = |c: &Compact| c.steps.iter().filter(|s| s.in_place.is_some()).count();
        assert_eq!((in_place(&small_loop.condition), in_place(&small_loop.body)), (0, 1));
        let sliced = small_loop.body.steps.iter().filter(|s| s.sliced.is_some()).count();
        assert_eq!(sliced, 3, "the body's dynamic slices copy rows");
        let scattered = small_loop.body.steps.iter().filter(|s| s.scatters_one).count();
        assert_eq!(scattered, 1, "the body's scatter of one token writes it in place");
    }

    #[test]
    fn a_small_loop_reports_every_instruction_as_the_general_run_does() {
        let inputs = [(DType::F32, vec![64], floats(64, 1, 3.0))];
        let (_, small) = run(DAMPED, &inputs, true);
        let (_, general) = run(DAMPED, &inputs, false);
        // The same instructions in the same order; the broadcasts of constants, which a
        // small loop computes once, take no time.
        let entries = |reported: &[Reported]| reported.iter().map(|r| r.0).collect::<Vec<_>>();
        assert_eq!(entries(&small), entries(&general));
        let executable = Executable::new(compile_hlo(DAMPED, Target::Trn1).expect("compiles"), true);
        let small_loop = executable.small.iter().flatten().next().expect("a small loop");
        let hoisted: Vec<usize> = small_loop.body.steps.iter().filter(|s| s.hoisted).map(|s| s.entry).collect();
        assert_eq!(hoisted.len(), 2, "the two broadcasts of constants");
        assert!(small.iter().filter(|r| hoisted.contains(&r.0)).all(|r| r.1 == r.2), "no time for them");
        assert!(small.len() > 100, "{} intervals", small.len());
        // Back to back inside each iteration, which starts where the one before ended.
        let mut previous = small[0].1;
        for &(k, start, end) in &small {
            assert!(start <= end, "entry {k}: {start} > {end}");
            if k != 0 {
                assert_eq!(start, previous, "entry {k} starts where the instruction before it ended");
                previous = end;
            }
        }
    }

    #[test]
    fn a_small_loop_that_never_ends_stops_at_the_deadline() {
        let hlo = DAMPED.replace("direction=GT", "direction=NE").replace("constant(300)", "constant(2147483647)");
        let program = compile_hlo(&hlo, Target::Trn1).expect("compiles");
        let executable = Executable::new(program.clone(), true);
        let x = Value::from_le_bytes(&ArrayType::new(DType::F32, vec![64]), &floats(64, 5, 1.0));
        let before = ticks();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let deadline = ticks() + 10 * (ticks() - before);
        let mut iterations = 0;
        let result = executable.run(
            vec![Input::Copied(x)],
            program.outputs.iter().map(|_| None).collect(),
            deadline,
            &HostPool::new(1),
            &mut |_, _, _, _| unreachable!(),
            &mut |k, _, _| iterations += usize::from(k == 0),
        );
        assert!(matches!(result, Err(RunError::DeadlineExceeded { step: 0 })), "{result:?}");
        assert!(iterations > 10, "{iterations} iterations before the deadline");
    }
}
