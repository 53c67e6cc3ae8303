//! How a small loop's untimed iterations run a program: its steps planned once into
//! fewer, cheaper calls.
//!
//! An iteration of a small loop is a handful of steps on tens of elements, so what each
//! step costs before its kernel starts (the checks for the in-place cases, the look at
//! the operands' types, a dispatch to vector instructions per step) is most of its
//! time. Untimed iterations (all but the first two and every [`super::TIMED_EVERY`]th)
//! need no clock per step, so there consecutive element-wise `f32` steps (and whole
//! reductions of `f32` arrays) run as one chain, in one call compiled for the widest
//! vector instructions of the CPU, each computing with the fused groups' element
//! functions (`fusion::compute`, the array kernels' bits). A step with a prepared
//! kernel runs it straight away. Every step still writes its result into its array,
//! in program order, so what any later step reads is what the step-by-step run leaves.

use super::{Data, Step};
use crate::backend::RunError;
use crate::backend::fusion::{self, Kernel, Lane};
use crate::backend::kernels::{self, Prepared, Scalar, vectorized, vectorized_job};
use crate::dtype::DType;
use crate::isa::Op;
use crate::pool::HostPool;

/// One call of an untimed iteration.
#[derive(Debug)]
pub(super) enum Fast {
    /// Element-wise `f32` steps in program order, in one vectorised call.
    Chain(Vec<Member>),
    /// A step of one-element operands and result (a loop counter's increment, its
    /// comparison with the bound): its element function, straight on the elements.
    Scalar { kernel: Scalar, operands: [usize; 2], output: usize, step: usize },
    /// The step of this index, whose prepared kernel runs without `Step::run`'s checks.
    Prepared(usize),
    /// The step of this index, through `Step::run`.
    Step(usize),
}

/// A step of a chain.
#[derive(Debug)]
pub(super) struct Member {
    kernel: Kernel,
    /// Only the first `arity` count.
    operands: [Operand; 3],
    arity: usize,
    output: usize,
}

/// Where a member reads an operand.
#[derive(Debug, Clone, Copy)]
struct Operand {
    buffer: usize,
    /// Read as one value for every element: a one-element operand of a longer result
    /// (a broadcast's, a clamp's bound), or a reduction's initial value.
    scalar: bool,
}

/// The calls of an untimed iteration of `steps`, whose buffers have `shapes` and
/// element `types`. Steps computed when the loop was prepared are left out.
pub(super) fn plan(steps: &[Step], shapes: &[Vec<usize>], types: &[DType]) -> Vec<Fast> {
    let mut fast = Vec::new();
    let mut chain = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        if step.hoisted {
            continue;
        }
        let one = shapes[step.output].iter().product::<usize>() == 1;
        if let Some((prepared, operands @ [a, _])) = step.prepared
            && one
            && !step.special()
            && let Some(kernel) = prepared.scalar(types[a])
        {
            if !chain.is_empty() {
                fast.push(Fast::Chain(std::mem::take(&mut chain)));
            }
            fast.push(Fast::Scalar { kernel, operands, output: step.output, step: k });
            continue;
        }
        if let Some(member) = member(step, shapes, types) {
            chain.push(member);
            continue;
        }
        if !chain.is_empty() {
            fast.push(Fast::Chain(std::mem::take(&mut chain)));
        }
        fast.push(if step.prepared.is_some() && !step.special() { Fast::Prepared(k) } else { Fast::Step(k) });
    }
    if !chain.is_empty() {
        fast.push(Fast::Chain(chain));
    }
    fast
}

/// `step` as a member of a chain: an `f32` result computed element by element from
/// `f32` operands of its length or of one element (a fused group's kernels, less
/// those of `pred` values), or a reduction of a whole `f32` array.
fn member(step: &Step, shapes: &[Vec<usize>], types: &[DType]) -> Option<Member> {
    if step.special() || step.ty.dtype != DType::F32 || step.operands.is_empty() || step.operands.len() > 3 {
        return None;
    }
    if !step.operands.iter().all(|&b| types[b] == DType::F32) {
        return None;
    }
    let length = |b: usize| shapes[b].iter().product::<usize>();
    let n = length(step.output);
    let kernel = match step.prepared {
        Some((Prepared::FoldAll(op), [x, init])) => {
            let init = Operand { buffer: init, scalar: true };
            let operands = [Operand { buffer: x, scalar: false }, init, init];
            return Some(Member { kernel: Kernel::Reduce(op), operands, arity: 2, output: step.output });
        }
        _ => fusion::kernel(&step.op, &vec![DType::F32; step.operands.len()], DType::F32)?,
    };
    let element_wise = match kernel {
        Kernel::Binary(_) | Kernel::Unary(_) | Kernel::Activation(_) | Kernel::Clamp | Kernel::Round { .. } => true,
        // A broadcast of one element or one that keeps the order of the elements (a
        // broadcast that reorders dimensions transposes), a copy, an `f32` conversion.
        Kernel::Pass => match &step.op {
            Op::Broadcast { dims } => length(step.operands[0]) == 1 || dims.is_sorted(),
            op => matches!(op, Op::Copy | Op::Convert),
        },
        _ => false,
    };
    let mut operands = [Operand { buffer: step.operands[0], scalar: false }; 3];
    for (slot, &buffer) in operands.iter_mut().zip(&step.operands) {
        *slot = match length(buffer) {
            len if len == n => Operand { buffer, scalar: false },
            1 => Operand { buffer, scalar: true },
            _ => return None,
        };
    }
    element_wise.then_some(Member { kernel, operands, arity: step.operands.len(), output: step.output })
}

vectorized_job!(
    /// `run_chain`, vectorised.
    RunChain<'m, 'a> ((&'m [Member], &'a mut [Data])) -> () = run_chain
);

/// Runs each member of a chain in order, into its array.
#[inline(always)]
fn run_chain((members, arrays): (&[Member], &mut [Data])) {
    for member in members {
        // Validation keeps an instruction from reading the buffer it writes.
        let Data::F32(slot) = &mut arrays[member.output] else { kernels::unvalidated("an f32 array") };
        let mut out = std::mem::take(slot);
        let lane = |&Operand { buffer, scalar }: &Operand| match &arrays[buffer] {
            Data::F32(v) if scalar => Lane::Scalar(v[0]),
            Data::F32(v) => Lane::Slice(v),
            _ => kernels::unvalidated("an f32 array"),
        };
        // One call per arity, so that each sees its operands' count and keeps only the
        // kernels of that many operands.
        let [a, b, c] = &member.operands;
        let value = match member.arity {
            1 => fusion::compute(&member.kernel, &[lane(a)], &mut out),
            2 => fusion::compute(&member.kernel, &[lane(a), lane(b)], &mut out),
            _ => fusion::compute(&member.kernel, &[lane(a), lane(b), lane(c)], &mut out),
        };
        if let Some(value) = value {
            out.fill(value);
        }
        if let Data::F32(slot) = &mut arrays[member.output] {
            *slot = out;
        }
    }
}

/// Runs the calls of `fast` on `arrays`, for `steps` of buffers of `shapes`.
pub(super) fn run(
    fast: &[Fast],
    steps: &[Step],
    arrays: &mut [Data],
    shapes: &[Vec<usize>],
    helpers: &HostPool,
) -> Result<(), RunError> {
    for call in fast {
        let k = match *call {
            Fast::Chain(ref members) => {
                vectorized(RunChain((members, arrays)));
                continue;
            }
            Fast::Scalar { kernel, operands, output, step } => {
                if run_scalar(kernel, operands, output, arrays) {
                    continue;
                }
                step
            }
            Fast::Prepared(k) if steps[k].run_prepared(arrays) => continue,
            Fast::Prepared(k) | Fast::Step(k) => k,
        };
        steps[k].execute(arrays, shapes, helpers)?;
    }
    Ok(())
}

/// Computes `kernel` of the first elements of `operands` into that of `output`;
/// `false`, with nothing written, where the arrays are not of its types.
#[inline]
fn run_scalar(kernel: Scalar, [a, b]: [usize; 2], output: usize, arrays: &mut [Data]) -> bool {
    /// One element of a flat array.
    enum One {
        F32(f32),
        S32(i32),
        Pred(bool),
    }
    fn first2<T: Copy>(x: &[T], y: &[T]) -> Option<(T, T)> {
        Some((*x.first()?, *y.first()?))
    }
    let value = match (kernel, &arrays[a], &arrays[b]) {
        (Scalar::F32(f), Data::F32(x), Data::F32(y)) => first2(x, y).map(|(x, y)| One::F32(f(x, y))),
        (Scalar::S32(f), Data::S32(x), Data::S32(y)) => first2(x, y).map(|(x, y)| One::S32(f(x, y))),
        (Scalar::Pred(f), Data::Pred(x), Data::Pred(y)) => first2(x, y).map(|(x, y)| One::Pred(f(x, y))),
        (Scalar::CompareF32(f), Data::F32(x), Data::F32(y)) => first2(x, y).map(|(x, y)| One::Pred(f(x, y))),
        (Scalar::CompareS32(f), Data::S32(x), Data::S32(y)) => first2(x, y).map(|(x, y)| One::Pred(f(x, y))),
        _ => None,
    };
    match (value, &mut arrays[output]) {
        (Some(One::F32(v)), Data::F32(o)) if !o.is_empty() => o[0] = v,
        (Some(One::S32(v)), Data::S32(o)) if !o.is_empty() => o[0] = v,
        (Some(One::Pred(v)), Data::Pred(o)) if !o.is_empty() => o[0] = v,
        _ => return false,
    }
    true
}

impl Step {
    /// Runs the step's prepared kernel; `false`, with nothing written, where its
    /// arrays are not of the types and lengths it was prepared for.
    fn run_prepared(&self, arrays: &mut [Data]) -> bool {
        let Some((kernel, [a, b])) = self.prepared else { return false };
        let mut out = std::mem::replace(&mut arrays[self.output], Data::Pred(Vec::new()));
        let done = match (arrays[a].flat(), arrays[b].flat(), out.flat_mut()) {
            (Some(x), Some(y), Some(o)) => kernel.run(x, y, o),
            _ => false,
        };
        arrays[self.output] = out;
        done
    }
}
