//! HLO instructions ranked by their time in the median traced execution, not by their
//! total: one slow execution among many (a page fault, a preempted thread) must not put
//! an instruction that is usually cheap at the top of the table and of the findings.

mod common;

use ntff::summary::{summarise, to_text};
use ntff::{Clock, Descriptor, DeviceEvent, Metadata, NtffFile, Phase, Writer};

/// Nine traced executions of three HLO instructions on PE: `dot.1` 100 µs in every
/// one; `add.2` 10 µs, but 2 ms in the fifth (more in total than `dot.1`); `while.3`
/// 50 µs in three of them.
fn file_with_one_slow_execution() -> NtffFile {
    let metadata = Metadata { runtime_version: "test".into(), pid: 1, ..Metadata::default() };
    let mut w = Writer::new(Vec::new(), &metadata).expect("header");
    let (execute, running) = (w.intern("nrt_execute"), w.intern("nc_exec_running"));
    let instruction = |w: &mut Writer<Vec<u8>>, hlo: &str, opcode: &str| {
        let d = Descriptor::Instruction {
            model_id: 1,
            engine: w.intern("PE"),
            opcode: w.intern(opcode),
            hlo: w.intern(hlo),
            step: 0,
            flops: 1_000,
            bytes_read: 1_000,
            bytes_written: 1_000,
        };
        w.descriptor(&d)
    };
    let dot = instruction(&mut w, "dot.1", "MatMult");
    let add = instruction(&mut w, "add.2", "TensorTensor");
    let other = instruction(&mut w, "while.3", "TensorTensor");
    let system = common::execution_event;
    let mut t = 1_000_000u64;
    let mut id = 0;
    for exec in 1..=9u64 {
        w.system(&system(execute, Phase::Start, Clock::Host, t, exec)).expect("write");
        w.system(&system(running, Phase::Start, Clock::Device, t, exec)).expect("write");
        let mut runs = vec![(dot, 100_000), (add, if exec == 5 { 2_000_000 } else { 10_000 })];
        if exec % 3 == 0 {
            runs.push((other, 50_000));
        }
        for (descriptor, ns) in runs {
            id += 1;
            w.device(&DeviceEvent { core: 0, id, exec_id: Some(exec), start_ns: t, end_ns: t + ns, descriptor })
                .expect("write");
            t += ns;
        }
        w.system(&system(running, Phase::Stop, Clock::Device, t, exec)).expect("write");
        w.system(&system(execute, Phase::Stop, Clock::Host, t + 1_000, exec)).expect("write");
        t += 10_000;
    }
    let (bytes, _) = w.finish().expect("finish");
    NtffFile::from_bytes(bytes).expect("opens")
}

#[test]
fn instructions_rank_by_their_median_execution() {
    let s = summarise(&file_with_one_slow_execution(), None);
    let rows: Vec<(&str, Option<f64>, f64)> =
        s.hlo_instructions.iter().map(|h| (h.hlo.as_str(), h.median_s, h.time_s)).collect();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), ["dot.1", "add.2", "while.3"], "{rows:?}");
    let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
    assert!(close(rows[0].1, 100e-6) && close(rows[1].1, 10e-6), "{rows:?}");
    // Absent from six of nine executions: its median execution does not run it.
    assert!(close(rows[2].1, 0.0), "{rows:?}");
    // The totals are still there: the slow execution is not hidden.
    assert!(rows[1].2 > rows[0].2, "{rows:?}");
    assert_eq!(s.top_hlo_instructions[0].hlo, "dot.1");
    let text = to_text(&s, "ranking.ntff");
    assert!(text.contains("median"), "{text}");
}
