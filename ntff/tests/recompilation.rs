//! A graph compiled after the process's first executions (`graph_compile` with
//! `executions_before` of 3 or more) is a finding that says what made it new; the first
//! steps' graphs are not.

use ntff::{Arg, ArgValue, Clock, Metadata, NtffFile, Phase, SystemEvent, Writer};

#[test]
fn a_graph_compiled_after_the_first_steps_is_a_recompilation_finding() {
    let mut writer = Writer::new(Vec::new(), &Metadata { pid: 1, ..Metadata::default() }).expect("header");
    let name = writer.intern("graph_compile");
    let (detail, before, compile) =
        (writer.intern("detail"), writer.intern("executions_before"), writer.intern("compile_us"));
    let graphs = [
        ("graph SyncTensorsGraph.10 (aaaa0000)", 0, 2_000),
        ("graph SyncTensorsGraph.12 (bbbb1111): a new graph of 7 parameters", 2, 3_000),
        (
            "graph SyncTensorsGraph.10 (cccc2222): input shapes differ from SyncTensorsGraph.10's: parameter 0 f32[32,64] -> f32[16,64]",
            41,
            25_000,
        ),
    ];
    for (k, (text, executions, us)) in graphs.iter().enumerate() {
        let text = writer.intern(text);
        let event = SystemEvent {
            core: None,
            id: k as u64,
            name,
            phase: Phase::Instant,
            clock: Clock::Host,
            timestamp_ns: 1_000_000 * (k as u64 + 1),
            tracking_id: 0,
            thread_id: 1,
            exec_id: None,
            model_id: None,
            nrta_seq_id: None,
            args: vec![
                Arg { key: detail, value: ArgValue::Str(text) },
                Arg { key: before, value: ArgValue::U64(*executions) },
                Arg { key: compile, value: ArgValue::U64(*us) },
            ],
        };
        writer.system(&event).expect("write");
    }
    let (bytes, _) = writer.finish().expect("finish");
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let summary = ntff::summary::summarise(&file, None);
    let found: Vec<&ntff::summary::Finding> = summary.findings.iter().filter(|f| f.kind == "recompilation").collect();
    assert_eq!(found.len(), 1, "{:#?}", summary.findings);
    let finding = found[0];
    assert_eq!(finding.about, "SyncTensorsGraph.10");
    assert!(
        finding.text.starts_with("graph recompiled after 41 executions: graph SyncTensorsGraph.10"),
        "{}",
        finding.text
    );
    assert!(finding.text.contains("parameter 0 f32[32,64] -> f32[16,64]"), "{}", finding.text);
    assert_eq!(finding.evidence, "compiling it took 25.0 ms");
    assert!((finding.saves_s - 0.025).abs() < 1e-9);
    assert!(finding.suggestion.as_deref().is_some_and(|s| s.contains("drop_last=True")));
    let text = ntff::summary::to_text(&summary, "steps.ntff");
    assert!(text.contains("graph recompiled after 41 executions"), "{text}");
}
