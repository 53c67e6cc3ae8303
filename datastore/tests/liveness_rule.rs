//! The liveness rule (`datastore/FORMAT.md`, "Liveness") over every combination of what
//! a reader can observe: only a process that is gone (closed, no such pid, a zombie, or
//! the pid reused) is exited; one that is there with an old heartbeat is stale, or
//! stopped when the kernel says it is; anything else is live.

use neuron_datastore::{ExitReason, HEARTBEAT_STALE_AFTER, Liveness, ProcessStatus};
use proptest::prelude::*;

fn state() -> impl Strategy<Value = char> {
    prop::sample::select(vec!['R', 'S', 'D', 'T', 't', 'Z', 'X', 'I', 'W'])
}

proptest! {
    #[test]
    fn only_a_process_that_is_gone_is_exited(
        closed in any::<bool>(),
        process in prop::option::of((state(), 1u64..5)),
        recorded_start in 0u64..5,
        age_ns in prop_oneof![0u64..20_000_000_000, Just(u64::MAX)],
    ) {
        let status = process.map(|(state, start_ticks)| ProcessStatus { state, start_ticks, user_ticks: 0, system_ticks: 0 });
        let liveness = Liveness::of(closed, status, recorded_start, age_ns);
        let gone = closed
            || status.is_none_or(|s| matches!(s.state, 'Z' | 'X') || (recorded_start != 0 && s.start_ticks != recorded_start));
        let stale = age_ns > HEARTBEAT_STALE_AFTER.as_nanos() as u64;
        match liveness {
            Liveness::Exited(reason) => {
                prop_assert!(gone, "{liveness:?}");
                prop_assert_eq!(reason == ExitReason::Closed, closed);
            }
            Liveness::Stale { seconds, stopped } => {
                prop_assert!(!gone && stale, "{liveness:?}");
                prop_assert_eq!(seconds, age_ns / 1_000_000_000);
                prop_assert_eq!(stopped, status.is_some_and(|s| matches!(s.state, 'T' | 't')));
            }
            Liveness::Live => prop_assert!(!gone && !stale, "{liveness:?}"),
        }
    }
}
