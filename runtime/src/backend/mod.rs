//! The CPU execution backend: runs a validated [`Program`] with real numerics.
//!
//! An [`Executable`] is prepared once per load: constants are made resident (the weights DMA
//! queue), the engine streams are merged into their global step order, and each
//! intermediate's last reader is found so its memory is released as soon as it is dead.
//! [`Executable::run`] then moves the inputs in, runs every instruction, and hands the
//! outputs back. It checks the deadline between instructions.

mod kernels;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::dtype::{ArrayType, DType};
use crate::isa::{BufferKind, Instruction, Program};
use crate::trace::clock::ticks;

/// A host array of one of the executable element types.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    F32(ArrayD<f32>),
    S32(ArrayD<i32>),
    Pred(ArrayD<bool>),
}

impl Value {
    /// Decodes little-endian bytes (exactly `ty.size_bytes()` of them) into a value.
    pub(crate) fn from_le_bytes(ty: &ArrayType, bytes: &[u8]) -> Value {
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        let decoded = match ty.dtype {
            DType::F32 => ArrayD::from_shape_vec(dims, decode_words(bytes, f32::from_le_bytes)).map(Value::F32),
            DType::S32 => ArrayD::from_shape_vec(dims, decode_words(bytes, i32::from_le_bytes)).map(Value::S32),
            DType::Pred => ArrayD::from_shape_vec(dims, bytes.iter().map(|&b| b != 0).collect()).map(Value::Pred),
        };
        // Callers pass exactly the bytes of `ty`: bindings and constants are size-checked.
        decoded.unwrap_or_else(|_| unreachable!("{} bytes do not hold a {ty}", bytes.len()))
    }

    /// A zero-filled value of type `ty`.
    pub(crate) fn zeros(ty: &ArrayType) -> Value {
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        match ty.dtype {
            DType::F32 => Value::F32(ArrayD::zeros(dims)),
            DType::S32 => Value::S32(ArrayD::zeros(dims)),
            DType::Pred => Value::Pred(ArrayD::from_elem(dims, false)),
        }
    }

    /// Writes the value's elements, row-major and little-endian, into `out`.
    pub(crate) fn write_le_bytes(&self, out: &mut [u8]) {
        match self {
            Value::F32(a) => encode_words(a, out, f32::to_le_bytes),
            Value::S32(a) => encode_words(a, out, i32::to_le_bytes),
            Value::Pred(a) => {
                for (byte, x) in out.iter_mut().zip(a.iter()) {
                    *byte = u8::from(*x);
                }
            }
        }
    }

    /// A borrowed view of the value.
    pub(crate) fn view(&self) -> ValueRef<'_> {
        match self {
            Value::F32(a) => ValueRef::F32(a.view()),
            Value::S32(a) => ValueRef::S32(a.view()),
            Value::Pred(a) => ValueRef::Pred(a.view()),
        }
    }
}

/// A borrowed array: an intermediate, a constant, or an input read in place from its
/// tensor's memory.
#[derive(Debug, Clone)]
pub(crate) enum ValueRef<'a> {
    F32(ArrayViewD<'a, f32>),
    S32(ArrayViewD<'a, i32>),
    Pred(ArrayViewD<'a, bool>),
}

impl<'a> ValueRef<'a> {
    /// Views little-endian tensor bytes in place when the host is little-endian and
    /// the bytes are aligned for the element type; `None` when a copy is needed.
    pub(crate) fn from_le_bytes(ty: &ArrayType, bytes: &'a [u8]) -> Option<ValueRef<'a>> {
        if cfg!(target_endian = "big") {
            return None;
        }
        let dims = IxDyn(&kernels::to_usize(&ty.dims));
        match ty.dtype {
            DType::F32 => {
                let words = bytemuck::try_cast_slice::<u8, f32>(bytes).ok()?;
                ArrayViewD::from_shape(dims, words).ok().map(ValueRef::F32)
            }
            DType::S32 => {
                let words = bytemuck::try_cast_slice::<u8, i32>(bytes).ok()?;
                ArrayViewD::from_shape(dims, words).ok().map(ValueRef::S32)
            }
            // Bytes other than 0 and 1 are valid `pred` input but not valid `bool`s.
            DType::Pred => None,
        }
    }

    /// The same view, borrowed for a shorter time.
    pub(crate) fn view(&self) -> ValueRef<'_> {
        match self {
            ValueRef::F32(a) => ValueRef::F32(a.view()),
            ValueRef::S32(a) => ValueRef::S32(a.view()),
            ValueRef::Pred(a) => ValueRef::Pred(a.view()),
        }
    }

    /// Number of NaN or infinite elements (zero for integer types).
    pub(crate) fn non_finite_count(&self) -> u64 {
        match self {
            ValueRef::F32(a) => match a.as_slice() {
                Some(slice) => slice.iter().filter(|x| !x.is_finite()).count() as u64,
                None => a.iter().filter(|x| !x.is_finite()).count() as u64,
            },
            ValueRef::S32(_) | ValueRef::Pred(_) => 0,
        }
    }

    pub(crate) fn to_owned(&self) -> Value {
        match self {
            ValueRef::F32(a) => Value::F32(a.to_owned()),
            ValueRef::S32(a) => Value::S32(a.to_owned()),
            ValueRef::Pred(a) => Value::Pred(a.to_owned()),
        }
    }

    fn as_f32(&self) -> Option<&ArrayViewD<'a, f32>> {
        match self {
            ValueRef::F32(a) => Some(a),
            _ => None,
        }
    }

    fn as_s32(&self) -> Option<&ArrayViewD<'a, i32>> {
        match self {
            ValueRef::S32(a) => Some(a),
            _ => None,
        }
    }

    fn as_pred(&self) -> Option<&ArrayViewD<'a, bool>> {
        match self {
            ValueRef::Pred(a) => Some(a),
            _ => None,
        }
    }
}

/// A program input: read in place from tensor memory, or decoded into a copy.
#[derive(Debug)]
pub(crate) enum Input<'a> {
    InPlace(ValueRef<'a>),
    Copied(Value),
}

/// Decodes 4-byte little-endian words; on little-endian hosts this is one copy.
fn decode_words<T: bytemuck::Pod + Default>(bytes: &[u8], from_le: fn([u8; 4]) -> T) -> Vec<T> {
    let mut out = vec![T::default(); bytes.len() / 4];
    if cfg!(target_endian = "little") {
        let len = out.len() * 4;
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes[..len]);
    } else {
        for (x, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = from_le([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
    }
    out
}

/// Encodes an array as 4-byte little-endian words, copying whole rows when it can.
fn encode_words<T: bytemuck::Pod>(a: &ArrayD<T>, out: &mut [u8], to_le: fn(T) -> [u8; 4]) {
    match a.as_slice() {
        Some(slice) if cfg!(target_endian = "little") => {
            let bytes: &[u8] = bytemuck::cast_slice(slice);
            out[..bytes.len()].copy_from_slice(bytes);
        }
        _ => {
            for (chunk, x) in out.chunks_exact_mut(4).zip(a.iter()) {
                chunk.copy_from_slice(&to_le(*x));
            }
        }
    }
}

/// Tensor memory an output is written into directly, typed for its element type.
#[derive(Debug)]
pub(crate) enum Destination<'a> {
    F32(&'a mut [f32]),
    S32(&'a mut [i32]),
}

impl<'a> Destination<'a> {
    /// Views output tensor bytes as elements of `dtype`, when aligned for them on a
    /// little-endian host (`pred` outputs are always written after the run).
    pub(crate) fn from_le_bytes(dtype: DType, bytes: &'a mut [u8]) -> Option<Destination<'a>> {
        if cfg!(target_endian = "big") {
            return None;
        }
        match dtype {
            DType::F32 => bytemuck::try_cast_slice_mut(bytes).ok().map(Destination::F32),
            DType::S32 => bytemuck::try_cast_slice_mut(bytes).ok().map(Destination::S32),
            DType::Pred => None,
        }
    }
}

/// One output of a run: already in its tensor, or a value still to be copied there.
#[derive(Debug)]
pub(crate) enum Output<'a> {
    /// Written in place; the view reads it back.
    Written(ValueRef<'a>),
    Value(Value),
}

/// Why a run stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunError {
    /// The deadline passed before `step` could start.
    DeadlineExceeded { step: usize, steps: usize },
}

/// A program prepared for repeated execution.
#[derive(Debug)]
pub(crate) struct Executable {
    program: Program,
    /// Instructions in global step order: (stream index, instruction index).
    order: Vec<(usize, usize)>,
    /// Decoded copies of the constants that cannot be viewed in place, by constant index.
    decoded_constants: Vec<Option<Value>>,
    /// Buffers to release after each step.
    release_after: Vec<Vec<u32>>,
    /// For each buffer, the first program output it is returned as.
    output_of_buffer: Vec<Option<usize>>,
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
    /// Prepares a program that has passed [`Program::validate`].
    pub(crate) fn new(program: Program) -> Executable {
        let mut order: Vec<(u32, usize, usize)> = Vec::new();
        for (s, stream) in program.streams.iter().enumerate() {
            for (i, instruction) in stream.instructions.iter().enumerate() {
                order.push((instruction.step, s, i));
            }
        }
        order.sort_unstable();
        let order: Vec<(usize, usize)> = order.into_iter().map(|(_, s, i)| (s, i)).collect();

        // Constants are viewed in place in the program's blobs at each run; only those
        // that cannot be (predicates, unaligned blobs) are decoded, once, here.
        let mut decoded_constants: Vec<Option<Value>> = vec![None; program.constants.len()];
        for b in &program.buffers {
            if let BufferKind::Constant { index } = b.kind
                && let Some(blob) = program.constants.get(index as usize)
                && ValueRef::from_le_bytes(&b.ty, blob).is_none()
            {
                decoded_constants[index as usize] = Some(Value::from_le_bytes(&b.ty, blob));
            }
        }

        let mut last_reader: Vec<Option<usize>> = vec![None; program.buffers.len()];
        for (step, &(s, i)) in order.iter().enumerate() {
            for &b in &program.streams[s].instructions[i].operands {
                last_reader[b as usize] = Some(step);
            }
        }
        let is_output: Vec<bool> =
            (0..program.buffers.len()).map(|b| program.outputs.iter().any(|o| o.buffer as usize == b)).collect();
        let mut release_after = vec![Vec::new(); order.len()];
        for (b, last) in last_reader.iter().enumerate() {
            if let Some(step) = last
                && !is_output[b]
            {
                release_after[*step].push(b as u32);
            }
        }
        let mut output_of_buffer = vec![None; program.buffers.len()];
        for (k, io) in program.outputs.iter().enumerate().rev() {
            output_of_buffer[io.buffer as usize] = Some(k);
        }
        Executable { program, order, decoded_constants, release_after, output_of_buffer }
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
    /// as values. The deadline is in host ticks (`trace::clock::ticks`), read once per
    /// instruction; `on_instruction(step, start, end)` sees each instruction's tick
    /// interval, which costs no extra clock read.
    pub(crate) fn run<'a>(
        &'a self,
        inputs: Vec<Input<'a>>,
        mut destinations: Vec<Option<Destination<'a>>>,
        deadline_ticks: u64,
        mut on_instruction: impl FnMut(usize, u64, u64),
    ) -> Result<Vec<Output<'a>>, RunError> {
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
        let steps = self.order.len();
        let mut previous_start = ticks();
        for (step, instruction) in self.steps().enumerate() {
            let now = ticks();
            if step > 0 {
                on_instruction(step - 1, previous_start, now);
            }
            previous_start = now;
            if now > deadline_ticks {
                return Err(RunError::DeadlineExceeded { step, steps });
            }
            let b = instruction.output as usize;
            let out_ty = &program.buffers[b].ty;
            let destination = self.output_of_buffer[b].and_then(|k| destinations.get_mut(k)?.take().map(|d| (k, d)));
            let operands: Vec<ValueRef<'_>> =
                instruction.operands.iter().filter_map(|&o| slots[o as usize].get()).collect();
            let slot = match destination {
                Some((k, destination)) => {
                    written[k] = true;
                    Slot::Borrowed(kernels::execute_into(&instruction.op, &operands, out_ty, destination))
                }
                None => Slot::Owned(kernels::execute(&instruction.op, &operands, out_ty)),
            };
            drop(operands);
            slots[b] = slot;
            for &r in &self.release_after[step] {
                if matches!(
                    program.buffers[r as usize].kind,
                    BufferKind::Intermediate { .. } | BufferKind::Input { .. }
                ) {
                    slots[r as usize] = Slot::Empty;
                }
            }
        }
        if steps > 0 {
            on_instruction(steps - 1, previous_start, ticks());
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
