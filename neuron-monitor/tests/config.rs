//! Golden files: each invalid `neuron-monitor` configuration under
//! `tests/data/config/NAME.json` is refused with the message in `NAME.err`,
//! which names the field and the value at fault.

use std::path::Path;

use neuron_monitor::config::MonitorConfig;

#[test]
fn invalid_configurations_are_refused_with_their_golden_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 10, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for case in &cases {
        let text = std::fs::read_to_string(case).expect("case");
        let golden = std::fs::read_to_string(case.with_extension("err"))
            .unwrap_or_else(|_| panic!("{} has no .err file", case.display()));
        match MonitorConfig::parse(&text) {
            Ok(_) => wrong.push(format!("{}: accepted", case.display())),
            Err(e) if e.to_string() != golden.trim_end() => {
                wrong.push(format!("{}:\n  expected: {}\n  got:      {e}", case.display(), golden.trim_end()))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Prints each case's message (`cargo test -- --ignored --nocapture print_messages`),
/// to review before writing it into the golden file.
#[test]
#[ignore = "a helper for writing golden files"]
fn print_messages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config");
    let mut cases: Vec<_> = std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").path()).collect();
    cases.sort();
    for case in cases.iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let text = std::fs::read_to_string(case).expect("case");
        println!(
            "{}\t{}",
            case.file_stem().expect("stem").to_string_lossy(),
            MonitorConfig::parse(&text).err().map(|e| e.to_string()).unwrap_or_default()
        );
    }
}
