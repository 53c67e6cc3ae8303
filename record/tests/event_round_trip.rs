//! Every system event type's payload survives each form it takes: emitted into ring
//! slot words, decoded into the typed event, written as JSON (`tail --json`,
//! `nrt_sys_trace_fetch_events`) and as NTFF arguments, and read back from NTFF. The
//! payloads come from their one declaration (`datastore/src/event/schema.rs`), with
//! every field set to a value unlike zero and unlike the other fields', so a field
//! that is lost, or that shares its word with another, fails here.

use neuron_datastore::event::{FieldValue, sample};
use neuron_datastore::record::{DEVICE_RECORD_WORDS, FLAG_NRTA_SEQ, FLAG_STATUS, SystemRecord};
use neuron_datastore::{EventType, Phase, SystemEvent, TraceEvent};
use neuron_record::{Recorder, to_system_event};
use ntff::{Metadata, NtffFile, Writer};

fn string(id: u32) -> String {
    format!("string #{id}")
}

fn host_ns(ticks: u64) -> u64 {
    ticks * 3 + 7
}

/// The typed event an emitted record of `event_type` and `phase` decodes to, checked
/// against the payload's expected decoding.
fn decoded(event_type: EventType, phase: Phase, seed: u64) -> SystemEvent {
    let (slots, expected) = sample(event_type, seed, &mut string, &host_ns);
    // The core's rank (+ 1; 0 none): that of its collective for an event naming one,
    // as a core's `cc_running` does.
    let mut rank = (seed % 3) as u32;
    expected.for_each_field(|key, value| {
        if let ("rank", FieldValue::U64(own)) = (key, value) {
            rank = own as u32 + 1;
        }
    });
    let record = SystemRecord {
        timestamp: 1_000 + seed,
        tracking_id: 77,
        exec_id: 5,
        nrta_seq_id: 9,
        event_type: event_type as u16,
        phase: phase as u8,
        flags: FLAG_NRTA_SEQ | if slots.status { FLAG_STATUS } else { 0 },
        thread_id: 4242,
        model_id: 3,
        string_id: slots.string_id,
        args: slots.args,
        rank,
    };
    let mut words = [0u64; DEVICE_RECORD_WORDS];
    let encoded = record.encode();
    words[..encoded.len()].copy_from_slice(&encoded);
    assert_eq!(SystemRecord::decode(&words), record, "{event_type}: the slot words");
    let event = record.to_event(11, Some(2), &mut string, &host_ns).expect("a known type and phase");
    assert_eq!(event.data, expected, "{event_type}: the payload decoded from its slots");
    assert_eq!(event.rank, rank.checked_sub(1), "{event_type}: the core's rank");
    event
}

#[test]
fn every_event_type_round_trips_through_slots_json_and_ntff() {
    let mut events = Vec::new();
    for (k, &event_type) in EventType::ALL.iter().enumerate() {
        for phase in [Phase::Start, Phase::Stop, Phase::Instant] {
            events.push(decoded(event_type, phase, k as u64));
        }
    }

    // JSON: the `data` object holds the ids, then every field under its key.
    for event in &events {
        let json = serde_json::to_value(event).expect("serializable");
        let data = json["data"].as_object().expect("a data object");
        let mut expected = serde_json::Map::new();
        expected.insert("exec_id".into(), 5.into());
        expected.insert("model_id".into(), 3.into());
        let mut fields = 0;
        event.data.for_each_field(|key, value| {
            fields += 1;
            let value = match value {
                FieldValue::U64(v) => serde_json::Value::from(v),
                FieldValue::I64(v) => serde_json::Value::from(v),
                FieldValue::Str(s) => serde_json::Value::from(s),
            };
            assert!(expected.insert(key.into(), value).is_none(), "{}: two fields named {key}", event.event_type);
        });
        assert!(fields > 0, "{}: a payload with no field", event.event_type);
        assert_eq!(data, &expected, "{}: the JSON data object", event.event_type);
        assert_eq!(json["event_type"], event.event_type.name());
        assert_eq!(json["nrta_seq_id"], 9);
        assert_eq!(json.get("rank").and_then(|r| r.as_u64()), event.rank.map(u64::from), "{}", event.event_type);
    }

    // NTFF: written as the recorder writes captures, read back as the tools read them.
    let metadata = Metadata { runtime_version: "test".into(), pid: 1, ..Metadata::default() };
    let mut recorder = Recorder::new(Writer::new(Vec::new(), &metadata).expect("a writer"));
    for event in &events {
        recorder.event(&TraceEvent::System(event.clone())).expect("recorded");
    }
    let (bytes, _) = recorder.finish().expect("finished");
    let file = NtffFile::from_bytes(bytes).expect("a readable file");
    let mut read = Vec::new();
    for info in file.chunks() {
        let chunk = file.read_chunk(info).expect("an intact chunk");
        read.extend(chunk.system.iter().map(|e| to_system_event(&file, e).expect("a runtime event")));
    }
    assert_eq!(read.len(), events.len());
    for (written, read) in events.iter().zip(&read) {
        assert_eq!(read, written, "{}: read back from NTFF", written.event_type);
    }
}

#[test]
fn a_status_is_in_the_data_only_when_the_event_carries_one() {
    let failed = decoded(EventType::NrtExecute, Phase::Stop, 0);
    let json = serde_json::to_value(&failed).expect("serializable");
    assert!(json["data"]["status"].is_i64(), "{json}");

    let ended =
        SystemRecord { event_type: EventType::NrtExecute as u16, phase: Phase::Stop as u8, ..Default::default() };
    let event = ended.to_event(1, None, &mut string, &host_ns).expect("a known type and phase");
    let json = serde_json::to_value(&event).expect("serializable");
    assert_eq!(json["data"], serde_json::json!({}), "{json}");
}
