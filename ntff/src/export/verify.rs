//! Reads a Perfetto trace back with the proto subset and checks what the exporter
//! promises: every track is described before it is used and after its parent; every
//! sequence clears its incremental state before it relies on it; timestamps never go
//! back on a sequence; slices nest strictly on each track; interned names resolve;
//! counter values go to counter tracks only; flows end after they start.

use std::collections::{HashMap, HashSet};

use prost::Message;

use super::perfetto::{CLOCK_INCREMENTAL, proto};

/// What a checked trace holds.
#[derive(Debug, Clone, Default)]
pub struct TraceCheck {
    pub packets: u64,
    pub slices: u64,
    pub instants: u64,
    pub counter_values: u64,
    pub flows: u64,
    /// Packets that say data was lost before them.
    pub dropped_markers: u64,
    /// Slices still open at the end of the trace.
    pub open_at_end: u64,
    pub tracks: Vec<TrackCheck>,
}

/// One described track.
#[derive(Debug, Clone, Default)]
pub struct TrackCheck {
    pub uuid: u64,
    pub parent_uuid: Option<u64>,
    /// The track's name, or the process or thread name.
    pub name: String,
    pub is_counter: bool,
    pub slices: u64,
    pub instants: u64,
    pub counter_values: u64,
    pub max_depth: usize,
    /// Encoded bytes of the packets of the track's sequence.
    pub bytes: u64,
    /// Slice names, with how many slices had each.
    pub slice_names: HashMap<String, u64>,
    /// First and last event time (trace clock).
    pub span: Option<(u64, u64)>,
}

#[derive(Debug, Default)]
struct SequenceState {
    cleared: bool,
    clock: Option<u64>,
    default_track: Option<u64>,
    default_clock: Option<u32>,
    names: HashMap<u64, String>,
    annotation_names: HashMap<u64, String>,
    string_values: HashMap<u64, Vec<u8>>,
    last: Option<u64>,
}

/// The first rule of a valid trace that a Perfetto trace breaks, and the packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TraceRuleBroken(pub String);

/// Decodes `bytes` as a `Trace` and checks it; the error names the first packet that
/// breaks a rule.
pub fn verify_perfetto(bytes: &[u8]) -> Result<TraceCheck, TraceRuleBroken> {
    check_trace(bytes).map_err(TraceRuleBroken)
}

fn check_trace(bytes: &[u8]) -> Result<TraceCheck, String> {
    let trace = proto::Trace::decode(bytes).map_err(|e| format!("not a Trace: {e}"))?;
    let mut check = TraceCheck::default();
    let mut tracks: HashMap<u64, usize> = HashMap::new();
    let mut stacks: HashMap<u64, Vec<String>> = HashMap::new();
    let mut sequences: HashMap<u32, SequenceState> = HashMap::new();
    let mut flows: HashSet<u64> = HashSet::new();
    let mut primary_clock = None;
    for (n, packet) in trace.packet.iter().enumerate() {
        let fail = |what: String| format!("packet {n}: {what}");
        check.packets += 1;
        let seq_id = packet.trusted_packet_sequence_id.ok_or_else(|| fail("no sequence id".into()))?;
        let seq = sequences.entry(seq_id).or_default();
        if packet.previous_packet_dropped.unwrap_or(0) != 0 {
            check.dropped_markers += 1;
        }
        if packet.sequence_flags.unwrap_or(0) & 1 != 0 || packet.incremental_state_cleared == Some(true) {
            *seq = SequenceState { cleared: true, ..Default::default() };
        }
        if let Some(defaults) = &packet.trace_packet_defaults {
            seq.default_clock = defaults.timestamp_clock_id;
            seq.default_track = defaults.track_event_defaults.as_ref().and_then(|d| d.track_uuid);
        }
        if let Some(snapshot) = &packet.clock_snapshot {
            if let Some(clock) = snapshot.primary_trace_clock {
                primary_clock = Some(clock);
            }
            for clock in &snapshot.clocks {
                if clock.clock_id == Some(CLOCK_INCREMENTAL) {
                    if clock.is_incremental != Some(true) {
                        return Err(fail("clock 64 is not incremental".into()));
                    }
                    seq.clock = clock.timestamp;
                }
            }
            if packet.track_event.is_some() || packet.track_descriptor.is_some() {
                return Err(fail("a clock snapshot packet carries more (trace processor ignores the rest)".into()));
            }
            continue;
        }
        if let Some(interned) = &packet.interned_data {
            if !seq.cleared {
                return Err(fail("interned data before the sequence cleared its state".into()));
            }
            for name in &interned.event_names {
                seq.names.insert(name.iid.unwrap_or(0), name.name.clone().unwrap_or_default());
            }
            for name in &interned.debug_annotation_names {
                seq.annotation_names.insert(name.iid.unwrap_or(0), name.name.clone().unwrap_or_default());
            }
            for value in &interned.debug_annotation_string_values {
                seq.string_values.insert(value.iid.unwrap_or(0), value.str.clone().unwrap_or_default());
            }
        }
        if let Some(d) = &packet.track_descriptor {
            let uuid = d.uuid.filter(|&u| u != 0).ok_or_else(|| fail("track descriptor without uuid".into()))?;
            if tracks.contains_key(&uuid) {
                return Err(fail(format!("track {uuid} described twice")));
            }
            if let Some(parent) = d.parent_uuid
                && !tracks.contains_key(&parent)
            {
                return Err(fail(format!("track {uuid} described before its parent {parent}")));
            }
            let name = d
                .name
                .clone()
                .or_else(|| d.process.as_ref().and_then(|p| p.process_name.clone()))
                .or_else(|| d.thread.as_ref().and_then(|t| t.thread_name.clone()))
                .unwrap_or_default();
            tracks.insert(uuid, check.tracks.len());
            check.tracks.push(TrackCheck {
                uuid,
                parent_uuid: d.parent_uuid,
                name,
                is_counter: d.counter.is_some(),
                ..Default::default()
            });
        }
        let Some(event) = &packet.track_event else { continue };
        if !seq.cleared {
            return Err(fail("track event before the sequence cleared its state".into()));
        }
        let clock = packet.timestamp_clock_id.or(seq.default_clock);
        let delta = packet.timestamp.ok_or_else(|| fail("track event without timestamp".into()))?;
        let ts = match clock {
            Some(CLOCK_INCREMENTAL) => {
                let base = seq.clock.ok_or_else(|| fail("incremental timestamp before its clock snapshot".into()))?;
                let ts = base + delta;
                seq.clock = Some(ts);
                ts
            }
            _ => delta,
        };
        if seq.last.is_some_and(|last| ts < last) {
            return Err(fail(format!("time goes back on sequence {seq_id}")));
        }
        seq.last = Some(ts);
        let uuid = event.track_uuid.or(seq.default_track).ok_or_else(|| fail("event without track".into()))?;
        let &ix = tracks.get(&uuid).ok_or_else(|| fail(format!("event on track {uuid} before its descriptor")))?;
        check.tracks[ix].bytes += packet.encoded_len() as u64;
        let track = &mut check.tracks[ix];
        track.span = Some(track.span.map_or((ts, ts), |(a, _)| (a, ts)));
        let name = match (event.name_iid, &event.name) {
            (Some(iid), _) => {
                Some(seq.names.get(&iid).cloned().ok_or_else(|| fail(format!("event name {iid} is not interned")))?)
            }
            (None, Some(name)) => Some(name.clone()),
            (None, None) => None,
        };
        for a in &event.debug_annotations {
            if let Some(iid) = a.name_iid
                && !seq.annotation_names.contains_key(&iid)
            {
                return Err(fail(format!("annotation name {iid} is not interned")));
            }
            if let Some(iid) = a.string_value_iid
                && !seq.string_values.contains_key(&iid)
            {
                return Err(fail(format!("annotation string value {iid} is not interned")));
            }
        }
        for flow in &event.flow_ids {
            flows.insert(*flow);
            check.flows += 1;
        }
        for flow in &event.terminating_flow_ids {
            if !flows.remove(flow) {
                return Err(fail(format!("flow {flow:x} ends before it starts")));
            }
        }
        let stack = stacks.entry(uuid).or_default();
        match event.r#type {
            Some(1) => {
                if track.is_counter {
                    return Err(fail("a slice on a counter track".into()));
                }
                let name = name.ok_or_else(|| fail("slice without a name".into()))?;
                *track.slice_names.entry(name.clone()).or_default() += 1;
                stack.push(name);
                track.max_depth = track.max_depth.max(stack.len());
                track.slices += 1;
                check.slices += 1;
            }
            Some(2) => {
                if stack.pop().is_none() {
                    return Err(fail(format!("slice end on track {:?} with no slice open", track.name)));
                }
            }
            Some(3) => {
                if track.is_counter {
                    return Err(fail("an instant on a counter track".into()));
                }
                track.instants += 1;
                check.instants += 1;
            }
            Some(4) => {
                if !track.is_counter {
                    return Err(fail("a counter value on a slice track".into()));
                }
                if event.double_counter_value.is_none() && event.counter_value.is_none() {
                    return Err(fail("a counter event without a value".into()));
                }
                track.counter_values += 1;
                check.counter_values += 1;
            }
            other => return Err(fail(format!("event type {other:?}"))),
        }
    }
    // Bytes of sequence-clearing packets count towards their track too.
    for packet in &trace.packet {
        if packet.clock_snapshot.is_some()
            && let Some(uuid) = packet
                .trace_packet_defaults
                .as_ref()
                .and_then(|d| d.track_event_defaults.as_ref())
                .and_then(|d| d.track_uuid)
            && let Some(&ix) = tracks.get(&uuid)
        {
            check.tracks[ix].bytes += packet.encoded_len() as u64;
        }
    }
    if primary_clock.is_none() {
        return Err("no clock snapshot names the trace's primary clock".into());
    }
    check.open_at_end = stacks.values().map(|s| s.len() as u64).sum();
    Ok(check)
}
