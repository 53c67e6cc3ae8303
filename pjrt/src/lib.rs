//! `libneuronpjrt.so`: a PJRT C API plugin (the interface XLA frameworks load devices
//! through) over the Neuron virtual runtime. torch-xla opens it when `PJRT_DEVICE=NEURON`
//! (`libneuronxla` in the `neuron-virt` wheel points it here) and asks for
//! [`GetPjrtApi`]; its programs then compile with this project's compiler and run on
//! virtual NeuronCores, in the traces and tools like every other model.
//!
//! What it covers: devices and memories, buffers to and from the host, compiling a
//! serialized `HloModuleProto` (format `"hlo"`), executing it, events and errors. The
//! other functions of the table answer UNIMPLEMENTED with their names. Every exported
//! function runs through [`error::call`], so no panic crosses the C ABI.

mod buffer;
mod cache;
mod client;
mod debug;
mod error;
mod event;
mod executable;
mod ffi;
mod flags;
mod graphs;
mod hlo_text;
mod pool;
mod proto;
mod serialized;
mod table;

/// The runtime the plugin runs this process's programs on, started on first use: the
/// Python package runs its own models on it too, so that a process holds its
/// NeuronCores once whether it reaches them through torch-xla or directly.
pub fn process_runtime() -> neuron_runtime::NrtResult<neuron_runtime::Runtime> {
    client::shared_runtime()
}

/// The plugin's entry point, as PJRT frameworks look it up with `dlsym`.
#[unsafe(no_mangle)]
pub extern "C" fn GetPjrtApi() -> *const std::ffi::c_void {
    match std::panic::catch_unwind(table::api) {
        Ok(api) => (api as *const table::Api).cast(),
        Err(_) => std::ptr::null(),
    }
}

#[cfg(test)]
mod tests;
