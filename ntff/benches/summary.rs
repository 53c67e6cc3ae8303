//! Time to summarise a profile (`ntff::summary::summarise`, bounds and findings
//! included) against decoding its events, the least any summary costs; the best of
//! five runs of each, alternating.
//!
//! Run: `NTFF_BENCH_FILE=big.ntff cargo bench -p ntff --bench summary` (a 10⁷-event
//! file: `PROFILE_BENCH_KEEP_NTFF=big.ntff cargo bench -p neuron-profiler --bench
//! profile -- format`). The same file can be given to this bench built from an older
//! commit, to compare summaries across versions.

use std::time::Instant;

use ntff::NtffFile;

fn main() {
    let Some(path) = std::env::var_os("NTFF_BENCH_FILE") else {
        eprintln!("set NTFF_BENCH_FILE to an NTFF file");
        return;
    };
    let (mut decode, mut summary) = (f64::INFINITY, f64::INFINITY);
    let mut events = 0u64;
    for _ in 0..5 {
        let started = Instant::now();
        let file = NtffFile::open(std::path::Path::new(&path)).expect("opens");
        events = 0;
        for info in file.chunks() {
            let chunk = file.read_chunk(info).expect("chunk");
            events += (chunk.system.len() + chunk.device.len()) as u64;
            std::hint::black_box(&chunk);
        }
        decode = decode.min(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let file = NtffFile::open(std::path::Path::new(&path)).expect("opens");
        std::hint::black_box(ntff::summary::summarise(&file, None));
        summary = summary.min(started.elapsed().as_secs_f64());
    }
    println!(
        "{events} events: summarise {summary:.3} s, decoding {decode:.3} s: {:.2}× ({:.1} M events/s)",
        summary / decode,
        events as f64 / summary / 1e6
    );
}
