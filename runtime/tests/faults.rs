//! The fault model seen from outside: for each kind of `NEURON_RT_FAULT_INJECT` fault,
//! the status the execution returns, the counters and events it leaves in the
//! datastore, and the log line; and a degraded core next to a healthy one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neuron_datastore::{ALL_SYSTEM_EVENTS, ErrorClass, EventData, EventType, ExecOutcome};
use neuron_datastore::{DatastoreReader, TailStart, TraceEvent};
use neuron_runtime::config::NumericalErrorsVerbosity;
use neuron_runtime::fault::parse_rules;
use neuron_runtime::{
    ArrayType, Config, CoreSet, DType, Model, Neff, NrtStatus, Runtime, Target, TensorPlacement, TensorSet, compile_hlo,
};

use neuron_test_support::runtime as common;

const ADD_EXP: &str = include_str!("data/add_exp.hlo");

/// A runtime on cores 0 and 1 with `faults` injected.
fn started(faults: &str, adjust: impl FnOnce(&mut Config)) -> common::Fixture {
    common::started(CoreSet::range(0, 1), |config| {
        config.faults = parse_rules(faults, 2).expect("rules parse");
        adjust(config);
    })
}

struct Bound {
    model: Model,
    inputs: TensorSet,
    outputs: TensorSet,
}

fn bound(rt: &Runtime, core: u32) -> Bound {
    let neff = Neff::new("faulty", compile_hlo(ADD_EXP, Target::Trn1).expect("compiles")).encode();
    let model = rt.load(&neff, Some(core)).expect("loads");
    let ty = ArrayType::new(DType::F32, vec![4]);
    let input = rt.allocate_tensor_for(TensorPlacement::Device { core }, &ty, "x").expect("alloc");
    input.write(0, &[0u8; 16]).expect("write");
    let output = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "y").expect("alloc");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input);
    let mut outputs = TensorSet::new();
    outputs.add("output0", output);
    Bound { model, inputs, outputs }
}

fn output(b: &Bound) -> Vec<f32> {
    let bytes = b.outputs.get("output0").expect("bound").read_all().expect("reads");
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Log lines captured from the calling thread (executions log on it).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).lines().map(str::to_owned).collect()
    }
}

/// What one kind of fault must produce on the execution it strikes.
struct Expected {
    rule: &'static str,
    /// The failure status; `None` when the execution succeeds.
    status: Option<NrtStatus>,
    outcome: ExecOutcome,
    /// The error class counted (`None`: none, a slow execution).
    class: Option<ErrorClass>,
    /// Which of device 0's ECC counters (mem corrected, mem uncorrected, sram corrected,
    /// sram uncorrected) goes up.
    ecc: Option<usize>,
    /// Whether later executions on the core fail with `NRT_EXEC_UNIT_UNRECOVERABLE`.
    degrades: bool,
    /// The log line's level and text.
    log: (&'static str, &'static str),
}

const KINDS: &[Expected] = &[
    Expected {
        rule: "oob:core=0:every=2",
        status: Some(NrtStatus::ExecOob),
        outcome: ExecOutcome::CompletedWithErr,
        class: Some(ErrorClass::Model),
        ecc: None,
        degrades: false,
        log: (
            "ERROR",
            "failed to run scatter/gather (indirect memory copy), due to out-of-bound access [NRT_EXEC_OOB (1006)]",
        ),
    },
    Expected {
        rule: "hbm_ue:core=0:every=2",
        status: Some(NrtStatus::ExecHwErrHbmUe),
        outcome: ExecOutcome::CompletedWithErr,
        class: Some(ErrorClass::Hardware),
        ecc: Some(1),
        degrades: true,
        log: ("ERROR", "uncorrectable memory error (HBM) [NRT_EXEC_HW_ERR_HBM_UE (1201)]"),
    },
    Expected {
        rule: "nc_ue:core=0:every=2",
        status: Some(NrtStatus::ExecHwErrNcUe),
        outcome: ExecOutcome::CompletedWithErr,
        class: Some(ErrorClass::Hardware),
        ecc: Some(3),
        degrades: true,
        log: ("ERROR", "parity error in the NeuronCore's on-chip memory [NRT_EXEC_HW_ERR_NC_UE (1202)]"),
    },
    Expected {
        rule: "dma_abort:core=0:every=2",
        status: Some(NrtStatus::ExecHwErrDmaAbort),
        outcome: ExecOutcome::CompletedWithErr,
        class: Some(ErrorClass::Hardware),
        ecc: None,
        degrades: true,
        log: ("ERROR", "DMA engine aborted with an unrecoverable error [NRT_EXEC_HW_ERR_DMA_ABORT (1203)]"),
    },
    Expected {
        rule: "nq_overflow:core=0:every=2",
        status: Some(NrtStatus::ExecSwNqOverflow),
        outcome: ExecOutcome::CompletedWithErr,
        class: Some(ErrorClass::Runtime),
        ecc: None,
        degrades: false,
        log: (
            "ERROR",
            "notification queue overflowed; the completion status was lost [NRT_EXEC_SW_NQ_OVERFLOW (1204)]",
        ),
    },
    Expected {
        rule: "timeout:core=0:every=2",
        status: Some(NrtStatus::Timeout),
        outcome: ExecOutcome::TimedOut,
        class: Some(ErrorClass::Transient),
        ecc: None,
        degrades: false,
        log: ("ERROR", "the NeuronCore stopped making progress [NRT_TIMEOUT (5)]"),
    },
    Expected {
        rule: "nan:core=0:every=2",
        status: Some(NrtStatus::ExecCompletedWithNumErr),
        outcome: ExecOutcome::CompletedWithNumErr,
        class: Some(ErrorClass::Numerical),
        ecc: None,
        degrades: false,
        log: ("WARN", "NaN written to an output [counted as a numerical error]"),
    },
    Expected {
        rule: "ecc_corrected:core=0:every=2",
        status: None,
        outcome: ExecOutcome::Completed,
        class: Some(ErrorClass::Transient),
        ecc: Some(0),
        degrades: false,
        log: ("WARN", "corrected ECC error in device memory (HBM) [corrected, the execution continues]"),
    },
    Expected {
        rule: "sram_ecc_corrected:core=0:every=2",
        status: None,
        outcome: ExecOutcome::Completed,
        class: Some(ErrorClass::Transient),
        ecc: Some(2),
        degrades: false,
        log: ("WARN", "corrected ECC error in on-chip memory (SRAM) [corrected, the execution continues]"),
    },
    Expected {
        rule: "slow:core=0:delay=60ms:every=2",
        status: None,
        outcome: ExecOutcome::Completed,
        class: None,
        ecc: None,
        degrades: false,
        log: ("WARN", "the NeuronCore stalled before the execution for 0.060 s [the execution continues]"),
    },
];

/// How long the injected stall lasts.
const SLOW: Duration = Duration::from_millis(60);

/// The timeout the injected hang waits out.
const TIMEOUT: Duration = Duration::from_millis(300);

#[test]
fn each_fault_kind_returns_its_status_and_leaves_its_counters_events_and_log_line() {
    // The `cc_` kinds strike ranks of collectives programs: tests/ranks.rs covers them.
    let core_kinds = neuron_runtime::fault::FaultKind::ALL.iter().filter(|k| !k.is_rank_fault()).count();
    assert_eq!(KINDS.len(), core_kinds, "every kind is covered");
    for expected in KINDS {
        let what = expected.rule;
        let f = started(what, |config| {
            config.exec_timeout = TIMEOUT;
            // NaN fails the execution only in critical mode.
            config.numerical_errors = NumericalErrorsVerbosity::Critical;
        });
        let rt = &f.runtime;
        let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
        let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
        let b = bound(rt, 0);
        rt.execute(&b.model, &b.inputs, &b.outputs).expect("the first execution is not struck");
        let healthy = output(&b);
        let before = reader.snapshot();

        let log = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .with_ansi(false)
            .with_target(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let started_at = Instant::now();
        let result = tracing::subscriber::with_default(subscriber, || rt.execute(&b.model, &b.inputs, &b.outputs));
        let took = started_at.elapsed();

        // The status.
        match (&result, expected.status) {
            (Ok(_), None) => assert_eq!(output(&b), healthy, "{what}: a corrected error changes nothing"),
            (Err(e), Some(status)) => {
                assert_eq!(e.status, status, "{what}: {e}");
                assert!(
                    e.message.contains("NEURON_RT_FAULT_INJECT") || status == NrtStatus::ExecCompletedWithNumErr,
                    "{what}: {e}"
                );
            }
            _ => panic!("{what}: got {result:?}, expected {:?}", expected.status),
        }
        if expected.status == Some(NrtStatus::Timeout) {
            assert!(took >= TIMEOUT, "{what}: the hang lasts the timeout ({took:?})");
        }
        if expected.status == Some(NrtStatus::ExecCompletedWithNumErr) {
            assert!(output(&b)[0].is_nan(), "{what}: the first output element is NaN: {:?}", output(&b));
        }

        // The counters.
        let after = reader.snapshot();
        let (core_before, core_after) = (before.core(0).expect("nc0"), after.core(0).expect("nc0"));
        let outcome = |s: &neuron_datastore::CoreSnapshot, o| s.executions.get(o);
        assert_eq!(
            outcome(core_after, expected.outcome) - outcome(core_before, expected.outcome),
            1,
            "{what}: outcome"
        );
        for &class in ErrorClass::ALL {
            let added = core_after.errors.get(class) - core_before.errors.get(class);
            assert_eq!(added, u64::from(Some(class) == expected.class), "{what}: {} errors", class.name());
        }
        for counter in 0..4 {
            let added = after.ecc[0][counter] - before.ecc[0][counter];
            assert_eq!(added, u64::from(expected.ecc == Some(counter)), "{what}: ECC counter {counter}");
        }

        // The events.
        let mut events = Vec::new();
        tail.poll(&reader, usize::MAX, false, &mut events);
        let notified: Vec<(i32, String)> = events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::System(e) if e.event_type == EventType::HwNotify => match &e.data {
                    EventData::HwNotify { status, message } => Some((*status, message.clone())),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let numerical: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::System(e) => match &e.data {
                    EventData::NumericalError { count } => Some(*count),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        if expected.outcome == ExecOutcome::CompletedWithNumErr {
            assert_eq!(numerical, [1], "{what}: one numerical_err event");
        } else if expected.class.is_none() {
            assert!(notified.is_empty() && numerical.is_empty(), "{what}: {notified:?} {numerical:?}");
            assert!(took >= SLOW, "{what}: the stall lasts its delay ({took:?})");
        } else {
            let status = expected.status.map_or(0, |s| s.code() as i32);
            assert_eq!(notified.len(), 1, "{what}: one hw_notify event: {notified:?}");
            assert_eq!(notified[0].0, status, "{what}: {notified:?}");
            assert!(numerical.is_empty(), "{what}");
        }

        // The log line, in the documented format.
        let lines = log.lines();
        let (level, text) = expected.log;
        let line =
            lines.iter().find(|l| l.contains(text)).unwrap_or_else(|| panic!("{what}: no `{text}` in {lines:#?}"));
        assert!(line.contains(&format!(" {level} nc0 (Neuron Device 0): ")), "{what}: {line}");
        assert!(line.contains(&format!("injected by NEURON_RT_FAULT_INJECT rule `{what}`")), "{what}: {line}");

        // The exemplars: the execution the line names is its latency range's last, and
        // its error class's.
        let exec_id: u64 = line
            .split("in execution id ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no execution id in {line}"));
        let exemplars = &core_after.exemplars;
        let latest = exemplars.latency.iter().flatten().max_by_key(|e| e.monotonic_ns).expect("a latency exemplar");
        assert_eq!(latest.exec_id, exec_id, "{what}: {exemplars:?}");
        assert_eq!(latest.status, expected.status.map_or(0, |s| s.code()), "{what}");
        let range = neuron_datastore::exemplar::latency_slot(latest.latency_ns);
        assert_eq!(exemplars.latency[range].as_ref(), Some(latest), "{what}: in the slot of its latency");
        if expected.class.is_none() {
            assert!(latest.latency_ns >= SLOW.as_nanos() as u64, "{what}: {latest:?}");
        }
        for &class in ErrorClass::ALL {
            let named = exemplars.error(class).map(|e| e.exec_id);
            assert_eq!(named == Some(exec_id), Some(class) == expected.class, "{what}: {} {exemplars:?}", class.name());
        }

        // What comes after: the core degraded, or working as before.
        let next = rt.execute(&b.model, &b.inputs, &b.outputs);
        match expected.degrades {
            true => {
                let e = next.expect_err("a degraded core refuses work");
                assert_eq!(e.status, NrtStatus::ExecUnitUnrecoverable, "{what}: {e}");
                assert!(line.contains("execution unit is now degraded"), "{what}: {line}");
            }
            false => {
                next.unwrap_or_else(|e| panic!("{what}: the next execution runs: {e}"));
                assert_eq!(output(&b), healthy, "{what}");
            }
        }
    }
}

#[test]
fn a_stall_as_long_as_the_timeout_is_a_hang() {
    let f = started("slow:core=0:delay=10s", |config| config.exec_timeout = TIMEOUT);
    let rt = &f.runtime;
    let b = bound(rt, 0);
    let started_at = Instant::now();
    let e = rt.execute(&b.model, &b.inputs, &b.outputs).expect_err("it times out");
    assert_eq!(e.status, NrtStatus::Timeout, "{e}");
    let took = started_at.elapsed();
    assert!(took >= TIMEOUT && took < Duration::from_secs(5), "the timeout, not the 10 s stall: {took:?}");
}

#[test]
fn a_degraded_core_refuses_work_while_another_core_keeps_executing() {
    let f = started("hbm_ue:core=0", |_| {});
    let rt = &f.runtime;
    let (on0, on1) = (bound(rt, 0), bound(rt, 1));
    let e = rt.execute(&on0.model, &on0.inputs, &on0.outputs).expect_err("struck");
    assert_eq!(e.status, NrtStatus::ExecHwErrHbmUe);
    for _ in 0..3 {
        let e = rt.execute(&on0.model, &on0.inputs, &on0.outputs).expect_err("degraded");
        assert_eq!(e.status, NrtStatus::ExecUnitUnrecoverable);
        assert!(e.message.contains("other cores are unaffected"), "{e}");
        rt.execute(&on1.model, &on1.inputs, &on1.outputs).expect("nc1 still works");
        // exp(x + x) of zeros.
        assert_eq!(output(&on1), [1.0; 4]);
    }
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let snapshot = reader.snapshot();
    let nc0 = snapshot.core(0).expect("nc0");
    assert_eq!(nc0.executions.get(ExecOutcome::CompletedWithErr), 4);
    assert_eq!(nc0.errors.get(ErrorClass::Hardware), 4);
    assert_eq!(snapshot.core(1).expect("nc1").executions.get(ExecOutcome::Completed), 3);
    assert_eq!(snapshot.ecc[0], [0, 1, 0, 0]);
}

#[test]
fn a_nan_is_counted_but_not_a_failure_by_default() {
    let f = started("nan", |_| {});
    let rt = &f.runtime;
    let b = bound(rt, 0);
    let report = rt.execute(&b.model, &b.inputs, &b.outputs).expect("succeeds at the default verbosity");
    assert_eq!(report.numerical_errors, 1);
    assert!(output(&b)[0].is_nan());
    assert_eq!(&output(&b)[1..], [1.0; 3]);
}
