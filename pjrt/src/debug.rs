//! `NEURON_FRAMEWORK_DEBUG=1`: every graph the framework compiles is written to the
//! working directory as it came (`<module>.hlo_module.pb`) and as the compiler reads it
//! (`<module>.hlo.txt`).

use std::path::Path;

pub(crate) fn dump(module: &str, proto: &[u8], text: &str) {
    if !std::env::var("NEURON_FRAMEWORK_DEBUG").is_ok_and(|v| v == "1") {
        return;
    }
    let name = crate::hlo_text::name_token(module);
    for (path, bytes) in [(format!("{name}.hlo_module.pb"), proto), (format!("{name}.hlo.txt"), text.as_bytes())] {
        match std::fs::write(Path::new(&path), bytes) {
            Ok(()) => tracing::info!("NEURON_FRAMEWORK_DEBUG: wrote {path}"),
            Err(e) => tracing::warn!("NEURON_FRAMEWORK_DEBUG: cannot write {path}: {e}"),
        }
    }
}
