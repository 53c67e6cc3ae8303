//! What the findings advise, in the words of the program's own front end, and only
//! what holds for the capture: nothing already in effect, nothing the capture's host
//! measured slower.

/// How the traced program runs its models, which the remedies are phrased for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// `neuron_virt` from Python: `Model.schedule(...)`.
    Python,
    /// The C API: `nrta_execute_schedule`.
    C,
    /// `neuron-profile capture` (and `neuron-bench`): `--exec-mode async`.
    Cli,
    /// PyTorch through torch-xla (the PJRT plugin's graphs): the step's graph runs when
    /// torch-xla is asked for a value or at `xm.mark_step()`.
    TorchXla,
}

impl FrontEnd {
    /// From a file: torch-xla when its graphs came through the PJRT plugin (it has
    /// `graph_compile` events, or models named as torch-xla names its graphs), else
    /// from its metadata.
    pub fn of_file(file: &crate::NtffFile) -> FrontEnd {
        let torch = file.find_string("graph_compile").is_some()
            || file.models().iter().any(|m| m.name.starts_with("SyncTensorsGraph."));
        if torch { FrontEnd::TorchXla } else { FrontEnd::of_metadata(file.metadata()) }
    }

    /// From a file's metadata: its capture kind, else the traced command.
    pub fn of_metadata(meta: &crate::Metadata) -> FrontEnd {
        match meta.capture_kind.as_str() {
            "python" => return FrontEnd::Python,
            "capture" => return FrontEnd::Cli,
            _ => {}
        }
        let program = meta.command.first().map_or("", |c| c.rsplit('/').next().unwrap_or(c));
        if program.starts_with("python") {
            FrontEnd::Python
        } else if program.starts_with("neuron-bench") || program.starts_with("neuron-profile") {
            FrontEnd::Cli
        } else {
            FrontEnd::C
        }
    }
}

/// What the advice depends on besides the figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Advice {
    pub front_end: FrontEnd,
    /// The matrix products already run as bf16 products (`MatMulBf16` instructions).
    pub bf16_in_effect: bool,
    /// Whether the capture's host runs bf16 products faster than f32, as its runtime
    /// measured; `None` when the file does not say.
    pub bf16_faster: Option<bool>,
}

impl Advice {
    /// What to do when the device waits for the host between executions; `scheduled`:
    /// the executions were already scheduled asynchronously.
    pub(crate) fn host_bound(&self, scheduled: bool) -> String {
        match (self.front_end, scheduled) {
            (FrontEnd::Python, true) => "the requests were scheduled about one at a time: call `Model.schedule(...)` 2 or more times before waiting on the first request".into(),
            (FrontEnd::Python, false) => "each call waits for its execution (`model(...)`, `Model.run(...)`) and the core waits for the next call: schedule them with `Model.schedule(...)` (a model from `Runtime.load`), keeping 2 or more requests in flight".into(),
            (FrontEnd::C, true) => "the requests were scheduled about one at a time: call `nrta_execute_schedule` 2 or more times before waiting".into(),
            (FrontEnd::C, false) => "the host submits one execution at a time (`nrt_execute`) and the core waits for each call: schedule them with `nrta_execute_schedule`, keeping 2 or more in flight".into(),
            (FrontEnd::Cli, true) => "the requests were scheduled about one at a time: keep 2 or more in flight (`--exec-mode async`)".into(),
            (FrontEnd::Cli, false) => "the host submits one execution at a time and the core waits for each: run with `--exec-mode async` to keep 2 or more in flight".into(),
            (FrontEnd::TorchXla, _) => "torch-xla traces each step's graph on the host before it runs: keep values on the device between steps (no `loss.item()` or printing every step), feed batches with `torch_xla.distributed.parallel_loader.MpDeviceLoader` (it moves the next batch while a step runs), and make each step larger (a bigger batch, or gradient accumulation within one graph)".into(),
        }
    }

    /// What to do about matrix products that take the time (`top`: the instruction
    /// that takes the most).
    pub(crate) fn products(&self, top: &str) -> String {
        match (self.bf16_in_effect, self.bf16_faster) {
            (true, _) => format!(
                "matrix products take the time{top}, already as bf16 products: make them fewer or larger (batch small products into one, keep weights resident instead of recomputing them)"
            ),
            (false, Some(true)) => format!(
                "matrix products take the time{top} in f32: compile with `neuron-cc --auto-cast matmult` (the default) to run them as bf16 products, which this host runs faster"
            ),
            (false, Some(false)) => format!(
                "matrix products take the time{top}: this host runs bf16 products no faster than f32, so auto-cast would not speed them up; make them fewer or larger (batch small products into one)"
            ),
            (false, None) => format!(
                "matrix products take the time{top} in f32: where the host has AVX512-BF16, `neuron-cc --auto-cast matmult` (the default) may run them faster as bf16 products"
            ),
        }
    }
}
