//! Lowering of an HLO module to engine instructions (the work of `neuron-cc compile`).
//!
//! Every HLO instruction becomes at most one engine instruction on the engine its
//! operator belongs to (matrix products on `PE`, transcendental functions on `ACT`,
//! arithmetic, compare, select, reduce and layout on `DVE`, iota on `POOL`); parameters,
//! constants and results become DMA transfers. `call`, `tuple`, `get-tuple-element` and
//! `opt-barrier` disappear: calls are inlined and tuples are resolved at compile time.
//! Loops and conditionals lower into nested programs (`lower/control.rs`). Intermediate
//! buffers are then planned into one scratchpad, reusing space once a buffer is dead.
//!
//! An operator or element type the backend cannot execute is a [`CompileError`] naming
//! the operator, the instruction and the source line; nothing is produced.

mod attributes;
mod lower;
mod operators;
mod passes;
mod regions;
mod sdy;
mod simplify;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use crate::hlo::{self, HloModule};
use crate::isa::{FloatFormat, Program};
use neuron_datastore::topology::NeuronCoreVersion;

/// Alignment of intermediate buffers in the scratchpad.
pub const SCRATCHPAD_ALIGNMENT: u64 = 64;

/// How deeply `call`s may nest before the module is rejected as recursive.
const MAX_CALL_DEPTH: usize = 64;
/// How deeply tuples may nest.
const MAX_TUPLE_DEPTH: usize = 64;
/// How many HLO instructions a module may expand to once calls are inlined; a few
/// lines that call a computation twice per level would otherwise expand exponentially.
pub const MAX_LOWERED_INSTRUCTIONS: usize = 1_000_000;

/// `neuron-cc --target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "lowercase")]
pub enum Target {
    #[default]
    Trn1,
    Trn1n,
    Inf2,
    Trn2,
}

impl Target {
    pub const ALL: &[Target] = <Target as strum::VariantArray>::VARIANTS;

    /// `trn1`, `trn1n`, `inf2` or `trn2`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn core_version(self) -> NeuronCoreVersion {
        match self {
            Target::Trn2 => NeuronCoreVersion::V3,
            Target::Trn1 | Target::Trn1n | Target::Inf2 => NeuronCoreVersion::V2,
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Target::ALL
            .iter()
            .copied()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown target `{s}`; use trn1, trn1n, inf2 or trn2"))
    }
}

/// `neuron-cc --auto-cast`: which f32 operations compute in the `--auto-cast-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCast {
    /// f32 stays f32 everywhere.
    None,
    /// The operands of f32 matrix products are rounded to the auto-cast type; the
    /// product accumulates and returns f32 (the PE array's accumulators are f32).
    #[default]
    MatMult,
    /// Every f32 value is rounded to the auto-cast type: parameters, constants and the
    /// result of every operation that computes new values.
    All,
}

impl FromStr for AutoCast {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(AutoCast::None),
            "matmult" => Ok(AutoCast::MatMult),
            "all" => Ok(AutoCast::All),
            _ => Err(format!("unknown auto-cast mode `{s}`; use none, matmult or all")),
        }
    }
}

/// `neuron-cc --auto-cast-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCastType {
    #[default]
    Bf16,
    Fp16,
    Tf32,
    Fp8E4m3,
}

impl AutoCastType {
    pub fn format(self) -> FloatFormat {
        match self {
            AutoCastType::Bf16 => FloatFormat::Bf16,
            AutoCastType::Fp16 => FloatFormat::Fp16,
            AutoCastType::Tf32 => FloatFormat::Tf32,
            AutoCastType::Fp8E4m3 => FloatFormat::Fp8E4m3,
        }
    }
}

impl FromStr for AutoCastType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(AutoCastType::Bf16),
            "fp16" => Ok(AutoCastType::Fp16),
            "tf32" => Ok(AutoCastType::Tf32),
            "fp8_e4m3" => Ok(AutoCastType::Fp8E4m3),
            _ => Err(format!("unknown auto-cast type `{s}`; use bf16, fp16, tf32 or fp8_e4m3")),
        }
    }
}

/// `neuron-cc --optlevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum OptLevel {
    /// Every HLO instruction as written; each intermediate keeps its own scratchpad space.
    O1,
    /// Also computes at compile time what depends on constants alone (except
    /// broadcasts and iotas, cheaper to run than to store), lets matrix products read
    /// transposed operands in place (when the result's order allows), removes
    /// instructions whose results are never used, and reuses the scratchpad space of
    /// intermediates once they are dead.
    #[default]
    O2,
    /// Also removes copies that change nothing (`copy` and sharding annotations,
    /// reshapes to the same shape, identity transposes), so their readers use the
    /// original buffer.
    O3,
}

impl FromStr for OptLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1" => Ok(OptLevel::O1),
            "2" => Ok(OptLevel::O2),
            "3" => Ok(OptLevel::O3),
            _ => Err(format!("unknown optimisation level `{s}`; use 1, 2 or 3")),
        }
    }
}

/// Everything `neuron-cc compile` can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileOptions {
    pub target: Target,
    pub auto_cast: AutoCast,
    pub auto_cast_type: AutoCastType,
    /// Reductions over bf16 or fp16 values (and, with `--auto-cast all`, over f32
    /// values) accumulate in f32 and round once; otherwise every partial result is
    /// rounded to the narrow type.
    pub mixed_precision_accumulation: bool,
    /// The roundings the compiler inserts turn out-of-range values and infinities into
    /// the largest finite value of the narrow type instead of infinity.
    pub saturate_infinity: bool,
    pub optlevel: OptLevel,
}

impl CompileOptions {
    /// The defaults (as on trn1: matrix-product operands in bf16, fp32 accumulation) for `target`.
    pub fn new(target: Target) -> CompileOptions {
        CompileOptions { target, ..CompileOptions::default() }
    }

    /// Options under which a program computes as XLA:CPU computes it: f32 stays f32
    /// and reductions over narrow floats accumulate in f32.
    pub fn exact(target: Target) -> CompileOptions {
        CompileOptions {
            target,
            auto_cast: AutoCast::None,
            mixed_precision_accumulation: true,
            ..CompileOptions::default()
        }
    }
}

/// A module that cannot be compiled: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CompileError {
    /// 1-based source line, when the error belongs to one.
    pub line: Option<usize>,
    /// The HLO instruction, when the error belongs to one.
    pub instruction: Option<String>,
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.instruction, self.line) {
            (Some(name), Some(line)) => {
                write!(f, "line {line}, instruction `{name}`: {}", self.message)
            }
            (None, Some(line)) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl From<hlo::ParseError> for CompileError {
    fn from(e: hlo::ParseError) -> Self {
        CompileError {
            line: Some(e.line),
            instruction: None,
            message: format!("syntax error at column {}: {}", e.column, e.message),
        }
    }
}

/// Parses and lowers HLO text for `target` with the default options.
pub fn compile_hlo(text: &str, target: Target) -> Result<Program, CompileError> {
    compile_hlo_with(text, &CompileOptions::new(target))
}

/// Parses and lowers HLO text.
pub fn compile_hlo_with(text: &str, options: &CompileOptions) -> Result<Program, CompileError> {
    compile_hlo_sharded(text, options).map(|(program, _)| program)
}

/// Parses and lowers HLO text, and says how a Shardy multi-device module
/// (`jax.shard_map`, `jax.pmap`) splits its inputs and results over its mesh: the
/// program is then one rank's (`None`: a program of one device).
pub fn compile_hlo_sharded(text: &str, options: &CompileOptions) -> Result<(Program, Option<Sharding>), CompileError> {
    let module = hlo::parse_module(text)?;
    lower_module(&module, options)
}

/// Lowers a parsed module; a Shardy multi-device module lowers to one rank's program.
pub(crate) fn lower_module(
    module: &HloModule,
    options: &CompileOptions,
) -> Result<(Program, Option<Sharding>), CompileError> {
    let localized = sdy::localize(module).map_err(|(line, message)| CompileError {
        line: Some(line),
        instruction: None,
        message,
    })?;
    match localized {
        Some((rank, sharding)) => Ok((lower::lower(&rank, options)?, Some(sharding))),
        None => Ok((lower::lower(module, options)?, None)),
    }
}

pub use operators::{CUSTOM_CALL_TARGETS, SUPPORTED_OPERATORS, engine_of_operator};
pub use sdy::{ShardedValue, Sharding};
