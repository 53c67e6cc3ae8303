//! `nrt_init`, `nrt_close`, and what the instance and the library are: core counts,
//! instance info, version, memory per core.

use std::ffi::c_char;

use neuron_runtime::{Config, InstanceType, NrtError, NrtStatus};

use crate::boundary::{Status, c_chars, call, call_void, invalid, non_null, optional_str, write_out, write_versioned};
use crate::state;

/// `nrt_instance_info_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtInstanceInfo {
    pub family: u32,
    pub size: u32,
    pub arch_name: [c_char; 16],
    pub device_revision: [c_char; 8],
}

/// `nrt_version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtVersion {
    pub rt_major: u64,
    pub rt_minor: u64,
    pub rt_patch: u64,
    pub rt_maintenance: u64,
    pub rt_detail: [c_char; 128],
    pub git_hash: [c_char; 64],
}

/// `nrt_vnc_memory_stats_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtVncMemoryStats {
    pub bytes_used: usize,
    pub bytes_limit: usize,
}

const FRAMEWORK_TYPE_INVALID: u32 = 0;
const FRAMEWORK_TYPE_LAST: u32 = 5;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_init(framework: u32, fw_version: *const c_char, fal_version: *const c_char) -> Status {
    call("nrt_init", || {
        if framework == FRAMEWORK_TYPE_INVALID || framework > FRAMEWORK_TYPE_LAST {
            return Err(invalid("framework", format!("is {framework}, not an NRT_FRAMEWORK_TYPE_*")));
        }
        let fw_version = optional_str(fw_version, "fw_version", "")?;
        let fal_version = optional_str(fal_version, "fal_version", "")?;
        state::start()?;
        tracing::info!(framework, fw_version, fal_version, "nrt_init");
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_close() {
    call_void("nrt_close", || {
        // A profile still recording is finished first, so its file is complete.
        crate::profile::finish_before_close();
        crate::models::forget_communicators();
        state::close()
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_nc_count(vnc_count: *mut u32) -> Status {
    call("nrt_get_total_nc_count", || write_out(vnc_count, "vnc_count", state::core_counts()?.0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_vnc_count(vnc_count: *mut u32) -> Status {
    call("nrt_get_total_vnc_count", || write_out(vnc_count, "vnc_count", state::core_counts()?.0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_nc_count(vnc_count: *mut u32) -> Status {
    call("nrt_get_visible_nc_count", || write_out(vnc_count, "vnc_count", state::core_counts()?.1))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_vnc_count(vnc_count: *mut u32) -> Status {
    call("nrt_get_visible_vnc_count", || write_out(vnc_count, "vnc_count", state::core_counts()?.1))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_instance_info(info: *mut NrtInstanceInfo, instance_info_len: usize) -> Status {
    call("nrt_get_instance_info", || {
        let instance_type = match state::runtime() {
            Ok(runtime) => runtime.topology().instance_type,
            Err(_) => Config::from_env()?.instance_type,
        };
        let topology = instance_type.topology();
        let (family, size) = instance_family_and_size(instance_type);
        let value = NrtInstanceInfo {
            family,
            size,
            arch_name: c_chars(topology.device_type),
            device_revision: c_chars(&topology.core_version.to_string()),
        };
        write_versioned(info, instance_info_len, "info", &value).map(drop)
    })
}

/// `NRT_INSTANCE_*` and `NRT_INSTANCE_SIZE_*` of an instance type.
fn instance_family_and_size(instance_type: InstanceType) -> (u32, u32) {
    const TRN1: u32 = 2;
    const INF2: u32 = 4;
    const TRN2: u32 = 5;
    const SIZE_1XL: u32 = 0;
    const SIZE_2XL: u32 = 1;
    const SIZE_32XL: u32 = 6;
    const SIZE_48XL: u32 = 7;
    match instance_type {
        InstanceType::Trn1_2xlarge => (TRN1, SIZE_2XL),
        InstanceType::Trn1_32xlarge => (TRN1, SIZE_32XL),
        InstanceType::Inf2_xlarge => (INF2, SIZE_1XL),
        InstanceType::Inf2_48xlarge => (INF2, SIZE_48XL),
        InstanceType::Trn2_48xlarge => (TRN2, SIZE_48XL),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_version(ver: *mut NrtVersion, size: usize) -> Status {
    call("nrt_get_version", || {
        let number = |text: &str| text.parse::<u64>().unwrap_or_default();
        let value = NrtVersion {
            rt_major: number(env!("CARGO_PKG_VERSION_MAJOR")),
            rt_minor: number(env!("CARGO_PKG_VERSION_MINOR")),
            rt_patch: number(env!("CARGO_PKG_VERSION_PATCH")),
            rt_maintenance: 0,
            rt_detail: c_chars(concat!(
                "neuron-virt libnrt ",
                env!("CARGO_PKG_VERSION"),
                " (virtual NeuronCores on the host CPU)"
            )),
            git_hash: c_chars(""),
        };
        write_versioned(ver, size, "ver", &value).map(drop)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_vnc_memory_stats(
    vnc: u32,
    stats: *mut NrtVncMemoryStats,
    stats_size_in: usize,
    stats_size_out: *mut usize,
) -> Status {
    call("nrt_get_vnc_memory_stats", || {
        let runtime = state::runtime()?;
        let core = state::core_of(&runtime, i64::from(vnc), "vnc")?;
        let topology = runtime.topology();
        let value = NrtVncMemoryStats {
            bytes_used: runtime.device_memory_usage(core).total() as usize,
            bytes_limit: (topology.device_memory_bytes / u64::from(topology.cores_per_device())) as usize,
        };
        let written = write_versioned(stats, stats_size_in, "stats", &value)?;
        if !stats_size_out.is_null() {
            write_out(stats_size_out, "stats_size_out", written)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_host_device_id_get(neuron_dev: i32, host_device_id: *mut u32) -> Status {
    call("nrt_host_device_id_get", || {
        non_null(host_device_id, "host_device_id")?;
        let devices = match state::runtime() {
            Ok(runtime) => runtime.topology().device_count,
            Err(_) => Config::from_env()?.instance_type.topology().device_count,
        };
        match u32::try_from(neuron_dev) {
            Ok(device) if device < devices => write_out(host_device_id, "host_device_id", device),
            _ => Err(NrtError::new(
                NrtStatus::Invalid,
                format!("argument `neuron_dev` is {neuron_dev}, but the instance has {devices} Neuron devices"),
            )),
        }
    })
}
