//! The spans the live timeline draws, as the page reads them, and the choice of whole
//! executions when a batch cannot hold every device span.

use std::collections::BTreeMap;

use neuron_datastore::event::{DeviceActivity, DeviceEvent, SystemEvent};
use serde_json::{Value, json};

/// The device spans of one execution on one core, encoded.
#[derive(Debug)]
pub(super) struct Execution {
    pub(super) pid: u32,
    pub(super) core: u32,
    /// Host time of its first span.
    pub(super) start_ns: u64,
    pub(super) spans: Vec<String>,
    pub(super) bytes: usize,
    /// Polls it has waited for its `nc_exec_running` to stop.
    pub(super) polls: u8,
}

impl Execution {
    pub(super) fn new(pid: u32, core: u32, start_ns: u64) -> Execution {
        Execution { pid, core, start_ns, spans: Vec::new(), bytes: 0, polls: 0 }
    }

    pub(super) fn add(&mut self, span: String, start_ns: u64) {
        self.start_ns = self.start_ns.min(start_ns);
        self.bytes += span.len() + 1;
        self.spans.push(span);
    }
}

/// Splits `executions` into those that fit in `room` bytes and those left out. When
/// not all fit, each core gets an equal share of the room and keeps executions evenly
/// spread through its time, whole.
pub(super) fn select_executions(executions: Vec<Execution>, room: usize) -> (Vec<Execution>, Vec<Execution>) {
    let total: usize = executions.iter().map(|e| e.bytes).sum();
    if total <= room {
        return (executions, Vec::new());
    }
    let mut by_core: BTreeMap<(u32, u32), Vec<Execution>> = BTreeMap::new();
    for e in executions {
        by_core.entry((e.pid, e.core)).or_default().push(e);
    }
    let share = room / by_core.len().max(1);
    let (mut kept, mut left_out) = (Vec::new(), Vec::new());
    for (_, mut list) in by_core {
        list.sort_by_key(|e| e.start_ns);
        let bytes: usize = list.iter().map(|e| e.bytes).sum();
        // Keep one in `stride` (by bytes), a little more sparsely than the share says.
        let stride = (bytes as f64 / share.max(1) as f64 * 1.05).max(1.0);
        let (mut next, mut used) = (0.0, 0usize);
        for (k, e) in list.into_iter().enumerate() {
            if (k as f64) >= next && used + e.bytes <= share {
                next += stride;
                used += e.bytes;
                kept.push(e);
            } else {
                left_out.push(e);
            }
        }
    }
    // The room the cores' shares left unused goes to the executions left out, in time
    // order: an execution larger than one core's share still gets in when it fits.
    let mut room_left = room.saturating_sub(kept.iter().map(|e| e.bytes).sum());
    left_out.sort_by_key(|e| e.start_ns);
    let mut still_out = Vec::new();
    for e in left_out {
        if e.bytes <= room_left {
            room_left -= e.bytes;
            kept.push(e);
        } else {
            still_out.push(e);
        }
    }
    (kept, still_out)
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

    fn execution(core: u32, start_ns: u64, spans: usize) -> Execution {
        let mut e = Execution::new(1, core, start_ns);
        for _ in 0..spans {
            e.add("x".repeat(99), start_ns);
        }
        e
    }

    #[test]
    fn executions_are_kept_whole_and_spread_over_time_and_cores() {
        // Two cores, 100 executions each of 10 spans (1000 bytes): room for 40.
        let all: Vec<Execution> = (0..100).flat_map(|k| [execution(0, k * 10, 10), execution(1, k * 10, 10)]).collect();
        let (kept, left_out) = select_executions(all, 40_000);
        assert_eq!(kept.len() + left_out.len(), 200);
        assert!(kept.iter().all(|e| e.spans.len() == 10), "whole executions only");
        for core in [0, 1] {
            let mut starts: Vec<u64> = kept.iter().filter(|e| e.core == core).map(|e| e.start_ns).collect();
            starts.sort_unstable();
            assert!((15..=21).contains(&starts.len()), "core {core} keeps its share: {}", starts.len());
            // Spread: the kept ones reach from the first tenth to the last.
            assert!(starts[0] < 100 && *starts.last().unwrap_or(&0) >= 900, "{starts:?}");
        }
        let (all_kept, none) = select_executions(vec![execution(0, 0, 3)], 40_000);
        assert_eq!((all_kept.len(), none.len()), (1, 0));
        // One large execution on a busy core, beside a quiet core: the quiet core's
        // unused share lets it in.
        let (kept, _) = select_executions(vec![execution(0, 0, 300), execution(1, 0, 1)], 40_000);
        assert_eq!(kept.len(), 2, "room one core does not use goes to the other");
    }
}
