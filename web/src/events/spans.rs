//! The spans the live timeline draws, as the page reads them, and the choice of whole
//! groups of them when a batch cannot hold every span.

use std::collections::BTreeMap;

use neuron_datastore::event::{DeviceActivity, DeviceEvent, SystemEvent};
use serde_json::{Value, json};

/// Spans that are sent or left out together: one execution's on one core (its system
/// spans, `nrt_execute` and its phases, and its device spans), or one system span that
/// belongs to no execution (a load, a tensor copy).
#[derive(Debug)]
pub(super) struct Group {
    pub(super) pid: u32,
    /// `None` for the runtime's host-wide spans.
    pub(super) core: Option<u32>,
    /// Whether the spans are an execution's (counted as a thinned execution when left out).
    pub(super) execution: bool,
    /// The execution's id, when they are an execution's.
    pub(super) exec_id: Option<u64>,
    /// Host time of its first span.
    pub(super) start_ns: u64,
    pub(super) spans: Vec<String>,
    pub(super) bytes: usize,
    /// Polls it has waited for its `nc_exec_running` to stop.
    pub(super) polls: u8,
}

impl Group {
    /// The group of execution `exec_id` (`None`: spans of no execution).
    pub(super) fn new(pid: u32, core: Option<u32>, exec_id: Option<u64>, start_ns: u64) -> Group {
        Group { pid, core, execution: exec_id.is_some(), exec_id, start_ns, spans: Vec::new(), bytes: 0, polls: 0 }
    }

    pub(super) fn add(&mut self, span: String, start_ns: u64) {
        self.start_ns = self.start_ns.min(start_ns);
        self.bytes += span.len() + 1;
        self.spans.push(span);
    }
}

/// Which of `groups` fit in `room` bytes (`true`: kept). When not all fit, the groups
/// outside executions (loads, tensor copies, weight transfers: few, and telling) come
/// first, in up to a quarter of the room; then each core of each runtime gets an equal
/// share of the rest for its executions, kept whole and evenly spread through its
/// time; the room left unused goes to the groups left out, oldest first.
pub(super) fn select(groups: &[&Group], room: usize) -> Vec<bool> {
    let total: usize = groups.iter().map(|g| g.bytes).sum();
    if total <= room {
        return vec![true; groups.len()];
    }
    let mut kept = vec![false; groups.len()];
    let (lone, executions): (Vec<usize>, Vec<usize>) = (0..groups.len()).partition(|&k| !groups[k].execution);
    let used = spread(groups, &lone, room / 4, &mut kept);
    let used = used + spread(groups, &executions, room - used, &mut kept);
    let mut room_left = room.saturating_sub(used);
    let mut left_out: Vec<usize> = (0..groups.len()).filter(|&k| !kept[k]).collect();
    left_out.sort_by_key(|&k| groups[k].start_ns);
    for k in left_out {
        if groups[k].bytes <= room_left {
            room_left -= groups[k].bytes;
            kept[k] = true;
        }
    }
    kept
}

/// Marks in `kept` which of the groups at `indices` each core keeps in its equal share
/// of `room`, evenly spread through its time; returns the bytes kept.
fn spread(groups: &[&Group], indices: &[usize], room: usize, kept: &mut [bool]) -> usize {
    let mut by_core: BTreeMap<(u32, Option<u32>), Vec<usize>> = BTreeMap::new();
    for &k in indices {
        by_core.entry((groups[k].pid, groups[k].core)).or_default().push(k);
    }
    let share = room / by_core.len().max(1);
    let mut used_total = 0;
    for (_, mut list) in by_core {
        list.sort_by_key(|&k| groups[k].start_ns);
        let bytes: usize = list.iter().map(|&k| groups[k].bytes).sum();
        // Keep one in `stride` (by bytes), a little more sparsely than the share says.
        let stride = (bytes as f64 / share.max(1) as f64 * 1.05).max(1.0);
        let (mut next, mut used) = (0.0, 0usize);
        for (n, k) in list.into_iter().enumerate() {
            if (n as f64) >= next && used + groups[k].bytes <= share {
                next += stride;
                used += groups[k].bytes;
                kept[k] = true;
            }
        }
        used_total += used;
    }
    used_total
}

/// Splits `groups` into those that fit in `room` bytes and those left out, as [`select`].
pub(super) fn select_groups(groups: Vec<Group>, room: usize) -> (Vec<Group>, Vec<Group>) {
    let kept = select(&groups.iter().collect::<Vec<_>>(), room);
    let (mut yes, mut no) = (Vec::new(), Vec::new());
    for (group, keep) in groups.into_iter().zip(kept) {
        if keep { yes.push(group) } else { no.push(group) }
    }
    (yes, no)
}

/// A device span on the host clock (`offset`: host minus device time of its core),
/// encoded, with what its details pane shows.
pub(super) fn device_span(pid: u32, e: &DeviceEvent, offset: i128, model: Option<&str>) -> String {
    let host = |t: u64| (i128::from(t) + offset).clamp(0, i128::from(u64::MAX)) as u64;
    let mut span = json!({
        "kind": "device",
        "pid": pid,
        "core": e.nc_idx,
        "start_ns": host(e.start_ns),
        "end_ns": host(e.end_ns),
        "exec": e.exec_id,
        "model": model,
    });
    let map = span.as_object_mut().expect("an object");
    match &e.activity {
        DeviceActivity::Instruction { engine, opcode, hlo, flops, bytes_read, bytes_written, .. } => {
            map.insert("name".into(), opcode.as_str().into());
            map.insert("lane".into(), engine.name().into());
            map.insert("hlo".into(), hlo.as_str().into());
            map.insert("flops".into(), (*flops).into());
            map.insert("bytes".into(), (bytes_read + bytes_written).into());
        }
        DeviceActivity::Dma { queue, index, bytes, .. } => {
            map.insert("name".into(), format!("{} {index}", queue.name()).into());
            map.insert("lane".into(), format!("DMA {}", queue.name()).into());
            map.insert("bytes".into(), (*bytes).into());
        }
    }
    span.to_string()
}

/// A system span: on its runtime's row of its core, with the event's fields.
pub(super) fn system_span(
    pid: u32,
    e: &SystemEvent,
    start_ns: u64,
    end_ns: u64,
    model: Option<String>,
    details: Value,
) -> String {
    json!({
        "kind": "system",
        "pid": pid,
        "core": e.nc_idx,
        "name": e.event_type.name(),
        "lane": "runtime",
        "start_ns": start_ns,
        "end_ns": end_ns,
        "exec": e.exec_id,
        "model": model,
        "details": details,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(core: u32, start_ns: u64, spans: usize) -> Group {
        let mut g = Group::new(1, Some(core), Some(start_ns), start_ns);
        for _ in 0..spans {
            g.add("x".repeat(99), start_ns);
        }
        g
    }

    #[test]
    fn executions_are_kept_whole_and_spread_over_time_and_cores() {
        // Two cores, 100 executions each of 10 spans (1000 bytes): room for 40.
        let all: Vec<Group> = (0..100).flat_map(|k| [group(0, k * 10, 10), group(1, k * 10, 10)]).collect();
        let (kept, left_out) = select_groups(all, 40_000);
        assert_eq!(kept.len() + left_out.len(), 200);
        assert!(kept.iter().all(|g| g.spans.len() == 10), "whole executions only");
        for core in [0, 1] {
            let mut starts: Vec<u64> = kept.iter().filter(|g| g.core == Some(core)).map(|g| g.start_ns).collect();
            starts.sort_unstable();
            assert!((15..=21).contains(&starts.len()), "core {core} keeps its share: {}", starts.len());
            // Spread: the kept ones reach from the first tenth to the last.
            assert!(starts[0] < 100 && *starts.last().unwrap_or(&0) >= 900, "{starts:?}");
        }
        let (all_kept, none) = select_groups(vec![group(0, 0, 3)], 40_000);
        assert_eq!((all_kept.len(), none.len()), (1, 0));
        // One large execution on a busy core, beside a quiet core: the quiet core's
        // unused share lets it in.
        let (kept, _) = select_groups(vec![group(0, 0, 300), group(1, 0, 1)], 40_000);
        assert_eq!(kept.len(), 2, "room one core does not use goes to the other");
    }

    #[test]
    fn a_core_with_many_small_spans_does_not_crowd_out_the_others() {
        // Core 0 has thousands of lone system spans (listed first, as its ring is read
        // first: they used to fill the batch); core 1 has executions; the host row has
        // one load.
        let mut all: Vec<Group> = (0..3000)
            .map(|k| {
                let mut g = Group::new(1, Some(0), None, k);
                g.add("s".repeat(199), k);
                g
            })
            .collect();
        all.extend((0..50).map(|k| group(1, k * 60, 20)));
        let mut load = Group::new(1, None, None, 5);
        load.add("l".repeat(99), 5);
        all.push(load);
        let (kept, _) = select_groups(all, 64 * 1024);
        let bytes = |core: Option<u32>| kept.iter().filter(|g| g.core == core).map(|g| g.bytes).sum::<usize>();
        assert!(kept.iter().any(|g| g.core.is_none()), "the host row keeps its span");
        // Core 0's lone spans share a quarter of the room with the host's; core 1's
        // executions get the rest.
        assert!(bytes(Some(1)) >= 40_000, "core 1 gets its share: {} bytes", bytes(Some(1)));
        assert!(bytes(Some(0)) >= 7_000, "core 0 gets its share: {} bytes", bytes(Some(0)));
        assert!(kept.iter().map(|g| g.bytes).sum::<usize>() <= 64 * 1024);
    }

    #[test]
    fn spans_outside_executions_are_kept_before_executions_are_thinned() {
        // Two cores busy with executions; each also loaded a model (a lone group).
        let mut all: Vec<Group> = (0..200).flat_map(|k| [group(0, k * 10, 10), group(1, k * 10, 10)]).collect();
        for core in [0, 1] {
            let mut load = Group::new(1, Some(core), None, 995 + u64::from(core));
            load.add("w".repeat(299), 995);
            all.push(load);
        }
        let (kept, left_out) = select_groups(all, 40_000);
        assert_eq!(kept.iter().filter(|g| !g.execution).count(), 2, "both loads kept");
        assert!(left_out.iter().all(|g| g.execution));
        assert!(kept.iter().filter(|g| g.execution).count() >= 30, "executions share the rest");
    }
}
