//! HLO text import: the syntax tree of an `HloModule` as JAX and PyTorch-XLA print it.
//!
//! [`parse_module`] accepts the text of `jax.jit(f).lower(*args).as_text(dialect="hlo")`
//! and of PyTorch-XLA dumps (with or without `%` name prefixes, operand types, layouts,
//! `metadata` and other attributes). Parsing checks syntax only; operator semantics are
//! checked when the module is lowered ([`crate::compile`]). Layouts are parsed and
//! dropped: every array is treated as logically row-major, which is what the values of
//! parameters and results mean whatever their physical layout.

mod parser;

use std::fmt;

pub(crate) use parser::parse_module;

/// A parsed `HloModule`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HloModule {
    pub name: String,
    /// The attributes after the module's name (`entry_computation_layout`,
    /// `frontend_attributes`, …), as written.
    pub attributes: Vec<Attribute>,
    pub computations: Vec<Computation>,
    /// Index of the `ENTRY` computation in `computations`.
    pub entry: usize,
}

impl HloModule {
    pub(crate) fn entry(&self) -> &Computation {
        &self.computations[self.entry]
    }

    pub(crate) fn computation(&self, name: &str) -> Option<&Computation> {
        self.computations.iter().find(|c| c.name == name)
    }

    pub(crate) fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|a| a.name == name).map(|a| a.value.as_str())
    }
}

/// One named computation: the entry, a called function or a reduction region.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Computation {
    pub name: String,
    pub instructions: Vec<Instruction>,
    /// Index of the `ROOT` instruction (the last one when none is marked).
    pub root: usize,
    /// Line of the computation header, for messages.
    pub line: usize,
}

/// One instruction: `name = shape opcode(operands), attribute=value, ...`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instruction {
    pub name: String,
    pub shape: Shape,
    pub opcode: String,
    pub operands: Vec<String>,
    /// The text inside `parameter(...)` and `constant(...)`.
    pub payload: Option<Payload>,
    pub attributes: Vec<Attribute>,
    /// 1-based line of the instruction in the source text.
    pub line: usize,
}

impl Instruction {
    pub(crate) fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|a| a.name == name).map(|a| a.value.as_str())
    }
}

/// What stands between the parentheses of `parameter(N)` or `constant(...)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Payload {
    ParameterNumber(u64),
    /// The literal's scalar tokens in row-major order: numbers, `inf`, `-inf`, `nan`,
    /// `true`, `false`.
    Literal(Vec<String>),
}

/// `name=value` after the operand list; the value is kept as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Attribute {
    pub name: String,
    pub value: String,
}

/// An HLO shape: an array or a tuple of shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    Array { element_type: String, dims: Vec<u64> },
    Tuple(Vec<Shape>),
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Array { element_type, dims } => {
                let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
                write!(f, "{element_type}[{}]", dims.join(","))
            }
            Shape::Tuple(parts) => {
                let parts: Vec<String> = parts.iter().map(Shape::to_string).collect();
                write!(f, "({})", parts.join(", "))
            }
        }
    }
}

/// A syntax error with the line and column it was found at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HLO syntax error at line {line}, column {column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}
