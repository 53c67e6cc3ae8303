//! Any byte string given to the NTFF reader opens as a (possibly partial) trace or
//! fails with a typed error, never a panic; every chunk it lists decodes or reports
//! damage (the same when decoded into a previous chunk's buffers), every id an event
//! holds resolves or is absent, and it summarises without panicking. Whatever it opens
//! exports to a Perfetto trace that passes `verify_perfetto`, and to Chrome JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ntff::NtffFile;
use ntff::export::{ExportOptions, Format, export, verify_perfetto};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = NtffFile::from_bytes(data.to_vec()) else { return };
    let _ = file.recovery().describe();
    let mut spare = ntff::Chunk::default();
    for info in file.chunks() {
        let Ok(chunk) = file.read_chunk(info) else { continue };
        // Decoding into the buffers of the previous chunk gives the same chunk.
        let reused = file.read_chunk_reusing(info, std::mem::take(&mut spare));
        assert_eq!(reused.as_ref().ok(), Some(&chunk), "a chunk decoded into reused buffers differs");
        for event in &chunk.system {
            let _ = file.string_or_placeholder(event.name);
        }
        for event in &chunk.device {
            let _ = file.descriptor(event.descriptor);
        }
        spare = chunk;
    }
    let _ = ntff::summary::summarise(&file, None);
    let files = [file];
    let options = ExportOptions::default();
    if let Ok((trace, _)) = export(&files, &options, Format::Perfetto, Vec::new(), &mut |_| {}) {
        if let Err(problem) = verify_perfetto(&trace) {
            panic!("the export of an opened file is not a valid trace: {problem}");
        }
    }
    let _ = export(&files, &options, Format::ChromeJson, std::io::sink(), &mut |_| {});
});
