//! Memory accounting by location and category, with device capacity enforced.
//!
//! Every byte the runtime holds on behalf of a user is a [`MemoryCharge`]: taken when
//! the memory is allocated, returned when the charge is dropped. Counters therefore
//! never drift from what is actually held, and device allocations past a device's
//! capacity fail with `NRT_RESOURCE` and a usage table, before anything is allocated.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{NrtError, NrtResult, NrtStatus};
use neuron_datastore::topology::Topology;
use neuron_datastore::{DeviceCategory, HostCategory};

/// Where a charge is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Charge {
    Host(HostCategory),
    Device { core: u32, category: DeviceCategory },
}

/// Bytes in use per category on one NeuronCore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceUsage([u64; 5]);

impl DeviceUsage {
    pub fn get(&self, category: DeviceCategory) -> u64 {
        self.0[category as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// Bytes in use per host category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostUsage([u64; 4]);

impl HostUsage {
    pub fn get(&self, category: HostCategory) -> u64 {
        self.0[category as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The counters for one runtime.
#[derive(Debug)]
pub struct MemoryLedger {
    cores_per_device: u32,
    device_capacity: u64,
    /// Per core, per device category.
    device: Vec<[AtomicU64; 5]>,
    host: [AtomicU64; 4],
    /// Serialises capacity checks with the additions they guard.
    device_allocation: Mutex<()>,
    /// Receives every change, to publish it (the datastore's memory counters).
    mirror: OnceLock<MemoryMirror>,
}

/// A receiver of memory counter changes: `(charge, bytes, added)`.
pub(crate) struct MemoryMirror(pub(crate) Box<dyn Fn(Charge, u64, bool) + Send + Sync>);

impl fmt::Debug for MemoryMirror {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoryMirror")
    }
}

impl MemoryLedger {
    pub fn new(topology: &Topology) -> Arc<MemoryLedger> {
        Arc::new(MemoryLedger {
            cores_per_device: topology.cores_per_device(),
            device_capacity: topology.device_memory_bytes,
            device: (0..topology.core_count()).map(|_| Default::default()).collect(),
            host: Default::default(),
            device_allocation: Mutex::new(()),
            mirror: OnceLock::new(),
        })
    }

    /// Charges `bytes` to `charge`, failing with `NRT_RESOURCE` if a device would
    /// exceed its capacity.
    pub fn charge(self: &Arc<Self>, charge: Charge, bytes: u64) -> NrtResult<MemoryCharge> {
        match charge {
            Charge::Host(category) => {
                self.host[category as usize].fetch_add(bytes, Ordering::Relaxed);
            }
            Charge::Device { core, category } => {
                let counters = self
                    .device
                    .get(core as usize)
                    .ok_or_else(|| NrtError::invalid(format!("NeuronCore {core} does not exist")))?;
                let _guard = self.device_allocation.lock().unwrap_or_else(|e| e.into_inner());
                let device = core / self.cores_per_device;
                let in_use = self.device_in_use(device);
                if in_use.checked_add(bytes).is_none_or(|total| total > self.device_capacity) {
                    return Err(self.out_of_memory(core, category, bytes));
                }
                counters[category as usize].fetch_add(bytes, Ordering::Relaxed);
            }
        }
        if let Some(mirror) = self.mirror.get() {
            (mirror.0)(charge, bytes, true);
        }
        Ok(MemoryCharge { ledger: Arc::clone(self), charge, bytes })
    }

    /// Sends every later change to `mirror` (set once, at init, before any charge).
    pub(crate) fn set_mirror(&self, mirror: MemoryMirror) {
        let _ = self.mirror.set(mirror);
    }

    pub fn device_usage(&self, core: u32) -> DeviceUsage {
        let mut usage = DeviceUsage::default();
        if let Some(counters) = self.device.get(core as usize) {
            for (slot, counter) in usage.0.iter_mut().zip(counters) {
                *slot = counter.load(Ordering::Relaxed);
            }
        }
        usage
    }

    pub fn host_usage(&self) -> HostUsage {
        let mut usage = HostUsage::default();
        for (slot, counter) in usage.0.iter_mut().zip(&self.host) {
            *slot = counter.load(Ordering::Relaxed);
        }
        usage
    }

    fn device_cores(&self, device: u32) -> std::ops::Range<u32> {
        device * self.cores_per_device..(device + 1) * self.cores_per_device
    }

    fn device_in_use(&self, device: u32) -> u64 {
        self.device_cores(device).map(|c| self.device_usage(c).total()).sum()
    }

    fn out_of_memory(&self, core: u32, category: DeviceCategory, bytes: u64) -> NrtError {
        let device = core / self.cores_per_device;
        let cores: Vec<u32> = self.device_cores(device).collect();
        let usages: Vec<DeviceUsage> = cores.iter().map(|&c| self.device_usage(c)).collect();
        let mut message = format!(
            "Failed to allocate {} ({}) on ND {device}:NC {core}: device {device} has {} of memory and {} is in use\n",
            HumanBytes(bytes),
            category.name(),
            HumanBytes(self.device_capacity),
            HumanBytes(self.device_in_use(device)),
        );
        message.push_str(&format!("  {:<26}", "category"));
        for c in &cores {
            message.push_str(&format!("{:>12}", format!("NC {c}")));
        }
        message.push('\n');
        for &category in DeviceCategory::ALL {
            message.push_str(&format!("  {:<26}", category.name()));
            for usage in &usages {
                message.push_str(&format!("{:>12}", HumanBytes(usage.get(category)).to_string()));
            }
            message.push('\n');
        }
        message.push_str("Free tensors or unload models on this device, or place the allocation on another device");
        NrtError::new(NrtStatus::Resource, message)
    }
}

/// Bytes held against a category; returned when dropped.
#[derive(Debug)]
pub struct MemoryCharge {
    ledger: Arc<MemoryLedger>,
    charge: Charge,
    bytes: u64,
}

impl MemoryCharge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn charge(&self) -> Charge {
        self.charge
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        let counter = match self.charge {
            Charge::Host(category) => &self.ledger.host[category as usize],
            Charge::Device { core, category } => &self.ledger.device[core as usize][category as usize],
        };
        counter.fetch_sub(self.bytes, Ordering::Relaxed);
        if let Some(mirror) = self.ledger.mirror.get() {
            (mirror.0)(self.charge, self.bytes, false);
        }
    }
}

/// Formats a byte count with a binary unit: `512 B`, `1.5 KiB`, `4.0 GiB`.
#[derive(Debug, Clone, Copy)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::topology::InstanceType;

    #[test]
    fn charges_are_returned_on_drop_and_capacity_is_per_device() {
        let ledger = MemoryLedger::new(&InstanceType::Trn1_2xlarge.topology());
        let tensors = Charge::Device { core: 0, category: DeviceCategory::Tensors };
        let a = ledger.charge(tensors, 20 << 30).expect("fits");
        let b = ledger.charge(Charge::Device { core: 1, category: DeviceCategory::Constants }, 10 << 30).expect("fits");
        let err = ledger.charge(tensors, 4 << 30).expect_err("device 0 is full");
        assert_eq!(err.status, NrtStatus::Resource);
        assert!(err.message.contains("Failed to allocate 4.0 GiB (tensors) on ND 0:NC 0"), "{}", err.message);
        assert!(err.message.contains("model_shared_scratchpad"), "{}", err.message);
        assert_eq!(ledger.device_usage(0).get(DeviceCategory::Tensors), 20 << 30);
        drop(a);
        drop(b);
        assert_eq!(ledger.device_usage(0).total(), 0);
        ledger.charge(tensors, 30 << 30).expect("room again");
    }

    #[test]
    fn byte_counts_are_human_readable() {
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(1536).to_string(), "1.5 KiB");
        assert_eq!(HumanBytes((4 << 30) + 1).to_string(), "4.0 GiB");
    }
}
