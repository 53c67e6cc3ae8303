//! Control flow: loops (`while`) and conditionals (`conditional`), whose computations
//! are programs of their own.
//!
//! A [`Loop`] or [`Branches`] instruction runs nested [`Program`]s on the same core: the
//! condition and the body of a loop, one program per branch of a conditional. Each
//! nested program takes its values as inputs and returns them as outputs, exactly like
//! a model, so it is lowered, validated, planned and executed by the same code as the
//! entry computation. The instruction writes several buffers (see `results.rs`).
//!
//! Nesting is bounded: a NEFF cannot nest control flow deeper than [`MAX_NESTING`],
//! checked while it is decoded, so that a crafted file cannot exhaust the stack.

use std::cell::Cell;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::*;

/// How deeply loops and conditionals may nest inside each other.
pub const MAX_NESTING: usize = 64;

/// XLA `while`: the state (the instruction's operands) goes through `body` for as long
/// as `condition` returns true. Both take the whole state as inputs; the condition
/// returns one `pred[]`, the body returns the next state. The instruction's results are
/// the final state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loop {
    pub condition: Program,
    pub body: Program,
}

/// XLA `conditional`: operand 0 selects a branch (a `pred[]`: true runs branch 0, false
/// branch 1; or an `s32[]` index, where an index outside the branches runs the last
/// one), and the selected branch runs on its own operands. The operands after the
/// selector are the branches' inputs, branch after branch. Every branch returns values
/// of the same types, the instruction's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branches {
    pub branches: Vec<Program>,
}

impl Branches {
    /// The operand range (after the selector) that branch `b` reads.
    pub fn operand_range(&self, b: usize) -> std::ops::Range<usize> {
        let start = 1 + self.branches[..b].iter().map(|p| p.inputs.len()).sum::<usize>();
        start..start + self.branches[b].inputs.len()
    }

    /// The branch a selector value picks.
    pub fn pick(&self, selector: Selector) -> usize {
        let last = self.branches.len().saturating_sub(1);
        match selector {
            Selector::Pred(true) => 0,
            Selector::Pred(false) => 1.min(last),
            Selector::Index(i) => usize::try_from(i).ok().filter(|&i| i < last).unwrap_or(last),
        }
    }
}

/// The value of a conditional's selector operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    Pred(bool),
    Index(i32),
}

/// A nested program container whose decoding counts the nesting depth, so that a
/// NEFF nesting deeper than [`MAX_NESTING`] is a decode error, not a stack overflow.
#[derive(Debug, Clone, PartialEq)]
pub struct Nested<T>(pub Box<T>);

impl<T> Nested<T> {
    pub fn new(value: T) -> Nested<T> {
        Nested(Box::new(value))
    }
}

impl<T> Deref for Nested<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Serialize> Serialize for Nested<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

thread_local! {
    static DECODE_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Set when a decode stopped at [`MAX_NESTING`]: decoders do not all keep a custom
    /// error's message, so the NEFF decoder asks with [`nesting_exceeded`].
    static NESTING_EXCEEDED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the last decode on this thread stopped because control flow nested deeper
/// than [`MAX_NESTING`] (and forgets it).
pub fn nesting_exceeded() -> bool {
    NESTING_EXCEEDED.replace(false)
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Nested<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let depth = DECODE_DEPTH.get();
        if depth >= MAX_NESTING {
            NESTING_EXCEEDED.set(true);
            return Err(serde::de::Error::custom(format!("control flow nests deeper than {MAX_NESTING} levels")));
        }
        DECODE_DEPTH.set(depth + 1);
        let value = T::deserialize(deserializer);
        DECODE_DEPTH.set(depth);
        value.map(|v| Nested(Box::new(v)))
    }
}

impl Op {
    /// The programs a control-flow instruction runs (none for other operations).
    pub fn nested_programs(&self) -> Vec<&Program> {
        match self {
            Op::While(l) => vec![&l.condition, &l.body],
            Op::Conditional(c) => c.branches.iter().collect(),
            _ => Vec::new(),
        }
    }
}

impl Program {
    /// The types of a program's inputs or outputs.
    pub fn io_types<'p>(&'p self, io: &'p [IoTensor]) -> impl Iterator<Item = &'p ArrayType> {
        io.iter().map(|t| &self.buffers[t.buffer as usize].ty)
    }
}

pub(super) fn check_control(op: &Op, operands: &[&ArrayType], results: &[&ArrayType]) -> Result<(), String> {
    let same = |what: &str, got: Vec<&ArrayType>, expected: &[&ArrayType]| -> Result<(), String> {
        if got.len() != expected.len() || got.iter().zip(expected).any(|(a, b)| a != b) {
            let list = |types: &[&ArrayType]| types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
            return Err(format!("{what} are ({}) but should be ({})", list(&got), list(expected)));
        }
        Ok(())
    };
    for program in op.nested_programs() {
        program.validate().map_err(|e| format!("nested program: {e}"))?;
    }
    match op {
        Op::While(l) => {
            same("the loop condition's inputs", l.condition.io_types(&l.condition.inputs).collect(), operands)?;
            same("the loop body's inputs", l.body.io_types(&l.body.inputs).collect(), operands)?;
            same("the loop body's outputs", l.body.io_types(&l.body.outputs).collect(), operands)?;
            same("the loop's results", results.to_vec(), operands)?;
            let scalar_pred = ArrayType::new(DType::Pred, vec![]);
            same("the loop condition's outputs", l.condition.io_types(&l.condition.outputs).collect(), &[&scalar_pred])
        }
        Op::Conditional(c) => {
            let selector = operands.first().ok_or("a conditional needs a selector operand")?;
            let valid_selector = selector.dims.is_empty()
                && match selector.dtype {
                    DType::Pred => c.branches.len() == 2,
                    DType::S32 => !c.branches.is_empty(),
                    _ => false,
                };
            if !valid_selector {
                return Err(format!(
                    "a conditional of {} branch(es) cannot be selected by {selector}: use pred[] for two, s32[] otherwise",
                    c.branches.len()
                ));
            }
            let arity: usize = c.branches.iter().map(|b| b.inputs.len()).sum();
            if operands.len() != 1 + arity {
                return Err(format!(
                    "the branches take {arity} operand(s) but the conditional has {}",
                    operands.len() - 1
                ));
            }
            for (b, branch) in c.branches.iter().enumerate() {
                let what = format!("branch {b}'s inputs");
                same(&what, branch.io_types(&branch.inputs).collect(), &operands[c.operand_range(b)])?;
                same(&format!("branch {b}'s outputs"), branch.io_types(&branch.outputs).collect(), results)?;
            }
            Ok(())
        }
        _ => Err(format!("{} is not a control-flow operation", op.opcode())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_outside_the_branches_selects_the_last_one() {
        let empty = Program {
            target: neuron_datastore::topology::NeuronCoreVersion::V2,
            buffers: vec![],
            inputs: vec![],
            outputs: vec![],
            streams: vec![],
            dma_queues: vec![],
            constants: vec![],
            hlo_names: vec![],
            scratchpad_bytes: 0,
        };
        let branches = Branches { branches: vec![empty.clone(), empty.clone(), empty] };
        let picks: Vec<usize> =
            [-1, 0, 1, 2, 3, i32::MAX].into_iter().map(|i| branches.pick(Selector::Index(i))).collect();
        assert_eq!(picks, vec![2, 0, 1, 2, 2, 2]);
        assert_eq!(branches.pick(Selector::Pred(true)), 0);
        assert_eq!(branches.pick(Selector::Pred(false)), 1);
    }
}
