//! The kernels an optimised build uses by default (bf16-rounded products on AVX-512F,
//! AVX512-BF16 or AMX tiles, and the choice among them at start) are compiled out of
//! debug builds, which the suite is built in: this runs their unit tests in the release
//! profile (`cargo test --release -p neuron-runtime --lib backend::kernels`, built once
//! and kept under `target/release`), and fails where this CPU has a kernel's
//! instructions and its test did not run them.

use std::process::Command;

#[test]
fn the_kernels_of_an_optimised_build_pass_their_tests_on_this_cpu() {
    if !cfg!(debug_assertions) {
        eprintln!("an optimised build runs the kernels' tests itself");
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["test", "--release", "--quiet", "-p", "neuron-runtime", "--lib", "backend::kernels", "--"])
        .args(["--nocapture", "--test-threads", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("runs cargo");
    let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the kernels' tests failed in the release profile:\n{log}");
    let choice = log.lines().find(|l| l.starts_with("the kernel of bf16-rounded products on this host: "));
    let choice = choice.unwrap_or_else(|| panic!("the kernel choice's test did not run:\n{log}"));
    eprintln!("{choice}");
    // A kernel this CPU has the instructions of ran its test (AMX also needs the
    // kernel's permission, which its own test asks for: it may skip).
    #[cfg(target_arch = "x86_64")]
    for (kernel, has) in [
        ("rounded_f32", std::arch::is_x86_feature_detected!("avx512f")),
        ("bf16", std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512bw")),
    ] {
        let skipped = log.contains(&format!("skipped the {kernel} kernel"));
        assert!(!(has && skipped), "this CPU has the {kernel} kernel's instructions, and its test skipped it:\n{log}");
        if !has {
            eprintln!("note: this CPU lacks the {kernel} kernel's instructions; its test checks nothing here");
        }
    }
    if log.contains("skipped the amx kernel") {
        eprintln!("note: no AMX tiles here; the amx kernel's test checks nothing (an Intel Xeon with AMX runs it)");
    }
}
