//! Shared pieces of the command-line tools: loading models from HLO or NEFF files,
//! NumPy `.npy` input and output, latency statistics and log setup.

pub mod npy;
pub use ntff::stats::{self, si, thousands};

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use neuron_datastore::topology::NeuronCoreVersion;
use neuron_runtime::config::LogLevel;
use neuron_runtime::isa::Program;
use neuron_runtime::{ArrayType, Model, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo};

/// How profiles written by `neuron-profile` name their tool.
pub const PROFILE_TOOL: &str = concat!("neuron-profile ", env!("CARGO_PKG_VERSION"));

/// Lets the process end quietly when stdout is a closed pipe (`neuron-bench ... | head`),
/// as command-line tools do, instead of failing on the next write. Call first in `main`.
pub fn exit_quietly_on_closed_pipe() {
    // SAFETY: restoring the default disposition of SIGPIPE installs no handler code, and
    // this runs at the start of `main`, before the process starts other threads.
    let _ =
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
}

/// Installs a stderr log subscriber at the level `NEURON_RT_LOG_LEVEL` asked for.
pub fn init_logging(level: LogLevel) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level.as_tracing())
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Reads a NEFF, or compiles HLO text into NEFF bytes in memory. A file is taken as
/// HLO when its extension is `.hlo` or `.txt`, or when its text starts with `HloModule`.
pub fn load_model_bytes(path: &Path, target: Target) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read model file {}", path.display()))?;
    let hlo_extension = path.extension().is_some_and(|e| e == "hlo" || e == "txt");
    if hlo_extension || bytes.trim_ascii_start().starts_with(b"HloModule") {
        let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 HLO text", path.display()))?;
        let program = compile_hlo(&text, target).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Neff::new(&model_name(path), program).encode());
    }
    Ok(bytes)
}

/// The compile target of a NeuronCore version.
pub fn target_for(version: NeuronCoreVersion) -> Target {
    match version {
        NeuronCoreVersion::V2 => Target::Trn1,
        NeuronCoreVersion::V3 => Target::Trn2,
    }
}

/// Supplies the bytes of input `i` (of the given type), or `None` for zeros.
pub type InputFill<'a> = dyn FnMut(usize, &ArrayType) -> Result<Option<Vec<u8>>> + 'a;

/// Allocates the tensors of a loaded model on its core and fills the inputs.
pub fn bind_tensors(runtime: &Runtime, model: &Model, fill: &mut InputFill<'_>) -> Result<(TensorSet, TensorSet)> {
    let placement = TensorPlacement::Device { core: model.core() };
    let mut inputs = TensorSet::new();
    for (i, io) in model.inputs().iter().enumerate() {
        let ty = model.tensor_type(io);
        let tensor = runtime.allocate_tensor_for(placement, ty, &format!("{}-{}", model.name(), io.name))?;
        if let Some(bytes) = fill(i, ty)? {
            tensor.write(0, &bytes)?;
        }
        inputs.add(&io.name, tensor);
    }
    let mut outputs = TensorSet::new();
    for io in model.outputs() {
        let ty = model.tensor_type(io);
        outputs.add(&io.name, runtime.allocate_tensor_for(placement, ty, &format!("{}-{}", model.name(), io.name))?);
    }
    Ok((inputs, outputs))
}

/// Reads `.npy` inputs given as (name, index or HLO name; path) pairs, by model input
/// index, checked against the model.
pub fn read_inputs(pairs: &[(&str, &str)], program: &Program) -> Result<Vec<Option<Vec<u8>>>> {
    let mut by_index = vec![None; program.inputs.len()];
    for &(key, path) in pairs {
        let index = program
            .inputs
            .iter()
            .position(|io| {
                io.name == key
                    || io.hlo_name == key
                    || key.parse::<usize>().ok() == io.name.strip_prefix("input").and_then(|n| n.parse().ok())
            })
            .ok_or_else(|| {
                let names: Vec<String> = program
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(i, io)| format!("{i}/{}/{}", io.name, io.hlo_name))
                    .collect();
                anyhow!(
                    "input {key}={path}: the model has no input `{key}` (inputs as index/name/HLO name: {})",
                    names.join(", ")
                )
            })?;
        let (ty, bytes) = npy::read(Path::new(path))?;
        let expected = &program.buffers[program.inputs[index].buffer as usize].ty;
        if &ty != expected {
            bail!("input {key}={path}: the file holds {ty} but input `{}` is {expected}", program.inputs[index].name);
        }
        by_index[index] = Some(bytes);
    }
    Ok(by_index)
}

/// The model name a file stands for: its stem (`mlp` for `models/mlp.hlo`).
pub fn model_name(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// Starts the dashboard on `options.listen`; when that port is taken and `fall_back`
/// is set, on a free port instead. Also returns the port that was taken, if one was.
pub fn start_dashboard(
    mut options: neuron_dashboard::Options,
    fall_back: bool,
) -> Result<(neuron_dashboard::Dashboard, Option<u16>)> {
    let in_use = |e: &anyhow::Error| {
        e.chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse))
    };
    match neuron_dashboard::Dashboard::start(options.clone()) {
        Err(e) if fall_back && options.listen.port() != 0 && in_use(&e) => {
            let taken = options.listen.port();
            options.listen.set_port(0);
            Ok((neuron_dashboard::Dashboard::start(options)?, Some(taken)))
        }
        started => Ok((started?, None)),
    }
}
