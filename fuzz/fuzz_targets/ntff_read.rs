//! Any byte string given to the NTFF reader opens as a (possibly partial) trace or
//! fails with a typed error, never a panic; every chunk it lists decodes or reports
//! damage, and every id an event holds resolves or is absent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ntff::NtffFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = NtffFile::from_bytes(data.to_vec()) else { return };
    let _ = file.recovery().describe();
    for info in file.chunks() {
        let Ok(chunk) = file.read_chunk(info) else { continue };
        for event in &chunk.system {
            let _ = file.string_or_placeholder(event.name);
        }
        for event in &chunk.device {
            let _ = file.descriptor(event.descriptor);
        }
    }
});
