//! The JSON shapes of events: system events as `nrt_sys_trace_fetch_events` returns
//! them (their `data` fields come from the payload declaration), device events as
//! `tail --json` prints them.

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::{DeviceActivity, DeviceEvent, SystemEvent};

/// The `nrt_sys_trace_fetch_events` shape: `event_type`, `phase`, `id`, `nc_idx`,
/// `tracking_id`, `thread_id`, `data`, `timestamp_ns`, then `nrta_seq_id` and the
/// core's `rank` when present.
impl Serialize for SystemEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("event_type", self.event_type.name())?;
        map.serialize_entry("phase", self.phase.name())?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("nc_idx", &self.nc_idx)?;
        map.serialize_entry("tracking_id", &self.tracking_id)?;
        map.serialize_entry("thread_id", &self.thread_id)?;
        map.serialize_entry("data", &DataJson(self))?;
        map.serialize_entry("timestamp_ns", &self.timestamp_ns)?;
        if let Some(seq) = self.nrta_seq_id {
            map.serialize_entry("nrta_seq_id", &seq)?;
        }
        if let Some(rank) = self.rank {
            map.serialize_entry("rank", &rank)?;
        }
        map.end()
    }
}

struct DataJson<'a>(&'a SystemEvent);

impl Serialize for DataJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(exec_id) = event.exec_id {
            map.serialize_entry("exec_id", &exec_id)?;
        }
        if let Some(model_id) = event.model_id {
            map.serialize_entry("model_id", &model_id)?;
        }
        event.data.try_for_each_field(|key, value| map.serialize_entry(key, &value))?;
        map.end()
    }
}

/// A device event as one JSON object: `event_type` (`instruction` or `dma`), `id`,
/// `nc_idx`, `data`, `start_ns`, `end_ns` (device clock).
impl Serialize for DeviceEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("event_type", self.type_name())?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("nc_idx", &self.nc_idx)?;
        map.serialize_entry("data", &DeviceDataJson(self))?;
        map.serialize_entry("start_ns", &self.start_ns)?;
        map.serialize_entry("end_ns", &self.end_ns)?;
        map.end()
    }
}

struct DeviceDataJson<'a>(&'a DeviceEvent);

impl Serialize for DeviceDataJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(exec_id) = event.exec_id {
            map.serialize_entry("exec_id", &exec_id)?;
        }
        map.serialize_entry("model_id", &event.model_id)?;
        match &event.activity {
            DeviceActivity::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written } => {
                map.serialize_entry("engine", engine.name())?;
                map.serialize_entry("opcode", opcode)?;
                map.serialize_entry("hlo", hlo)?;
                map.serialize_entry("step", step)?;
                map.serialize_entry("flops", flops)?;
                map.serialize_entry("bytes_read", bytes_read)?;
                map.serialize_entry("bytes_written", bytes_written)?;
            }
            DeviceActivity::Dma { queue, index, bytes } => {
                map.serialize_entry("queue", queue.name())?;
                map.serialize_entry("index", index)?;
                map.serialize_entry("bytes", bytes)?;
            }
        }
        map.end()
    }
}
