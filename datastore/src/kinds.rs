//! The plain enums the datastore's records and counters carry: engines, memory
//! categories, execution outcomes, error classes and collective operations.
//!
//! Their numeric codes are part of the layout (`FORMAT.md`) and their names are the
//! public Neuron names the tools print, so both are fixed here, once, for the writer
//! and every reader.

use serde::{Deserialize, Serialize};
use strum::{EnumCount, EnumString, FromRepr, IntoStaticStr, VariantArray};

/// The NeuronCore engines; the code is the variant's position.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    IntoStaticStr,
    VariantArray,
    FromRepr,
    strum::Display,
)]
#[strum(serialize_all = "UPPERCASE")]
#[repr(u8)]
pub enum Engine {
    /// Tensor engine: matrix products.
    Pe,
    /// Scalar/activation engine: transcendental element-wise functions.
    Act,
    /// Vector engine: arithmetic, compare, select, reduce, layout.
    Dve,
    /// GpSimd engine: iota, gathers, scatters.
    Pool,
    /// Sync engine.
    Sp,
}

impl Engine {
    pub const ALL: &[Engine] = Engine::VARIANTS;

    /// `PE`, `ACT`, `DVE`, `POOL` or `SP`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Device memory categories, as `neuron-monitor` reports them per NeuronCore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum DeviceCategory {
    Tensors,
    Constants,
    ModelCode,
    RuntimeMemory,
    ModelSharedScratchpad,
}

impl DeviceCategory {
    pub const ALL: &[DeviceCategory] = DeviceCategory::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Host memory categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum HostCategory {
    Tensors,
    Constants,
    DmaBuffers,
    ApplicationMemory,
}

impl HostCategory {
    pub const ALL: &[HostCategory] = HostCategory::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// How an execution ended, as `neuron-monitor`'s `execution_summary` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum ExecOutcome {
    Completed = 0,
    CompletedWithErr = 1,
    CompletedWithNumErr = 2,
    TimedOut = 3,
    IncorrectInput = 4,
    FailedToQueue = 5,
}

impl ExecOutcome {
    pub const ALL: &[ExecOutcome] = ExecOutcome::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Error classes, as `neuron-monitor`'s `error_summary` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorClass {
    Generic = 0,
    Numerical = 1,
    Transient = 2,
    Model = 3,
    Runtime = 4,
    Hardware = 5,
}

impl ErrorClass {
    pub const ALL: &[ErrorClass] = ErrorClass::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The operation of a `cc_running` event; the code is the variant's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, FromRepr)]
#[strum(serialize_all = "kebab-case")]
#[repr(u8)]
pub enum CollectiveOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Barrier,
    Send,
    Recv,
}

impl CollectiveOp {
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `barrier`, `send`
    /// or `recv`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The name of the operation an event's code stands for (`unknown` for none).
    pub fn name_of_code(code: u64) -> &'static str {
        u8::try_from(code).ok().and_then(CollectiveOp::from_repr).map_or("unknown", CollectiveOp::name)
    }
}

/// How the data of a collective moves between ranks; the code is the variant's
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, FromRepr)]
#[repr(u8)]
pub enum CollectiveAlgorithm {
    /// Parts of the data passed to the next rank around the group.
    #[strum(serialize = "ring")]
    Ring,
    /// Each rank reads every other rank's data directly.
    #[strum(to_string = "all-to-all", serialize = "alltoall")]
    AllToAll,
}

impl CollectiveAlgorithm {
    /// `ring` or `all-to-all`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The code events carry.
    pub fn code(self) -> u64 {
        self as u64
    }

    /// The name of the algorithm an event's code stands for (`unknown` for none).
    pub fn name_of_code(code: u64) -> &'static str {
        u8::try_from(code).ok().and_then(CollectiveAlgorithm::from_repr).map_or("unknown", CollectiveAlgorithm::name)
    }

    /// `ring`, `all-to-all` (or `alltoall`), or `auto` and empty (`None`: chosen by
    /// size).
    pub fn parse(text: &str) -> Result<Option<CollectiveAlgorithm>, UnknownAlgorithm> {
        match text.trim() {
            "auto" | "" => Ok(None),
            other => other.parse().map(Some).map_err(|_| UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// A name that is not a collectives algorithm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a collectives algorithm (ring, all-to-all or auto)")]
pub struct UnknownAlgorithm(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_public_ones() {
        let engines: Vec<&str> = Engine::ALL.iter().map(|e| e.name()).collect();
        assert_eq!(engines, ["PE", "ACT", "DVE", "POOL", "SP"]);
        assert_eq!(Engine::Dve.to_string(), "DVE");
        assert_eq!(DeviceCategory::ModelSharedScratchpad.name(), "model_shared_scratchpad");
        assert_eq!(HostCategory::ApplicationMemory.name(), "application_memory");
        assert_eq!(ExecOutcome::CompletedWithNumErr.name(), "completed_with_num_err");
        assert_eq!(ErrorClass::ALL.len(), 6);
        assert_eq!(CollectiveOp::name_of_code(2), "reduce-scatter");
        assert_eq!(CollectiveOp::name_of_code(7), "unknown");
        assert_eq!(CollectiveAlgorithm::name_of_code(1), "all-to-all");
        assert_eq!(CollectiveAlgorithm::name_of_code(256), "unknown");
    }

    #[test]
    fn collective_algorithms_parse_as_configured() {
        assert_eq!(CollectiveAlgorithm::parse("auto"), Ok(None));
        assert_eq!(CollectiveAlgorithm::parse(" ring "), Ok(Some(CollectiveAlgorithm::Ring)));
        assert_eq!(CollectiveAlgorithm::parse("alltoall"), Ok(Some(CollectiveAlgorithm::AllToAll)));
        assert!(CollectiveAlgorithm::parse("tree").is_err());
    }
}
