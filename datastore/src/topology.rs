//! The virtual instance: which devices and NeuronCores exist, and how core sets are named.
//!
//! Core indices are global logical indices (`nc0` is core 0 of device 0, `nc2` is core 0
//! of device 1 on a two-core-per-device instance), as `NEURON_RT_VISIBLE_CORES` uses them.

use std::fmt;

use std::str::FromStr;

use strum::{IntoStaticStr, VariantArray};

const GIB: u64 = 1 << 30;

/// The EC2 instance types the virtual device can impersonate.
// The variants spell the instance type names users know (`trn1.2xlarge`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, strum::Display)]
pub enum InstanceType {
    #[strum(serialize = "trn1.2xlarge")]
    Trn1_2xlarge,
    #[strum(serialize = "trn1.32xlarge")]
    Trn1_32xlarge,
    #[strum(serialize = "inf2.xlarge")]
    Inf2_xlarge,
    #[strum(serialize = "inf2.48xlarge")]
    Inf2_48xlarge,
    #[strum(serialize = "trn2.48xlarge")]
    Trn2_48xlarge,
}

/// A name that is not an instance type of [`InstanceType::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown instance type `{0}`; use one of {known}", known = InstanceType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "))]
pub struct UnknownInstanceType(pub String);

/// The instance type used when none is configured.
pub const DEFAULT_INSTANCE_TYPE: InstanceType = InstanceType::Trn1_2xlarge;

/// NeuronCore generation; a NEFF compiled for one generation only loads on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum NeuronCoreVersion {
    V2,
    V3,
}

impl fmt::Display for NeuronCoreVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NeuronCoreVersion::V2 => "v2",
            NeuronCoreVersion::V3 => "v3",
        })
    }
}

impl InstanceType {
    pub const ALL: &[InstanceType] = InstanceType::VARIANTS;

    /// `trn1.2xlarge`, `inf2.48xlarge`, …
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The smallest virtual instance of this one's device type with at least `cores`
    /// NeuronCores (`None` when none has that many).
    pub fn smallest_with(self, cores: u32) -> Option<InstanceType> {
        let device = self.topology().device_type;
        InstanceType::ALL
            .iter()
            .copied()
            .filter(|t| t.topology().device_type == device && t.topology().core_count() >= cores)
            .min_by_key(|t| t.topology().core_count())
    }

    /// The device and core layout of this instance type.
    pub fn topology(self) -> Topology {
        let (device_type, device_count, physical, logical_size, memory) = match self {
            InstanceType::Trn1_2xlarge => ("trainium", 1, 2, 1, 32 * GIB),
            InstanceType::Trn1_32xlarge => ("trainium", 16, 2, 1, 32 * GIB),
            InstanceType::Inf2_xlarge => ("inferentia2", 1, 2, 1, 32 * GIB),
            InstanceType::Inf2_48xlarge => ("inferentia2", 12, 2, 1, 32 * GIB),
            InstanceType::Trn2_48xlarge => ("trainium2", 16, 8, 2, 96 * GIB),
        };
        let core_version = match self {
            InstanceType::Trn2_48xlarge => NeuronCoreVersion::V3,
            _ => NeuronCoreVersion::V2,
        };
        Topology {
            instance_type: self,
            device_type,
            core_version,
            device_count,
            physical_cores_per_device: physical,
            logical_core_size: logical_size,
            device_memory_bytes: memory,
        }
    }
}

impl FromStr for InstanceType {
    type Err = UnknownInstanceType;

    /// An instance type by name, surrounding white space ignored.
    fn from_str(s: &str) -> Result<InstanceType, UnknownInstanceType> {
        let wanted = s.trim();
        InstanceType::ALL.iter().copied().find(|t| t.name() == wanted).ok_or_else(|| UnknownInstanceType(wanted.into()))
    }
}

/// Devices, cores and memory of a virtual instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub instance_type: InstanceType,
    /// `trainium`, `inferentia2` or `trainium2`.
    pub device_type: &'static str,
    pub core_version: NeuronCoreVersion,
    pub device_count: u32,
    pub physical_cores_per_device: u32,
    /// Physical cores fused into one logical NeuronCore (2 on trn2, 1 elsewhere).
    pub logical_core_size: u32,
    /// Device (HBM) memory per device, in bytes.
    pub device_memory_bytes: u64,
}

impl Topology {
    /// The instance the running runtimes say they run on (their datastores' instance
    /// types): the first this build knows, `None` when none does. Every tool shows it,
    /// falling back to its own configuration only when no runtime runs.
    pub fn declared<'a>(declared: impl IntoIterator<Item = &'a str>) -> Option<Topology> {
        declared.into_iter().find_map(|t| t.parse::<InstanceType>().ok()).map(|t| t.topology())
    }

    pub fn cores_per_device(&self) -> u32 {
        self.physical_cores_per_device / self.logical_core_size
    }

    pub fn core_count(&self) -> u32 {
        self.device_count * self.cores_per_device()
    }

    /// The device a global logical core index belongs to.
    pub fn device_of(&self, core: u32) -> u32 {
        core / self.cores_per_device()
    }
}

/// A set of global core indices, kept sorted and without duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoreSet(Vec<u32>);

impl CoreSet {
    pub fn new(mut cores: Vec<u32>) -> Self {
        cores.sort_unstable();
        cores.dedup();
        CoreSet(cores)
    }

    pub fn range(first: u32, last: u32) -> Self {
        CoreSet((first..=last).collect())
    }

    pub fn cores(&self) -> &[u32] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, core: u32) -> bool {
        self.0.binary_search(&core).is_ok()
    }

    /// Parses the `NEURON_RT_VISIBLE_CORES` syntax: `3`, `3-6` or `3,4,5,6` (ranges and
    /// single cores may be mixed: `0,2-3`), for an instance with `core_count` cores.
    pub fn parse(text: &str, core_count: u32) -> Result<CoreSet, CoreSetError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(CoreSetError::Empty);
        }
        let mut cores = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let parse_index =
                |s: &str| s.trim().parse::<u32>().map_err(|_| CoreSetError::NotACore { part: part.to_owned() });
            let (first, last) = match part.split_once('-') {
                Some((first, last)) => (parse_index(first)?, parse_index(last)?),
                None => {
                    let core = parse_index(part)?;
                    (core, core)
                }
            };
            if first > last {
                return Err(CoreSetError::Backwards { part: part.to_owned(), first, last });
            }
            if last >= core_count {
                return Err(CoreSetError::NoSuchCore { core: last, core_count });
            }
            cores.extend(first..=last);
        }
        Ok(CoreSet::new(cores))
    }
}

/// Why a core set does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreSetError {
    #[error("it is empty; give a core (`3`), a range (`3-6`) or a list (`3,4,5`)")]
    Empty,
    #[error("`{part}` is not a core index or range; use forms like `3`, `3-6` or `3,4,5`")]
    NotACore { part: String },
    #[error("range `{part}` runs backwards; write it as `{last}-{first}`")]
    Backwards { part: String, first: u32, last: u32 },
    #[error("core {core} does not exist: there are {core_count} NeuronCores (nc0-nc{})", core_count.saturating_sub(1))]
    NoSuchCore { core: u32, core_count: u32 },
}

impl fmt::Display for CoreSet {
    /// Formats as the runtime's messages do: `nc3-nc6` for a contiguous set, runs
    /// separated by commas otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for &core in &self.0 {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == core => *last = core,
                _ => runs.push((core, core)),
            }
        }
        let text: Vec<String> = runs.iter().map(|(a, b)| format!("nc{a}-nc{b}")).collect();
        f.write_str(&text.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_types_have_the_documented_layouts() {
        let trn1 = InstanceType::Trn1_32xlarge.topology();
        assert_eq!((trn1.device_count, trn1.core_count()), (16, 32));
        let trn2 = InstanceType::Trn2_48xlarge.topology();
        assert_eq!(trn2.cores_per_device(), 4);
        assert_eq!(trn2.core_count(), 64);
        assert_eq!(trn2.device_memory_bytes, 96 << 30);
        assert_eq!(trn2.device_of(5), 1);
        assert_eq!(InstanceType::Inf2_48xlarge.topology().core_count(), 24);
        assert_eq!("inf2.xlarge".parse::<InstanceType>(), Ok(InstanceType::Inf2_xlarge));
        assert!("p4d.24xlarge".parse::<InstanceType>().is_err());
    }

    #[test]
    fn core_sets_parse_every_documented_form() {
        assert_eq!(CoreSet::parse("3", 8).map(|s| s.0), Ok(vec![3]));
        assert_eq!(CoreSet::parse("3-6", 8).map(|s| s.0), Ok(vec![3, 4, 5, 6]));
        assert_eq!(CoreSet::parse("3,4,5,6", 8).map(|s| s.0), Ok(vec![3, 4, 5, 6]));
        assert_eq!(CoreSet::parse(" 0, 2-3 ", 8).map(|s| s.0), Ok(vec![0, 2, 3]));
        for bad in ["", "a", "3-", "6-3", "1,,2", "-1", "8", "0-4294967295"] {
            assert!(CoreSet::parse(bad, 8).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn core_sets_print_as_runtime_messages_do() {
        assert_eq!(CoreSet::range(1, 1).to_string(), "nc1-nc1");
        assert_eq!(CoreSet::new(vec![0, 1, 3]).to_string(), "nc0-nc1,nc3-nc3");
    }
}
