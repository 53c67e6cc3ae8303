//! What `neuron-top` shows, as plain data: filled by the collector from the runtimes'
//! datastores and `/proc`, or built by hand in tests. `None` is a figure that could not
//! be measured (yet): it shows as `N/A`, never as 0.

use serde::Serialize;

/// Everything on the screen at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    /// Wall-clock time of the sample, `HH:MM:SSZ` (UTC).
    pub time: String,
    pub instance: Instance,
    pub system: System,
    pub runtimes: Vec<Runtime>,
    /// The communicators the runtimes take part in, as their flight records show them
    /// (see [`crate::ranks`]).
    pub ranks: Vec<crate::ranks::GroupView>,
    /// What could not be read (a refused directory, a datastore that does not open),
    /// so that a problem does not look like an idle host.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Instance {
    pub instance_type: String,
    pub device_count: u32,
    pub cores_per_device: u32,
    /// `v2`, `v3`.
    pub core_version: String,
}

/// The host.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct System {
    /// Percent of all CPUs, over the last interval.
    pub vcpu: Option<CpuShare>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuShare {
    pub user: f64,
    pub system: f64,
}

/// A runtime process.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Runtime {
    pub pid: u32,
    /// `NEURON_PROCESS_TAG`, else the command's name (see [`crate::Followed::label`]).
    pub tag: String,
    /// The command line, quoted as a shell takes it. Not serialised: the JSON goes to
    /// pages that other local users may reach, and a command line can hold secrets.
    #[serde(skip)]
    pub command: String,
    /// Exited since the last look: shown dimmed for a while, then removed.
    pub exited: bool,
    /// `live`; `stopped` or `stale` (its process is there but its heartbeat is old: a
    /// stopped or unscheduled process, which keeps its cores and is live again when it
    /// resumes); or `exited` (see [`crate::Liveness`]).
    pub state: &'static str,
    /// Percent of one CPU's worth of all CPUs, as `neuron-monitor` reports it.
    pub vcpu: Option<CpuShare>,
    pub cores: Vec<Core>,
    /// The process's resident memory (`VmRSS`): everything it holds in RAM, the
    /// runtime's allocations, the interpreter, the program's own data.
    pub resident_bytes: Option<u64>,
    /// The runtime's own host allocations, by category (application memory,
    /// constants, DMA buffers, tensors), as `neuron-monitor`'s `host_memory` reports them.
    pub host_memory: HostMemory,
    pub models: Vec<Model>,
    /// Errors by class since the runtime started, in `ERROR_CLASSES` order.
    #[serde(serialize_with = "by_class")]
    pub errors: [u64; 6],
    /// Trace events produced per second over the last interval.
    pub trace_events_per_second: Option<f64>,
    /// Trace events lost (refused by a full ring) since the runtime started.
    pub trace_events_dropped: u64,
    /// PE's defined peak of one of its cores, in FLOP/s: what its FLOP/s are measured
    /// against (`None` for runtimes that do not say how many threads they compute on).
    pub peak_flops_per_core: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HostMemory {
    pub application_memory: u64,
    pub constants: u64,
    pub dma_buffers: u64,
    pub tensors: u64,
}

impl HostMemory {
    pub fn total(&self) -> u64 {
        self.application_memory + self.constants + self.dma_buffers + self.tensors
    }

    pub fn add(&mut self, other: &HostMemory) {
        self.application_memory += other.application_memory;
        self.constants += other.constants;
        self.dma_buffers += other.dma_buffers;
        self.tensors += other.tensors;
    }
}

/// Device memory of a core or a model by category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    pub tensors: u64,
    pub constants: u64,
    pub model_code: u64,
    pub runtime_memory: u64,
    pub model_shared_scratchpad: u64,
}

impl DeviceMemory {
    pub fn total(&self) -> u64 {
        self.tensors + self.constants + self.model_code + self.runtime_memory + self.model_shared_scratchpad
    }

    pub fn add(&mut self, other: &DeviceMemory) {
        self.tensors += other.tensors;
        self.constants += other.constants;
        self.model_code += other.model_code;
        self.runtime_memory += other.runtime_memory;
        self.model_shared_scratchpad += other.model_shared_scratchpad;
    }

    /// The categories with their display names, in display order.
    pub fn categories(&self) -> [(&'static str, u64); 5] {
        [
            ("tensors", self.tensors),
            ("constants", self.constants),
            ("model code", self.model_code),
            ("runtime memory", self.runtime_memory),
            ("model scratchpad", self.model_shared_scratchpad),
        ]
    }
}

/// A NeuronCore a runtime holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Core {
    /// Host-wide index.
    pub index: u32,
    pub device: u32,
    /// Percent of the last interval the core was executing.
    pub utilization: Option<f64>,
    pub flops_per_second: Option<f64>,
    pub executions_per_second: Option<f64>,
    /// Total latency (host call to return) over the last interval, seconds; `None`
    /// when nothing completed.
    pub latency_p50: Option<f64>,
    pub latency_p99: Option<f64>,
    /// Utilisation of the last intervals, oldest first.
    pub history: Vec<f64>,
    /// FLOP/s of the same intervals.
    pub flops_history: Vec<f64>,
    /// Latency p50 of the same intervals, seconds (`None`: nothing completed).
    pub latency_history: Vec<Option<f64>>,
    pub device_memory: DeviceMemory,
}

/// A loaded model.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Model {
    pub model_id: u32,
    pub name: String,
    pub core: u32,
    pub device_memory: DeviceMemory,
    pub host_memory: u64,
    /// Executions since it was loaded.
    pub executions: u64,
    /// Over the last interval; `None` before two looks.
    pub executions_per_second: Option<f64>,
    /// Total latency of its executions over the last interval, seconds; `None` when
    /// none completed.
    pub latency_p50: Option<f64>,
    pub latency_p99: Option<f64>,
}

/// Error class names, in `ErrorClass` order.
pub const ERROR_CLASSES: [&str; 6] = ["generic", "numerical", "transient", "model", "runtime", "hardware"];

/// Errors as a map from class name to count.
fn by_class<S: serde::Serializer>(errors: &[u64; 6], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(ERROR_CLASSES.iter().zip(errors))
}
