//! Any byte string given to the NEFF decoder yields a NEFF or a typed error, never a
//! panic; a NEFF that decodes can also be re-encoded and decoded to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuron_runtime::neff::{DecodeOptions, Neff};

fuzz_target!(|data: &[u8]| {
    if let Ok(neff) = Neff::decode(data, DecodeOptions { validate_hash: true }) {
        let again = Neff::decode(&neff.encode(), DecodeOptions { validate_hash: true });
        assert_eq!(again.as_ref(), Ok(&neff));
    }
});
