//! Whether this run is CI's, read one way for the whole suite: `CI=true`, which `.ci/run`
//! exports (and most CI services set). There every tool the suite needs is installed,
//! so a test part that finds one missing fails; elsewhere it is skipped with a note.

/// `CI` is `true` (or `1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// `what` is missing on this machine: in CI, a failure that names it; elsewhere a note
/// on stderr that `part` is skipped for want of it.
#[track_caller]
pub fn missing(what: &str, part: &str) {
    assert!(!in_ci(), "{what}, which .ci/run provides: CI=true runs every part of the suite");
    eprintln!("skipped {part}: {what}");
}
