//! The screen, drawn from a fixed snapshot into ratatui's `TestBackend`: snapshots at
//! 80×24 and 160×48, in colour and without; every size down to 1×1 draws without
//! panicking; and the keys, as a state machine.

use neuron_datastore::sample::model::{
    Core, CpuShare, DeviceMemory, HostMemory, Instance, Model, Runtime, Snapshot, System,
};
use neuron_top::input::Action;
use neuron_top::state::{NodeId, State};
use neuron_top::view::{Theme, draw};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;

const MIB: u64 = 1024 * 1024;

fn core(index: u32, utilization: f64, history: &[f64]) -> Core {
    Core {
        index,
        device: index / 2,
        utilization: Some(utilization),
        flops_per_second: Some(utilization * 3.5e7),
        executions_per_second: Some(utilization / 3.0),
        latency_p50: Some(0.0271),
        latency_p99: Some(0.0529),
        history: history.to_vec(),
        flops_history: history.iter().map(|u| u * 3.5e7).collect(),
        latency_history: history.iter().map(|u| (*u > 0.0).then_some(0.02 + u / 5000.0)).collect(),
        device_memory: DeviceMemory {
            tensors: 4 * MIB + 262_144,
            constants: 4,
            model_code: 749,
            runtime_memory: 448,
            model_shared_scratchpad: 2 * MIB + 393_216,
        },
    }
}

fn model(core: u32, id: u32, name: &str) -> Model {
    Model {
        model_id: id,
        name: name.into(),
        core,
        device_memory: DeviceMemory {
            tensors: 2 * MIB,
            constants: 4,
            model_code: 749,
            runtime_memory: 0,
            model_shared_scratchpad: MIB,
        },
        host_memory: 749,
        executions: 1000 + u64::from(id),
        executions_per_second: Some(12.5 * f64::from(id)),
        latency_p50: Some(0.0271),
        latency_p99: Some(0.0529),
    }
}

/// Two runtimes on a two-device instance: `train` busy on nc0 and nc1 with errors,
/// an untagged one on nc2 that has just exited and whose figures are not measured.
fn fixture() -> Snapshot {
    Snapshot {
        time: "12:34:56Z".into(),
        instance: Instance {
            instance_type: "trn1.32xlarge".into(),
            device_count: 16,
            cores_per_device: 2,
            core_version: "v2".into(),
        },
        system: System {
            vcpu: Some(CpuShare { user: 61.5, system: 4.25 }),
            memory_total_bytes: Some(24 * 1024 * MIB),
            memory_used_bytes: Some(1300 * MIB),
        },
        warnings: vec![],
        ranks: vec![],
        runtimes: vec![
            Runtime {
                pid: 1234,
                tag: "train".into(),
                command: "python3 train.py --steps 1000".into(),
                exited: false,
                state: "live",
                vcpu: Some(CpuShare { user: 48.0, system: 1.5 }),
                cores: vec![core(0, 97.25, &[10.0, 40.0, 80.0, 97.0, 99.0]), core(1, 45.5, &[0.0, 20.0, 45.0])],
                resident_bytes: Some(130 * MIB),
                host_memory: HostMemory { application_memory: 1498, constants: 0, dma_buffers: 65_536, tensors: 4096 },
                models: vec![model(0, 1, "mlp"), model(1, 2, "attention")],
                errors: [0, 0, 0, 13, 0, 2],
                trace_events_per_second: Some(5234.0),
                trace_events_dropped: 17,
                peak_flops_per_core: Some(7e9),
            },
            Runtime {
                pid: 4242,
                tag: "serve.py".into(),
                command: "python3 serve.py".into(),
                exited: true,
                state: "exited",
                vcpu: None,
                cores: vec![Core { index: 2, device: 1, utilization: None, ..Core::default() }],
                resident_bytes: None,
                host_memory: HostMemory::default(),
                models: vec![],
                errors: [0; 6],
                trace_events_per_second: None,
                trace_events_dropped: 0,
                peak_flops_per_core: None,
            },
        ],
    }
}

fn render(state: &State, width: u16, height: u16, color: bool) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
    terminal.draw(|frame| draw(frame, state, Theme { color })).expect("draws");
    terminal.backend().buffer().clone()
}

fn text(buffer: &Buffer) -> String {
    (0..buffer.area.height)
        .map(|y| (0..buffer.area.width).map(|x| buffer[(x, y)].symbol()).collect::<String>().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn frames_at_80x24_and_160x48_in_colour_and_without() {
    let state = State::new(fixture());
    for (width, height) in [(80, 24), (160, 48)] {
        for color in [true, false] {
            let buffer = render(&state, width, height, color);
            let name = format!("frame_{width}x{height}_{}", if color { "colour" } else { "no_color" });
            insta::assert_snapshot!(name.clone(), format!("{buffer:?}"));
            let colours = buffer.content.iter().filter(|c| c.fg != Color::Reset || c.bg != Color::Reset).count();
            assert_eq!(colours > 0, color, "{name}: {colours} coloured cells");
        }
    }
}

/// A tall terminal adds history graphs and the process table; 80x24 keeps its layout.
#[test]
fn a_tall_terminal_shows_history_graphs_and_a_sortable_process_table() {
    let mut state = State::new(fixture());
    let small = text(&render(&state, 80, 24, false));
    assert!(!small.contains("Processes") && !small.contains("latency p50 ·"), "{small}");
    let tall = text(&render(&state, 160, 48, false));
    for expected in ["utilisation · now 99%", "FLOP/s · now 3.46G", "latency p50 · now", "Processes", "exec/s▼"] {
        assert!(tall.contains(expected), "{expected:?} missing from\n{tall}");
    }
    assert!(tall.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c)), "braille graphs:\n{tall}");
    let rows: Vec<&str> = tall.lines().filter(|l| l.contains("python3 ")).collect();
    assert_eq!(rows.len(), 2, "{tall}");
    assert!(rows[0].contains("1234") && rows[0].contains("python3 train.py --steps 1000"), "busiest first: {rows:?}");
    // Issue 39: each memory column says which memory it counts: the process's resident
    // memory, then the device memory its cores hold.
    assert!(tall.contains("resident   device mem"), "{tall}");
    assert!(rows[0].contains("130.0 MiB  13.3 MiB"), "{rows:?}");
    assert!(rows[1].contains("serve.py") && rows[1].contains("N/A"), "{rows:?}");
    let model_row = tall.lines().find(|l| l.contains("└ mlp")).expect("a row per model");
    assert!(
        model_row.contains("nc0") && model_row.contains("12.5") && model_row.contains("p50 27.1 ms  p99 52.9 ms"),
        "{model_row}"
    );
    // `s` moves the sort to the next column; at pid, 1234 comes before 4242.
    for _ in 0..4 {
        state.apply(Action::NextSort);
    }
    let by_pid = text(&render(&state, 160, 48, false));
    assert!(by_pid.contains("pid▼"), "{by_pid}");
    let blank = by_pid.lines().filter(|l| l.trim().is_empty()).count();
    assert!(blank <= 2, "the graphs take the rows the tree leaves: {blank} blank rows\n{by_pid}");
}

#[test]
fn the_screen_shows_what_the_snapshot_holds() {
    let mut state = State::new(fixture());
    let screen = text(&render(&state, 160, 48, false));
    for expected in [
        "NeuronCore v2 Utilization (Avg: 71.38%)",
        "[1]:all [2]:train [3]:serve.py",
        "97.25%",
        "N/A",
        "ND0 (sum of 2 cores)",
        "model 13",
        "hardware 2",
        "5.2k events/s, 17 dropped",
        "14 more devices idle",
        "[user 61.5%, system 4.2%]",
    ] {
        assert!(screen.contains(expected), "{expected:?} missing from\n{screen}");
    }
    state.apply(Action::ToggleFlops);
    let screen = text(&render(&state, 160, 48, false));
    assert!(screen.contains("0.0034 TFLOPS"), "nc0's 3.4 GFLOP/s in the bar:\n{screen}");
    assert!(!screen.contains("97.25%"), "{screen}");
    // Issue 39: the bar is the FLOP/s against the peak, not the utilisation: nc1 runs
    // at 1.6 GFLOP/s of a 7 GFLOP/s peak, under a quarter of its bar, while 45.5% busy.
    let nc1 = screen.lines().flat_map(|l| l.split("nc1 [").nth(1)).next().expect("nc1's bar");
    let bar = &nc1[..nc1.find(']').expect("the bar's end")];
    let filled = bar.chars().filter(|&c| c == '|').count() as f64;
    let width = bar.chars().count() as f64;
    assert!((filled / width - 1.5925 / 7.0).abs() < 0.05, "{bar:?}");
}

#[test]
fn the_help_screen_lists_every_key_of_the_table() {
    let mut state = State::new(fixture());
    state.apply(Action::ToggleHelp);
    let buffer = render(&state, 80, 24, true);
    insta::assert_snapshot!("help_80x24", text(&buffer));
    let screen = text(&buffer);
    for binding in neuron_top::input::BINDINGS {
        assert!(screen.contains(binding.label), "{} missing from the help", binding.label);
    }
    // Issue 39: no help line is cut, at 80×24 or wider.
    for (width, height) in [(80, 24), (100, 30), (160, 48)] {
        let screen = text(&render(&state, width, height, false));
        for binding in neuron_top::input::BINDINGS {
            assert!(screen.contains(binding.help), "{width}×{height}: {:?} is cut:\n{screen}", binding.help);
        }
    }
}

/// Issue 39: the history graphs have a time axis in seconds over a fixed window (the
/// samples kept, at the refresh), which a short history fills from the right only.
#[test]
fn history_graphs_span_a_fixed_window_in_seconds() {
    let mut snapshot = fixture();
    for core in snapshot.runtimes.iter_mut().flat_map(|r| r.cores.iter_mut()) {
        core.history = vec![50.0, 10.0, 90.0];
        core.flops_history = vec![1e9, 2e9, 3e9];
        core.latency_history = vec![Some(0.01), Some(0.02), Some(0.03)];
    }
    let mut state = State::new(snapshot);
    let screen = text(&render(&state, 160, 48, false));
    assert!(screen.contains("−120 s") && screen.contains("−60 s") && screen.contains("now"), "{screen}");
    assert!(!screen.contains("samples"), "{screen}");
    // Three samples take the right edge of each graph, not its whole width.
    let graph_rows: Vec<&str> =
        screen.lines().filter(|l| l.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c))).collect();
    assert!(!graph_rows.is_empty(), "{screen}");
    for row in &graph_rows {
        let chars: Vec<char> = row.chars().collect();
        for third in 0..3 {
            let (from, to) = (third * 160 / 3, (third + 1) * 160 / 3);
            let dots: Vec<usize> =
                (from..to.min(chars.len())).filter(|&x| ('\u{2801}'..='\u{28ff}').contains(&chars[x])).collect();
            if let Some(&first) = dots.first() {
                assert!(first >= from + (to - from) * 3 / 4, "a dot at column {first} of {from}..{to}:\n{screen}");
            }
        }
    }
    state.refresh = std::time::Duration::from_millis(100);
    let screen = text(&render(&state, 160, 48, false));
    assert!(screen.contains("−12 s") && screen.contains("−6 s"), "{screen}");
}

#[test]
fn every_size_draws_without_panicking() {
    let mut state = State::new(fixture());
    state.apply(Action::ToggleAll);
    for width in (1..=100).step_by(3) {
        for height in (1..=50).step_by(2) {
            render(&state, width, height, true);
        }
    }
    state.apply(Action::ToggleHelp);
    for (width, height) in [(1, 1), (5, 3), (20, 6), (40, 10)] {
        render(&state, width, height, false);
    }
    let narrow = text(&render(&State::new(fixture()), 40, 20, false));
    assert!(narrow.contains('…'), "narrow lines are cut with an ellipsis:\n{narrow}");
}

#[test]
fn unmeasured_figures_read_n_a_and_warnings_replace_the_key_hints() {
    let mut snapshot = fixture();
    snapshot.runtimes[0].trace_events_per_second = None;
    snapshot.warnings = vec!["cannot list the runtimes: permission denied".into(), "another".into()];
    let screen = text(&render(&State::new(snapshot), 160, 48, false));
    assert!(screen.contains("Trace   N/A events/s, 17 dropped"), "{screen}");
    assert!(screen.contains("⚠ cannot list the runtimes: permission denied (and 1 more)"), "{screen}");
    assert!(!screen.contains("q quit"), "{screen}");
}

#[test]
fn the_tree_cursor_stays_on_its_line_when_lines_above_come_and_go() {
    let mut state = State::new(fixture());
    state.apply(Action::Down);
    state.apply(Action::Down);
    assert_eq!(state.tree()[state.cursor].node, Some(NodeId::Core(1234, 1)));
    // A runtime on device 0 of a lower pid adds a line above.
    let mut snapshot = fixture();
    snapshot
        .runtimes
        .insert(0, Runtime { pid: 7, tag: "new".into(), cores: vec![core(3, 1.0, &[])], ..Runtime::default() });
    snapshot.runtimes[0].cores[0].device = 0;
    state.update(snapshot);
    assert_eq!(state.tree()[state.cursor].node, Some(NodeId::Core(1234, 1)), "{:?}", state.tree());
    // Its line gone: the cursor stays in range.
    let mut snapshot = fixture();
    snapshot.runtimes.truncate(1);
    snapshot.runtimes[0].cores.truncate(1);
    state.update(snapshot);
    assert!(state.cursor < state.tree().len());
}

#[test]
fn the_selected_tab_stays_in_view() {
    let mut snapshot = fixture();
    snapshot.runtimes =
        (0..8).map(|i| Runtime { pid: 100 + i, tag: format!("trainer-{i}"), ..Runtime::default() }).collect();
    let mut state = State::new(snapshot);
    state.apply(Action::SelectTab(9));
    let screen = text(&render(&state, 60, 20, false));
    let tabs = screen.lines().nth(1).expect("the tab bar");
    assert!(tabs.starts_with("… ") && tabs.contains("[9]:trainer-7"), "{tabs}");
    state.apply(Action::SelectTab(1));
    let screen = text(&render(&state, 60, 20, false));
    let tabs = screen.lines().nth(1).expect("the tab bar");
    assert!(tabs.starts_with("[1]:all") && tabs.ends_with('…'), "{tabs}");
}

#[test]
fn cores_that_do_not_fit_are_counted() {
    let mut snapshot = fixture();
    snapshot.runtimes[0].cores = (0..12).map(|i| core(i, 50.0, &[50.0])).collect();
    let screen = text(&render(&State::new(snapshot), 80, 24, false));
    let shown = screen.lines().filter(|l| l.starts_with("nc")).count();
    let line =
        screen.lines().find(|l| l.starts_with('…')).unwrap_or_else(|| panic!("no count of the others:\n{screen}"));
    assert_eq!(line.split_whitespace().nth(1), Some((13 - shown).to_string().as_str()), "{screen}");
}

#[test]
fn tabs_follow_the_keys_and_their_runtime() {
    let mut state = State::new(fixture());
    assert_eq!(state.tab(), 0);
    state.apply(Action::NextTab);
    assert_eq!((state.tab(), state.selected), (1, Some(1234)));
    state.apply(Action::NextTab);
    state.apply(Action::NextTab);
    assert_eq!(state.tab(), 0, "d wraps around");
    state.apply(Action::PreviousTab);
    assert_eq!(state.selected, Some(4242), "a wraps around");
    state.apply(Action::SelectTab(2));
    assert_eq!(state.selected, Some(1234));
    state.apply(Action::SelectTab(9));
    assert_eq!(state.selected, Some(1234), "a tab that does not exist changes nothing");
    assert_eq!(state.runtimes().len(), 1);

    // A new runtime before it: the tab stays on the same process.
    let mut snapshot = fixture();
    snapshot.runtimes.insert(0, Runtime { pid: 7, tag: "new".into(), ..Runtime::default() });
    state.update(snapshot);
    assert_eq!((state.tab(), state.selected), (2, Some(1234)));
    // Its runtime gone: back to all.
    let mut snapshot = fixture();
    snapshot.runtimes.remove(0);
    state.update(snapshot);
    assert_eq!((state.tab(), state.selected), (0, None));
}

#[test]
fn help_takes_the_keys_until_closed() {
    let mut state = State::new(fixture());
    state.apply(Action::ToggleHelp);
    state.apply(Action::NextTab);
    state.apply(Action::ToggleFlops);
    assert_eq!((state.tab(), state.flops, state.show_help), (0, false, true), "keys do nothing under the help");
    state.apply(Action::CloseHelp);
    assert!(!state.show_help);
    state.apply(Action::ToggleHelp);
    state.apply(Action::ToggleHelp);
    assert!(!state.show_help, "? closes it too");
    state.apply(Action::ToggleHelp);
    state.apply(Action::Quit);
    assert!(state.quit, "q quits from the help");
}

#[test]
fn the_memory_tree_expands_collapses_and_keeps_the_cursor_inside() {
    let mut state = State::new(fixture());
    let labels = |s: &State| s.tree().iter().map(|r| r.label.clone()).collect::<Vec<_>>();
    // Devices start open, cores closed.
    assert_eq!(
        labels(&state),
        [
            "ND0 (sum of 2 cores)",
            "nc0 train (sum of categories)",
            "nc1 train (sum of categories)",
            "ND1 (sum of 1 core)",
            "nc2 serve.py (sum of categories)"
        ]
    );
    let nd0 = &state.tree()[0];
    assert_eq!(nd0.device_bytes, Some(2 * fixture().runtimes[0].cores[0].device_memory.total()));
    state.apply(Action::Down);
    state.apply(Action::ToggleNode);
    assert_eq!(state.tree()[1].node, Some(NodeId::Core(1234, 0)));
    assert!(state.tree()[1].expanded);
    assert_eq!(state.tree().len(), 5 + 5 + 1, "nc0's five categories and its model");
    state.apply(Action::Collapse);
    assert_eq!(state.tree().len(), 5);
    state.apply(Action::Up);
    state.apply(Action::Collapse);
    assert_eq!(labels(&state), ["ND0 (sum of 2 cores)", "ND1 (sum of 1 core)", "nc2 serve.py (sum of categories)"]);
    for _ in 0..10 {
        state.apply(Action::Down);
    }
    assert_eq!(state.cursor, 2, "the cursor stops at the last line");
    state.apply(Action::ToggleAll);
    assert!(state.tree().iter().all(|r| r.node.is_none() || r.expanded), "x opens everything");
    assert_eq!(state.tree().len(), 2 + 3 + 3 * 5 + 2 + 2 * 5);
    state.apply(Action::ToggleAll);
    assert_eq!(state.tree().len(), 2, "x again closes everything");
    assert!(state.cursor < 2);
}

#[test]
fn a_stopped_runtime_is_shown_stopped_not_gone() {
    let mut snapshot = fixture();
    snapshot.runtimes[0].state = "stopped";
    let mut state = State::new(snapshot);
    state.apply(Action::ToggleAll);
    let screen = text(&render(&state, 160, 48, false));
    assert!(screen.contains("[stopped] python3 train.py"), "{screen}");
    assert!(screen.contains("[exited] python3 serve.py"), "{screen}");
    assert!(screen.contains("97.25%"), "its cores stay held and shown: {screen}");
}

/// Four ranks of `grads`, one process each, at 10 collectives: rank 2 arrives 3 ms late
/// every time; with `hang`, ranks 0, 1 and 2 then wait 6 s in collective #10 for rank 3.
fn with_ranks(hang: bool) -> Snapshot {
    use neuron_datastore::flight::{CollectiveEntry, Position};
    use neuron_datastore::ranks::{RuntimeRecords, StragglerRule, group_views};
    use neuron_datastore::{CollectiveAlgorithm, CollectiveOp, CommunicatorRecord, RankRecord};
    const MS: u64 = 1_000_000;
    let at = |sequence| Position { sequence, index: 0 };
    let members: Vec<RankRecord> = (0..4u32)
        .map(|rank| {
            let waiting = hang && rank != 3;
            RankRecord {
                rank,
                pid: 5000 + rank,
                host: format!("trn-{}", rank / 2),
                core: Some(rank % 2),
                in_this_process: true,
                gone: false,
                enqueued: Some(at(10)),
                started: Some(at(if waiting { 10 } else { 9 })),
                operation: Some(CollectiveOp::AllReduce),
                completed: Some(at(9)),
                uncertainty_ns: 4_000,
                waiting: waiting.then_some((1_000 * MS, 3)),
                heard: None,
                history: (0..10)
                    .map(|s| {
                        let arrived_ns = 1_000 * MS
                            + u64::from(s) * 20 * MS
                            + u64::from(rank) * 10_000
                            + if rank == 2 { 3 * MS } else { 0 };
                        CollectiveEntry {
                            position: at(s),
                            operation: CollectiveOp::AllReduce,
                            algorithm: CollectiveAlgorithm::AllToAll,
                            group: 0,
                            bytes: 4 << 20,
                            arrived_ns,
                            departed_ns: Some(arrived_ns + MS),
                            before: None,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    let records = [RuntimeRecords {
        pid: 5000,
        clock: None,
        admission: Some(neuron_datastore::flight::JobAdmission::TrustedNetwork),
        communicators: vec![CommunicatorRecord { id: 77, name: "grads".into(), ranks: 4, across: true, members }],
        activity: Default::default(),
    }];
    Snapshot { ranks: group_views(&records, &StragglerRule::default(), 7_000 * MS), ..fixture() }
}

#[test]
fn the_ranks_tab_names_the_straggler_and_a_hang_with_every_rank() {
    let mut state = State::new(with_ranks(false));
    assert_eq!(state.tabs(), 4, "all, two runtimes, ranks");
    state.apply(Action::RanksTab);
    assert!(state.ranks_tab);
    assert_eq!(state.tab(), 3);
    let screen = text(&render(&state, 120, 24, false));
    insta::assert_snapshot!("ranks_120x24", screen);
    assert!(screen.contains("[4]:ranks"), "{screen}");
    assert!(screen.contains("grads · comm 77 · 4 ranks across processes · clocks within ±4.0 µs"), "{screen}");
    assert!(screen.contains("the job trusts its network: anyone who speaks its protocol joins"), "{screen}");
    assert!(
        screen.contains("STRAGGLER rank 2 (pid 5002 on host trn-1) arrived last in 10 of 10 steps, 3.0 ms late"),
        "{screen}"
    );
    for rank in 0..4 {
        assert!(screen.contains(&format!("{}", 5000 + rank)), "rank {rank}: {screen}");
    }

    state.update(with_ranks(true));
    let screen = text(&render(&state, 120, 24, false));
    let joined = screen.replace('\n', " ");
    assert!(
        joined.contains("HANG all-reduce #10 of comm `grads` (4 ranks): 3 ranks waiting 6.0 s for rank 3 (pid 5003 on host trn-1), which never reached it"),
        "{screen}"
    );
    // Tab cycles back to all from the last tab; the ranks tab goes when its communicators do.
    state.apply(Action::NextTab);
    assert!(!state.ranks_tab && state.tab() == 0);
    state.apply(Action::RanksTab);
    state.update(fixture());
    assert!(!state.ranks_tab);
    assert_eq!(state.tabs(), 3);
    // Every size draws.
    let state = {
        let mut s = State::new(with_ranks(true));
        s.apply(Action::RanksTab);
        s
    };
    for (w, h) in [(1, 1), (20, 5), (80, 10), (200, 60)] {
        render(&state, w, h, true);
    }
}
