//! Any text given to the HLO parser and compiler yields a program or an error, never
//! a panic; a program that compiles also passes NEFF validation after a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuron_runtime::neff::{DecodeOptions, Neff};
use neuron_runtime::{Target, compile_hlo};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(program) = compile_hlo(text, Target::Trn1) {
        let bytes = Neff::new("fuzz", program).encode();
        assert!(Neff::decode(&bytes, DecodeOptions::default()).is_ok());
    }
});
