//! Runs loops and conditionals: their nested programs, prepared as executables of
//! their own, on the state the instruction reads.
//!
//! A loop's state moves from one iteration to the next without copies: the first
//! iteration reads the instruction's operands in place, and each later one hands the
//! previous body's results to the next body as owned inputs, so that a value the body
//! returns unchanged (a weight carried through a `scan`) is moved, not copied. The
//! deadline is checked before every iteration (and by the nested programs before each
//! of their instructions), so a loop that never ends stops with the execution's timeout.
//! Each iteration (condition and body), and the final evaluation of the condition, is
//! reported as one interval of the loop instruction; a conditional reports the run of
//! its branch.

use neuron_datastore::clock::ticks;

use super::{Executable, Input, InstructionObserver, Output, RunError, Value, ValueRef};
use crate::error::NrtError;
use crate::isa::{Branches, Op, Selector};
use crate::pool::HostPool;

/// Runs the loop or conditional `op`, whose programs are prepared in `nested` and whose
/// entry in the trace table is `index`, on `operands`; returns its results.
pub(super) fn run<'a>(
    op: &Op,
    nested: &'a [Executable],
    index: usize,
    operands: Vec<ValueRef<'a>>,
    deadline_ticks: u64,
    helpers: &HostPool,
    on_instruction: &mut InstructionObserver<'_>,
) -> Result<Vec<Value>, RunError> {
    let mut context = Context { deadline_ticks, helpers, on_instruction };
    match (op, nested) {
        (Op::While(_), [condition, body]) => run_loop(condition, body, index, operands, &mut context),
        (Op::Conditional(branches), _) => run_branch(branches, nested, index, operands, &mut context),
        _ => super::kernels::unvalidated("control flow without its programs"),
    }
}

struct Context<'c, 'o> {
    deadline_ticks: u64,
    helpers: &'c HostPool,
    on_instruction: &'c mut InstructionObserver<'o>,
}

impl Context<'_, '_> {
    /// Runs a nested program on `inputs`; its results as owned values.
    fn run<'x>(&mut self, program: &'x Executable, inputs: Vec<Input<'x>>) -> Result<Vec<Value>, RunError> {
        // No output is written in place: every result comes back as a value.
        let destinations = Vec::new();
        let mut no_collectives = |_: super::CollectiveStep<'_, 'x>| -> Result<Output<'x>, NrtError> {
            super::kernels::unvalidated("a collective inside a loop or conditional")
        };
        let outputs = program.run(
            inputs,
            destinations,
            self.deadline_ticks,
            self.helpers,
            &mut no_collectives,
            self.on_instruction,
        )?;
        Ok(outputs
            .into_iter()
            .map(|output| match output {
                Output::Value(value) => value,
                Output::Written(view) => view.to_owned(),
            })
            .collect())
    }
}

/// The loop state: the instruction's operands, read in place, until the first body
/// has run.
enum State<'a> {
    Operands(Vec<ValueRef<'a>>),
    Owned(Vec<Value>),
}

impl State<'_> {
    fn views(&self) -> Vec<Input<'_>> {
        match self {
            State::Operands(views) => views.iter().map(|v| Input::InPlace(v.view())).collect(),
            State::Owned(values) => values.iter().map(|v| Input::InPlace(v.view())).collect(),
        }
    }
}

fn run_loop<'a>(
    condition: &'a Executable,
    body: &'a Executable,
    index: usize,
    operands: Vec<ValueRef<'a>>,
    context: &mut Context<'_, '_>,
) -> Result<Vec<Value>, RunError> {
    let mut state = State::Operands(operands);
    loop {
        let start = ticks();
        if start > context.deadline_ticks {
            return Err(RunError::DeadlineExceeded { step: index });
        }
        let verdict = context.run(condition, state.views())?;
        let go = match verdict.first() {
            Some(Value::Pred(p)) => p.iter().next().copied().unwrap_or(false),
            _ => super::kernels::unvalidated("a loop condition that is not pred[]"),
        };
        if !go {
            context.on_instruction.instruction(index, start, ticks());
            break;
        }
        let inputs: Vec<Input<'_>> = match state {
            State::Operands(views) => views.into_iter().map(Input::InPlace).collect(),
            State::Owned(values) => values.into_iter().map(Input::Copied).collect(),
        };
        state = State::Owned(context.run(body, inputs)?);
        context.on_instruction.instruction(index, start, ticks());
    }
    Ok(match state {
        State::Operands(views) => views.iter().map(ValueRef::to_owned).collect(),
        State::Owned(values) => values,
    })
}

fn run_branch<'a>(
    branches: &Branches,
    nested: &'a [Executable],
    index: usize,
    operands: Vec<ValueRef<'a>>,
    context: &mut Context<'_, '_>,
) -> Result<Vec<Value>, RunError> {
    let start = ticks();
    let selector = match operands.first() {
        Some(ValueRef::Pred(p)) => Selector::Pred(p.iter().next().copied().unwrap_or(false)),
        Some(ValueRef::S32(i)) => Selector::Index(i.iter().next().copied().unwrap_or(0)),
        _ => super::kernels::unvalidated("a conditional selector that is not pred[] or s32[]"),
    };
    let b = branches.pick(selector);
    let range = branches.operand_range(b);
    let inputs = operands[range].iter().map(|v| Input::InPlace(v.view())).collect();
    let results = context.run(&nested[b], inputs)?;
    context.on_instruction.instruction(index, start, ticks());
    Ok(results)
}
