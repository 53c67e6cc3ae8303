//! A job's profiles per rank: `neuron-profile inspect` under a real `mpirun` (one
//! process per rank) writes each process's profile as `profile_rank_<id>.ntff`, and
//! `view -d` reads them together: every collective on one clock, in a table, and the
//! rank made late by `cc_delay` named as the first finding.

use std::process::Command;

use neuron_test_support::process::{Sandbox, all_reduce_hlo, mpirun};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

/// `neuron-profile view -d dir --output-format format [--output-file out]`, which must
/// succeed.
fn view_dir(dir: &std::path::Path, format: &str, out: Option<&std::path::Path>) -> std::process::Output {
    let mut view = Command::new(env!("CARGO_BIN_EXE_neuron-profile"));
    view.args(["view", "-d"]).arg(dir).args(["--output-format", format]);
    if let Some(out) = out {
        view.arg("--output-file").arg(out);
    }
    let output = view.output().expect("view runs");
    let said = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(output.status.success(), "{format}: {}{}", said(&output.stdout), said(&output.stderr));
    output
}

#[test]
fn a_jobs_rank_profiles_are_named_per_rank_and_read_together_naming_the_late_rank() {
    let sandbox = Sandbox::new();
    let profiles = sandbox.path().join("profiles");
    let hlo = all_reduce_hlo(sandbox.path(), 4096);
    let port = neuron_test_support::process::free_port();
    let mut program = Command::new(env!("CARGO_BIN_EXE_neuron-profile"));
    sandbox
        .env(&mut program)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
        .env("NEURON_RT_FAULT_INJECT", "cc_delay:rank=2:delay=20ms")
        .args(["inspect", "-o"])
        .arg(&profiles)
        .arg(env!("CARGO_BIN_EXE_neuron-bench"))
        .args(["exec", "--iterations", "12"])
        .arg(&hlo);
    let Some(mut mpirun) = mpirun(4, &program) else { return };
    let output = mpirun.output().expect("mpirun runs");
    let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{log}");
    let mut names: Vec<String> = std::fs::read_dir(&profiles)
        .expect("the profiles")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["profile_rank_0.ntff", "profile_rank_1.ntff", "profile_rank_2.ntff", "profile_rank_3.ntff"]);

    let view = view_dir(&profiles, "summary-text", None);
    let text = String::from_utf8_lossy(&view.stdout);
    assert!(text.starts_with("Ranks: 4 profiles with collectives; 4 of them with clock anchors"), "{text}");
    assert!(text.contains(": 4 ranks; orderings closer than ±"), "{text}");
    // Each file recorded the group's members, as its process saw them open.
    let members = text.lines().find(|l| l.starts_with("members, as recorded: ")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(members.matches(" (pid ").count(), 4, "{members}");
    let finding = text.lines().find(|l| l.starts_with("  1. ")).unwrap_or_else(|| panic!("no finding: {text}"));
    // Named with its host and pid, as every tool names a rank.
    assert!(finding.starts_with("  1. rank 2 (pid ") && finding.contains(" on host "), "{finding}");
    // With what it was doing before it arrived: inside its execution, its delay held
    // it there with no instruction running, while the others came at once.
    let before =
        text.lines().find(|l| l.trim_start().starts_with("before it arrived")).unwrap_or_else(|| panic!("{text}"));
    assert!(before.contains("on median over 11 steps") && before.contains("executing"), "{before}");
    assert!(before.contains("; the other ranks: "), "{before}");
    assert!(finding.contains("of 12 steps"), "{finding}");
    let rows: Vec<&str> =
        text.lines().filter(|l| l.trim_start().starts_with('#') && l.contains("all-reduce")).collect();
    assert_eq!(rows.len(), 12, "a row per collective: {text}");
    // Columns: seq, operation, bytes, algorithm, skew (a number and a unit), last, …
    // Rank 2 is last in every collective once the job runs: the first ones also wait
    // for the processes' start, whose order a loaded host decides.
    let last: Vec<Option<&str>> = rows.iter().map(|r| r.split_whitespace().nth(6)).collect();
    assert!(last[2..].iter().all(|l| *l == Some("2")), "rank 2 last: {text}");

    // The same as JSON, beside each file's summary.
    let json = view_dir(&profiles, "summary-json", None);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let comm = &json["ranks"]["communicators"][0];
    assert_eq!(comm["straggler"]["rank"], 2, "{comm:#}");
    // Rank 2's 20 ms delay is in its time before its arrivals, not in the others'.
    let mine = comm["straggler_before"]["since_previous_ns"].as_u64().expect("the straggler's time before");
    let others = comm["others_since_previous_ns"].as_u64().expect("the others' time before");
    assert!(mine >= 15_000_000 && others * 4 < mine, "rank 2 {mine} ns, the others {others} ns: {comm:#}");
    assert_eq!(comm["collectives"].as_array().map(Vec::len), Some(12));
    assert!(comm["collectives"][5]["busbw_gb_per_s"].as_f64().is_some_and(|b| b > 0.0), "{comm:#}");
    assert_eq!(json["ranks"]["profiles"].as_array().map(Vec::len), Some(4));
    assert_eq!(json["files"].as_array().map(Vec::len), Some(4), "each file's summary");
    // Each rank's time in its all-reduce is waiting, not an instruction's bound: no
    // roofline remedy for it, and the ranks that waited for rank 2 say so.
    let files = json["files"].as_array().expect("the summaries");
    let mut waited = 0;
    for file in files {
        for row in file["top_hlo_instructions"].as_array().into_iter().flatten().filter(|r| r["hlo"] == "r") {
            assert_eq!(row["bound"], "collective", "{row:#}");
            assert!(row["roofline_percent"].is_null() && row["intensity"].is_null(), "{row:#}");
        }
        let findings = file["findings"].as_array().expect("findings");
        for f in findings {
            let advice = f["suggestion"].as_str().unwrap_or_default();
            assert!(!advice.contains("bf16") && !advice.contains("fuse"), "{f:#}");
        }
        waited += usize::from(findings.first().is_some_and(|f| f["kind"] == "collective wait"));
    }
    assert!(waited >= 3, "the three ranks that waited 20 ms each execution: {files:#?}");

    // The Parquet tables give each system event its rank and communicator.
    let tables = sandbox.path().join("tables");
    view_dir(&profiles, "parquet", Some(&tables));
    let mut checked = 0;
    for dir in std::fs::read_dir(&tables).expect("a directory per file").flatten() {
        let rank: u32 = dir.file_name().to_string_lossy().trim_start_matches("profile_rank_").parse().expect("a rank");
        let file = std::fs::File::open(dir.path().join("system_events.parquet")).expect("system_events");
        let reader = SerializedFileReader::new(file).expect("Parquet");
        let (mut communicators, mut collectives) = (std::collections::BTreeSet::new(), 0);
        for row in reader.get_row_iter(None).expect("rows") {
            let row = row.expect("a row");
            let field = |name: &str| row.get_column_iter().find(|(n, _)| n.as_str() == name).map(|(_, f)| f.clone());
            if field("name") != Some(Field::Str("cc_running".into())) {
                continue;
            }
            collectives += 1;
            assert_eq!(field("rank"), Some(Field::Long(i64::from(rank))), "{row:?}");
            match field("communicator") {
                Some(Field::Long(id)) => communicators.insert(id),
                other => panic!("no communicator: {other:?}"),
            };
        }
        assert_eq!(collectives, 24, "12 collectives, a start and a stop each, of rank {rank}");
        assert_eq!(communicators.len(), 1, "one communicator");
        checked += 1;
    }
    assert_eq!(checked, 4);

    // Perfetto: a process per rank, and one flow through each collective's parts.
    let trace = sandbox.path().join("job.pftrace");
    let perfetto = view_dir(&profiles, "perfetto", Some(&trace));
    let said = String::from_utf8_lossy(&perfetto.stderr);
    assert!(said.contains("48 parts of collectives joined across the ranks"), "4 ranks × 12: {said}");
    let check = ntff::export::verify_perfetto(&std::fs::read(&trace).expect("the trace")).expect("a valid trace");
    let processes = check.tracks.iter().filter(|t| t.parent_uuid.is_none()).count();
    assert_eq!(processes, 4, "a process per rank");
    // Each execution's flow to its device execution, and the collectives' 48.
    let executions: u64 = check.tracks.iter().map(|t| t.slice_names.get("nc_exec_running").copied().unwrap_or(0)).sum();
    assert_eq!(check.flows, executions + 48, "{check:?}");
}

#[test]
fn capture_runs_a_collectives_program_as_ranks_and_writes_a_profile_per_rank() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("capture");
    let hlo = all_reduce_hlo(sandbox.path(), 4096);
    // The session file's directory does not exist yet: capture makes it.
    let capture = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-profile"));
        sandbox
            .env(&mut command)
            .env("NEURON_RT_FAULT_INJECT", "cc_delay:rank=2:delay=20ms")
            .args(["capture", "-n"])
            .arg(&hlo)
            .arg("-s")
            .arg(dir.join("profile.ntff"))
            .args(["--num-exec", "10"])
            .args(extra);
        let output = command.output().expect("capture runs");
        let said = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{said}");
        said
    };
    let names = || {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // One rank profiled: only its file.
    let said = capture(&["-r", "4", "--collectives-profile-id", "2"]);
    assert!(said.contains("the 4 workers run on trn1.32xlarge"), "{said}");
    assert!(said.contains("[rank 0] ran 10 executions"), "{said}");
    assert_eq!(names(), ["profile_rank_2.ntff"]);
    // Its file records the whole group: the report knows the ranks it has no profile of.
    let text = String::from_utf8_lossy(&view_dir(&dir, "summary-text", None).stdout).into_owned();
    assert!(text.contains(": 4 ranks; orderings closer than"), "{text}");
    assert!(text.contains("no profile here of ranks 0, 1, 3"), "{text}");
    // Every rank: a file each, which view -d reads together, naming the late rank.
    let said = capture(&["-r", "4"]);
    assert!(said.contains("read the ranks together with: neuron-profile view -d"), "{said}");
    assert_eq!(names(), ["profile_rank_0.ntff", "profile_rank_1.ntff", "profile_rank_2.ntff", "profile_rank_3.ntff"]);
    let text = String::from_utf8_lossy(&view_dir(&dir, "summary-text", None).stdout).into_owned();
    assert!(text.starts_with("Ranks: 4 profiles with collectives; 4 of them with clock anchors"), "{text}");
    let finding = text.lines().find(|l| l.starts_with("  1. ")).unwrap_or_else(|| panic!("no finding: {text}"));
    assert!(finding.starts_with("  1. rank 2 (pid ") && finding.contains("of 10 steps"), "{finding}");
    let members = text.lines().find(|l| l.starts_with("members, as recorded: ")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(members.matches(" (pid ").count(), 4, "{members}");
    assert!(!text.contains("no profile here"), "{text}");
    // A worker that fails stops the others, and the capture says which.
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-profile"));
    let output = sandbox
        .env(&mut command)
        .args(["capture", "-n"])
        .arg(sandbox.path().join("missing.hlo"))
        .args(["-r", "2", "-s"])
        .arg(dir.join("profile.ntff"))
        .output()
        .expect("capture runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("the worker of rank"), "{said}");

    // A rank that dies mid-job: the others end on their own and keep what they
    // recorded, and the report says what failed before anything else.
    std::fs::remove_dir_all(&dir).expect("clean");
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-profile"));
    let output = sandbox
        .env(&mut command)
        .env("NEURON_RT_FAULT_INJECT", "cc_exit:rank=2:after=6")
        .args(["capture", "-n"])
        .arg(&hlo)
        .args(["-r", "4", "--num-exec", "10", "-s"])
        .arg(dir.join("profile.ntff"))
        .output()
        .expect("capture runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("the worker of rank 2 failed") && said.contains("the others ended on their own"), "{said}");
    assert_eq!(
        names(),
        ["profile_rank_0.ntff", "profile_rank_1.ntff", "profile_rank_2.ntff.partial", "profile_rank_3.ntff"]
    );
    let text = String::from_utf8_lossy(&view_dir(&dir, "summary-text", None).stdout).into_owned();
    assert!(
        text.starts_with("FAILED: profile_rank_2.ntff.partial (") && text.contains("was never finished"),
        "the dead rank's file first: {text}"
    );
    // Every survivor's summary starts with its failure, whose first words name the
    // rank that died: rank 2, never a survivor that ended on the same failure.
    let firsts: Vec<&str> = text.lines().filter(|l| l.starts_with("FAILED: first failure on nc")).collect();
    assert_eq!(firsts.len(), 3, "{text}");
    for line in &firsts {
        let message = line.split_once(": status ").map(|(_, m)| m).unwrap_or_default();
        let root = message.split_once(": ").map(|(_, m)| m).unwrap_or_default();
        assert!(root.starts_with("rank 2 (pid ") && root.contains(" died during all-reduce #"), "{root}");
    }
    assert_eq!(text.matches("FAILED: 1 failed execution").count(), 3, "{text}");
}
