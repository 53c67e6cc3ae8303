//! Damaged profiles through every output of `neuron-profile view`: each must name the
//! same unreadable chunk and count the same lost events (issue 40: the summary used to
//! print "0 lost" for a chunk the JSON output warned about), and count the events a lost
//! descriptor table leaves out.

use std::path::Path;
use std::process::{Command, Output};

use ntff::{Descriptor, DeviceEvent, Metadata, NtffFile, SyncPoint, Writer};

const PROFILE: &str = env!("CARGO_BIN_EXE_neuron-profile");

/// A finished profile of 6 chunks of 50 device events on core 0.
fn profile() -> Vec<u8> {
    let metadata = Metadata { runtime_version: "test".into(), pid: 1, ..Metadata::default() };
    let mut w = Writer::new(Vec::new(), &metadata).expect("header");
    w.sync_point(0, SyncPoint { host_ns: 1_000, device_ns: 1_000 }).expect("sync");
    let d = Descriptor::Instruction {
        model_id: 1,
        engine: w.intern("PE"),
        opcode: w.intern("MatMult"),
        hlo: w.intern("dot.1"),
        step: 0,
        flops: 1 << 20,
        bytes_read: 4096,
        bytes_written: 4096,
    };
    let d = w.descriptor(&d);
    for k in 0..300u64 {
        let start_ns = 10_000 + k * 1_000;
        let event = DeviceEvent { core: 0, id: k, exec_id: Some(1), start_ns, end_ns: start_ns + 900, descriptor: d };
        w.device(&event).expect("write");
        if k % 50 == 49 {
            w.flush().expect("flush");
        }
    }
    w.finish().expect("finish").0
}

/// [`profile`] with a bit flipped in the payload of its third chunk; returns the line
/// every output should print about it.
fn damaged_profile(path: &Path) -> String {
    let mut bytes = profile();
    let chunk = NtffFile::from_bytes(bytes.clone()).expect("opens").chunks()[2];
    bytes[chunk.offset as usize + 40] ^= 0x10;
    std::fs::write(path, bytes).expect("write");
    format!("a chunk of 50 events at offset {} could not be read: checksum mismatch", chunk.offset)
}

fn view(file: &Path, args: &[&str]) -> Output {
    let out = Command::new(PROFILE)
        .args(["view", "-s", file.to_str().expect("utf-8"), "--output-format"])
        .args(args)
        .output()
        .expect("runs neuron-profile");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn every_view_output_reports_the_same_damaged_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("damaged.ntff");
    let line = damaged_profile(&file);
    let stdout = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let text = stdout(&view(&file, &["summary-text"]));
    assert!(text.contains("50 in the file") && text.contains(&line), "summary-text:\n{text}");

    let summary: serde_json::Value = serde_json::from_slice(&view(&file, &["summary-json"]).stdout).expect("JSON");
    assert_eq!(summary["events"]["lost_in_file"], 50, "{summary}");
    assert!(summary["file_problems"].as_array().expect("list").iter().any(|p| p == &serde_json::json!(line)));

    let json = view(&file, &["json"]);
    let events: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert!(events["file_problems"].as_array().expect("list").iter().any(|p| p == &serde_json::json!(line)));
    assert_eq!(events["events"].as_array().expect("events").len(), 250);
    assert!(stderr(&json).contains(&line), "{}", stderr(&json));

    for format in ["perfetto", "chrome-json"] {
        let out_file = dir.path().join(format!("trace.{format}"));
        let out = view(&file, &[format, "--output-file", out_file.to_str().expect("utf-8")]);
        assert!(stderr(&out).contains("1 damaged chunks (50 events) could not be read"), "{format}: {}", stderr(&out));
    }

    let tables = dir.path().join("tables");
    let out = view(&file, &["parquet", "--output-file", tables.to_str().expect("utf-8")]);
    assert!(stderr(&out).contains(&line), "parquet: {}", stderr(&out));
}

/// A profile whose descriptor table is damaged: its 300 device events can be counted
/// but not said what they did. Every output says so with the count (the JSON and
/// Perfetto outputs used to drop them without a word, and the summary drew findings
/// from engines it could not see).
#[test]
fn every_view_output_counts_the_device_events_a_lost_descriptor_table_leaves_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("no-descriptors.ntff");
    let bytes = profile();
    // The first byte whose flip loses the descriptor table (and nothing else).
    let damaged = (0..bytes.len())
        .rev()
        .map(|at| {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            b
        })
        .find(|b| {
            NtffFile::from_bytes(b.clone()).is_ok_and(|f| {
                let problems = f.recovery().describe();
                problems.len() == 1 && problems[0].contains("descriptor table lost")
            })
        })
        .expect("a byte of the descriptor table");
    std::fs::write(&file, damaged).expect("write");
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let has = |list: &serde_json::Value, text: &str| {
        list.as_array().expect("a list").iter().any(|p| p.as_str().is_some_and(|p| p.contains(text)))
    };

    let summary: serde_json::Value = serde_json::from_slice(&view(&file, &["summary-json"]).stdout).expect("JSON");
    assert!(has(&summary["file_problems"], "300 device events name no instruction or transfer"), "{summary}");
    assert_eq!(summary["findings"], serde_json::json!([]), "no findings from engines it cannot see");

    let json = view(&file, &["json"]);
    let events: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(events["events"].as_array().expect("events").len(), 0);
    assert!(has(&events["file_problems"], "0 system events and 300 device events were left out"), "{events}");

    for format in ["perfetto", "chrome-json"] {
        let out_file = dir.path().join(format!("trace.{format}"));
        let out = view(&file, &[format, "--output-file", out_file.to_str().expect("utf-8")]);
        assert!(
            stderr(&out).contains("300 device events were left out: their descriptors were lost"),
            "{format}: {}",
            stderr(&out)
        );
    }
}
