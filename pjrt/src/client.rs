//! `PJRT_Client`, `PJRT_Device` (which is its own `PJRT_DeviceDescription`) and
//! `PJRT_Memory`: the process's visible NeuronCores as devices, each with its device
//! memory, and the job's other processes' cores as devices this process cannot address.

use std::ffi::{CString, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use neuron_runtime::launch::{Launch, Launcher};
use neuron_runtime::{CompileOptions, Config, Runtime, Target};

use crate::error::{Error, Result, call, object};
use crate::ffi::{AttributesArgs, Head, NAMED_INT64, NAMED_STRING, NamedValue, Of, OfList, OfString, OfValue};

#[repr(C)]
pub(crate) struct DeviceAttributesArgs {
    pub(crate) head: Head,
    pub(crate) device: *mut Device,
    pub(crate) num_attributes: usize,
    pub(crate) attributes: *const NamedValue,
}

/// `PJRT_Client_Create_Args` (the key-value callbacks are not used: the job's ranks
/// meet through the runtime's own root).
#[repr(C)]
pub(crate) struct ClientCreateArgs {
    pub(crate) head: Head,
    pub(crate) create_options: *const NamedValue,
    pub(crate) num_options: usize,
    pub(crate) kv_get_callback: *mut c_void,
    pub(crate) kv_get_user_arg: *mut c_void,
    pub(crate) kv_put_callback: *mut c_void,
    pub(crate) kv_put_user_arg: *mut c_void,
    pub(crate) client: *mut Client,
}

/// `PJRT_Client_LookupDevice_Args` and `PJRT_Client_LookupAddressableDevice_Args`.
#[repr(C)]
pub(crate) struct LookupDeviceArgs {
    pub(crate) head: Head,
    pub(crate) client: *mut Client,
    pub(crate) id: c_int,
    pub(crate) device: *mut Device,
}

/// `PJRT_Client_DefaultDeviceAssignment_Args`.
#[repr(C)]
pub(crate) struct DefaultDeviceAssignmentArgs {
    pub(crate) head: Head,
    pub(crate) client: *mut Client,
    pub(crate) num_replicas: c_int,
    pub(crate) num_partitions: c_int,
    pub(crate) default_assignment_size: usize,
    pub(crate) default_assignment: *mut c_int,
}

/// `PJRT_Device_MemoryStats_Args`: the figures with their `_is_set` flags.
#[repr(C)]
pub(crate) struct MemoryStatsArgs {
    pub(crate) head: Head,
    pub(crate) device: *mut Device,
    pub(crate) bytes_in_use: i64,
    pub(crate) peak_bytes_in_use: i64,
    pub(crate) peak_bytes_in_use_is_set: bool,
    pub(crate) num_allocs: i64,
    pub(crate) num_allocs_is_set: bool,
    pub(crate) largest_alloc_size: i64,
    pub(crate) largest_alloc_size_is_set: bool,
    pub(crate) bytes_limit: i64,
    pub(crate) bytes_limit_is_set: bool,
}

/// The runtime this process's clients share (a process holds its cores once).
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

pub(crate) fn shared_runtime() -> neuron_runtime::NrtResult<Runtime> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(runtime) = slot.as_ref()
        && runtime.cores().is_ok()
    {
        return Ok(runtime.clone());
    }
    let runtime = Runtime::start(Config::from_env()?)?;
    *slot = Some(runtime.clone());
    Ok(runtime)
}

/// Where this process stands in its job, as torch-xla's launch code says it
/// (`NEURON_PJRT_PROCESS_INDEX`, and `NEURON_PJRT_PROCESSES_NUM_DEVICES` or
/// `NEURON_PJRT_WORLD_SIZE`, one device per process), read by the runtime's own
/// launch configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) process_index: usize,
    /// Devices of each process of the job, in process order.
    pub(crate) devices_per_process: Vec<usize>,
}

impl Job {
    /// The job of `launch` (another launcher's variables alone, say `mpirun`'s, make no
    /// PJRT job: the process drives its `local_devices` on its own).
    pub(crate) fn from_launch(launch: Option<&Launch>, local_devices: usize) -> Result<Job> {
        let Some(launch) = launch.filter(|l| l.launcher == Launcher::NeuronPjrt) else {
            return Ok(Job { process_index: 0, devices_per_process: vec![local_devices] });
        };
        let devices_per_process: Vec<usize> = match &launch.cores_per_process {
            Some(listed) => listed.iter().map(|&n| n as usize).collect(),
            None => vec![1; launch.processes as usize],
        };
        let process_index = launch.process as usize;
        let Some(&mine) = devices_per_process.get(process_index) else {
            return Err(Error::invalid(format!(
                "NEURON_PJRT_PROCESS_INDEX={process_index}, but the job has {} processes",
                devices_per_process.len()
            )));
        };
        if mine > local_devices {
            return Err(Error::invalid(format!(
                "this process is to drive {mine} NeuronCores, but it sees {local_devices} \
                 (NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES)"
            )));
        }
        Ok(Job { process_index, devices_per_process })
    }
}

/// `PJRT_Client`.
pub(crate) struct Client {
    pub(crate) runtime: Runtime,
    pub(crate) job: Job,
    /// Owns the devices the lists point to (boxed: a device and its memory point to
    /// each other, so neither may move).
    #[allow(clippy::vec_box)]
    _devices: Vec<Box<Device>>,
    device_list: Vec<*mut Device>,
    addressable: Vec<*mut Device>,
    memories: Vec<*mut Memory>,
    platform_version: String,
    /// The compile options of `NEURON_CC_FLAGS` over the instance's defaults.
    pub(crate) compile_options: CompileOptions,
    /// Where compiled graphs are kept across processes, unless turned off.
    pub(crate) cache: Option<crate::cache::Cache>,
    /// Device arrays kept for reuse after their buffers are destroyed.
    pub(crate) pool: std::sync::Arc<crate::pool::Pool>,
    /// The graphs compiled and the executions run, for the trace's `graph_compile`.
    pub(crate) graphs: crate::graphs::Graphs,
}

// SAFETY: the raw pointers are to this client's own boxed devices and memories, which
// live as long as it and are never mutated after creation.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

/// `PJRT_Device` and its `PJRT_DeviceDescription`.
pub(crate) struct Device {
    pub(crate) id: c_int,
    pub(crate) process_index: c_int,
    /// The runtime's core index, for a device of this process.
    pub(crate) core: Option<u32>,
    /// Its index among this process's devices (`-1` elsewhere).
    pub(crate) local_id: c_int,
    kind: String,
    debug: String,
    display: String,
    pub(crate) memory: Box<Memory>,
    memory_list: [*mut Memory; 1],
    attributes: Vec<NamedValue>,
    _attribute_text: Vec<CString>,
}

/// `PJRT_Memory`: a device's device memory.
pub(crate) struct Memory {
    pub(crate) id: c_int,
    pub(crate) device: *mut Device,
    devices: [*mut Device; 1],
    debug: String,
}

fn platform_target(runtime: &Runtime) -> Target {
    let name = runtime.topology().instance_type.name();
    let family = name.split('.').next().unwrap_or(name);
    family.parse::<Target>().unwrap_or_default()
}

impl Client {
    fn new() -> Result<Client> {
        let runtime = shared_runtime()?;
        let cores = runtime.cores()?;
        let job = Job::from_launch(runtime.config().launch.as_ref(), cores.len())?;
        let flags = std::env::var("NEURON_CC_FLAGS").unwrap_or_default();
        let (compile_options, cache_flags, ignored) =
            crate::flags::compile_options(&flags, platform_target(&runtime)).map_err(Error::invalid)?;
        let cache = crate::cache::Cache::from_settings(&cache_flags, std::env::var("NEURON_COMPILE_CACHE_URL").ok());
        if !ignored.is_empty() {
            tracing::info!("NEURON_CC_FLAGS: ignoring {} (not meaningful to this compiler)", ignored.join(", "));
        }
        let topology = runtime.topology().clone();
        let kind = format!("NC_{}", topology.core_version);
        let mut devices = Vec::new();
        let mut id = 0;
        for (process, &count) in job.devices_per_process.iter().enumerate() {
            for local in 0..count {
                let core = (process == job.process_index).then(|| cores.cores()[local]);
                devices.push(Device::new(id, process, core, local, &kind, topology.instance_type.name()));
                id += 1;
            }
        }
        let device_list: Vec<*mut Device> = devices.iter_mut().map(|d| &mut **d as *mut Device).collect();
        let addressable: Vec<*mut Device> =
            devices.iter_mut().filter(|d| d.core.is_some()).map(|d| &mut **d as *mut Device).collect();
        let memories = devices.iter_mut().filter(|d| d.core.is_some()).map(|d| &mut *d.memory as *mut Memory).collect();
        Ok(Client {
            platform_version: format!(
                "neuron-virt {} ({}, {} NeuronCores in this process)",
                env!("CARGO_PKG_VERSION"),
                topology.instance_type.name(),
                cores.len()
            ),
            runtime,
            job,
            _devices: devices,
            device_list,
            addressable,
            memories,
            compile_options,
            cache,
            pool: std::sync::Arc::default(),
            graphs: crate::graphs::Graphs::default(),
        })
    }

    /// The device with global id `id` that this process drives.
    pub(crate) fn addressable_device(&self, pointer: *mut Device) -> Result<&Device> {
        if !self.addressable.contains(&pointer) {
            return Err(Error::invalid("the device is not one of this process's devices"));
        }
        // SAFETY: one of this client's boxed devices.
        Ok(unsafe { &*pointer })
    }

    /// The devices of this process among the job's first `replicas` (where a program of
    /// that many replicas runs).
    pub(crate) fn addressable_devices(&self, replicas: usize) -> Vec<*mut Device> {
        self.device_list.iter().take(replicas).copied().filter(|d| self.addressable.contains(d)).collect()
    }

    /// The devices of the job.
    pub(crate) fn device_count(&self) -> usize {
        self.device_list.len()
    }
}

impl Device {
    fn new(id: usize, process: usize, core: Option<u32>, local: usize, kind: &str, instance: &str) -> Box<Device> {
        let mut memory = Box::new(Memory {
            id: id as c_int,
            device: std::ptr::null_mut(),
            devices: [std::ptr::null_mut()],
            debug: format!("device memory of NeuronCore {id}"),
        });
        let place = match core {
            Some(core) => format!("nc{core} of this process"),
            None => format!("a NeuronCore of process {process}"),
        };
        let memory_pointer = &mut *memory as *mut Memory;
        let text = vec![CString::new(instance).unwrap_or_default()];
        let mut device = Box::new(Device {
            id: id as c_int,
            process_index: process as c_int,
            core,
            local_id: if core.is_some() { local as c_int } else { -1 },
            kind: kind.to_owned(),
            debug: format!("NeuronCore {id} ({kind}, {place}, {instance})"),
            display: format!("NeuronDevice(id={id}, process_index={process}, kind={kind})"),
            memory,
            memory_list: [memory_pointer],
            attributes: Vec::new(),
            _attribute_text: text,
        });
        let device_pointer = &mut *device as *mut Device;
        device.memory.device = device_pointer;
        device.memory.devices = [device_pointer];
        let named = |name: &'static std::ffi::CStr, kind, value: u64, size| NamedValue {
            head: crate::ffi::Head {
                struct_size: std::mem::size_of::<NamedValue>(),
                extension_start: std::ptr::null_mut(),
            },
            name: name.as_ptr(),
            name_size: name.count_bytes(),
            kind,
            value,
            value_size: size,
        };
        let instance_text = &device._attribute_text[0];
        device.attributes = vec![
            named(c"neuron_core", NAMED_INT64, core.map_or(u64::MAX, u64::from), 1),
            named(c"instance_type", NAMED_STRING, instance_text.as_ptr() as u64, instance_text.count_bytes()),
        ];
        device
    }
}

/// The process-lifetime plugin attributes.
static PLUGIN_ATTRIBUTES: OnceLock<Vec<NamedValue>> = OnceLock::new();

pub(crate) unsafe extern "C" fn plugin_initialize(args: *mut crate::ffi::Head) -> *mut Error {
    call("PJRT_Plugin_Initialize", args, |_| Ok(()))
}

pub(crate) unsafe extern "C" fn plugin_attributes(args: *mut AttributesArgs) -> *mut Error {
    call("PJRT_Plugin_Attributes", args, |args| {
        let attributes = PLUGIN_ATTRIBUTES.get_or_init(|| {
            let version = c"neuron-virt";
            vec![NamedValue {
                head: crate::ffi::Head {
                    struct_size: std::mem::size_of::<NamedValue>(),
                    extension_start: std::ptr::null_mut(),
                },
                name: c"xla_version".as_ptr(),
                name_size: c"xla_version".count_bytes(),
                kind: NAMED_STRING,
                value: version.as_ptr() as u64,
                value_size: version.count_bytes(),
            }]
        });
        (args.attributes, args.num_attributes) = (attributes.as_ptr(), attributes.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn create(args: *mut ClientCreateArgs) -> *mut Error {
    call("PJRT_Client_Create", args, |args| {
        args.client = Box::into_raw(Box::new(Client::new()?));
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn destroy(args: *mut Of<Client>) -> *mut Error {
    call("PJRT_Client_Destroy", args, |args| {
        if !args.object.is_null() {
            // SAFETY: a client this plugin made, destroyed once by its owner.
            drop(unsafe { Box::from_raw(args.object) });
        }
        Ok(())
    })
}

fn text<T>(args: &mut OfString<T>, text: &str) {
    (args.text, args.size) = (text.as_ptr().cast(), text.len());
}

pub(crate) unsafe extern "C" fn platform_name(args: *mut OfString<Client>) -> *mut Error {
    call("PJRT_Client_PlatformName", args, |args| {
        // SAFETY: a client this plugin made.
        unsafe { object("client", args.object) }?;
        text(args, "neuron");
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn platform_version(args: *mut OfString<Client>) -> *mut Error {
    call("PJRT_Client_PlatformVersion", args, |args| {
        // SAFETY: a client this plugin made; the text lives as long as it.
        let client = unsafe { object("client", args.object) }?;
        (args.text, args.size) = (client.platform_version.as_ptr().cast(), client.platform_version.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn process_index(args: *mut OfValue<Client, c_int>) -> *mut Error {
    call("PJRT_Client_ProcessIndex", args, |args| {
        // SAFETY: a client this plugin made.
        args.value = unsafe { object("client", args.object) }?.job.process_index as c_int;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn devices(args: *mut OfList<Client, Device>) -> *mut Error {
    call("PJRT_Client_Devices", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.object) }?;
        (args.list, args.count) = (client.device_list.as_ptr(), client.device_list.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn addressable_devices(args: *mut OfList<Client, Device>) -> *mut Error {
    call("PJRT_Client_AddressableDevices", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.object) }?;
        (args.list, args.count) = (client.addressable.as_ptr(), client.addressable.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn addressable_memories(args: *mut OfList<Client, Memory>) -> *mut Error {
    call("PJRT_Client_AddressableMemories", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.object) }?;
        (args.list, args.count) = (client.memories.as_ptr(), client.memories.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn lookup_device(args: *mut LookupDeviceArgs) -> *mut Error {
    call("PJRT_Client_LookupDevice", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.client) }?;
        let index = usize::try_from(args.id).ok().filter(|&i| i < client.device_list.len());
        let index = index.ok_or_else(|| Error::invalid(format!("no device has id {}", args.id)))?;
        args.device = client.device_list[index];
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn lookup_addressable_device(args: *mut LookupDeviceArgs) -> *mut Error {
    call("PJRT_Client_LookupAddressableDevice", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.client) }?;
        let index = usize::try_from(args.id).ok().filter(|&i| i < client.addressable.len());
        let index = index
            .ok_or_else(|| Error::invalid(format!("no device of this process has local hardware id {}", args.id)))?;
        args.device = client.addressable[index];
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn default_device_assignment(args: *mut DefaultDeviceAssignmentArgs) -> *mut Error {
    call("PJRT_Client_DefaultDeviceAssignment", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.client) }?;
        let count = usize::try_from(i64::from(args.num_replicas) * i64::from(args.num_partitions))
            .map_err(|_| Error::invalid("negative replica or partition count"))?;
        if count > client.device_list.len() {
            return Err(Error::invalid(format!(
                "{count} devices asked for, but the job has {}",
                client.device_list.len()
            )));
        }
        if args.default_assignment.is_null() || args.default_assignment_size < count {
            return Err(Error::invalid("the assignment array is NULL or too small"));
        }
        for index in 0..count {
            // SAFETY: the caller's array holds `default_assignment_size` ints.
            unsafe { *args.default_assignment.add(index) = index as c_int };
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description(args: *mut OfValue<Device, *mut Device>) -> *mut Error {
    call("PJRT_Device_GetDescription", args, |args| {
        // SAFETY: a device this plugin made; it is its own description.
        unsafe { object("device", args.object) }?;
        args.value = args.object;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_id(args: *mut OfValue<Device, c_int>) -> *mut Error {
    call("PJRT_DeviceDescription_Id", args, |args| {
        // SAFETY: a device this plugin made.
        args.value = unsafe { object("device description", args.object) }?.id;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_process_index(args: *mut OfValue<Device, c_int>) -> *mut Error {
    call("PJRT_DeviceDescription_ProcessIndex", args, |args| {
        // SAFETY: a device this plugin made.
        args.value = unsafe { object("device description", args.object) }?.process_index;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_attributes(args: *mut DeviceAttributesArgs) -> *mut Error {
    call("PJRT_DeviceDescription_Attributes", args, |args| {
        // SAFETY: a device this plugin made.
        let device = unsafe { object("device description", args.device) }?;
        (args.attributes, args.num_attributes) = (device.attributes.as_ptr(), device.attributes.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_kind(args: *mut OfString<Device>) -> *mut Error {
    call("PJRT_DeviceDescription_Kind", args, |args| {
        // SAFETY: a device this plugin made; its text lives as long as it.
        let device = unsafe { object("device description", args.object) }?;
        (args.text, args.size) = (device.kind.as_ptr().cast(), device.kind.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_debug_string(args: *mut OfString<Device>) -> *mut Error {
    call("PJRT_DeviceDescription_DebugString", args, |args| {
        // SAFETY: as above.
        let device = unsafe { object("device description", args.object) }?;
        (args.text, args.size) = (device.debug.as_ptr().cast(), device.debug.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn description_to_string(args: *mut OfString<Device>) -> *mut Error {
    call("PJRT_DeviceDescription_ToString", args, |args| {
        // SAFETY: as above.
        let device = unsafe { object("device description", args.object) }?;
        (args.text, args.size) = (device.display.as_ptr().cast(), device.display.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn is_addressable(args: *mut OfValue<Device, bool>) -> *mut Error {
    call("PJRT_Device_IsAddressable", args, |args| {
        // SAFETY: a device this plugin made.
        args.value = unsafe { object("device", args.object) }?.core.is_some();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn local_hardware_id(args: *mut OfValue<Device, c_int>) -> *mut Error {
    call("PJRT_Device_LocalHardwareId", args, |args| {
        // SAFETY: a device this plugin made.
        args.value = unsafe { object("device", args.object) }?.local_id;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn device_memories(args: *mut OfList<Device, Memory>) -> *mut Error {
    call("PJRT_Device_AddressableMemories", args, |args| {
        // SAFETY: a device this plugin made.
        let device = unsafe { object("device", args.object) }?;
        (args.list, args.count) = (device.memory_list.as_ptr(), usize::from(device.core.is_some()));
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn default_memory(args: *mut OfValue<Device, *mut Memory>) -> *mut Error {
    call("PJRT_Device_DefaultMemory", args, |args| {
        // SAFETY: a device this plugin made.
        let device = unsafe { object("device", args.object) }?;
        args.value = device.memory_list[0];
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_stats(args: *mut MemoryStatsArgs) -> *mut Error {
    call("PJRT_Device_MemoryStats", args, |args| {
        // SAFETY: a device this plugin made.
        let device = unsafe { object("device", args.device) }?;
        let core = device.core.ok_or_else(|| Error::invalid("the device is not one of this process's"))?;
        let runtime = shared_runtime()?;
        args.bytes_in_use = runtime.device_memory_usage(core).total() as i64;
        let topology = runtime.topology();
        let per_core = topology.device_memory_bytes / u64::from(topology.cores_per_device().max(1));
        (args.bytes_limit, args.bytes_limit_is_set) = (per_core as i64, true);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_id(args: *mut OfValue<Memory, c_int>) -> *mut Error {
    call("PJRT_Memory_Id", args, |args| {
        // SAFETY: a memory this plugin made.
        args.value = unsafe { object("memory", args.object) }?.id;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_kind(args: *mut OfString<Memory>) -> *mut Error {
    call("PJRT_Memory_Kind", args, |args| {
        // SAFETY: a memory this plugin made.
        unsafe { object("memory", args.object) }?;
        text(args, "device");
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_kind_id(args: *mut OfValue<Memory, c_int>) -> *mut Error {
    call("PJRT_Memory_Kind_Id", args, |args| {
        // SAFETY: a memory this plugin made.
        unsafe { object("memory", args.object) }?;
        args.value = 0;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_debug_string(args: *mut OfString<Memory>) -> *mut Error {
    call("PJRT_Memory_DebugString", args, |args| {
        // SAFETY: a memory this plugin made; its text lives as long as it.
        let memory = unsafe { object("memory", args.object) }?;
        (args.text, args.size) = (memory.debug.as_ptr().cast(), memory.debug.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_devices(args: *mut OfList<Memory, Device>) -> *mut Error {
    call("PJRT_Memory_AddressableByDevices", args, |args| {
        // SAFETY: a memory this plugin made.
        let memory = unsafe { object("memory", args.object) }?;
        (args.list, args.count) = (memory.devices.as_ptr(), 1);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_comes_from_torch_xlas_variables() {
        let launch = |launcher, process, processes, listed: Option<Vec<u32>>| Launch {
            launcher,
            process,
            processes,
            local_process: None,
            local_processes: None,
            cores_per_process: listed,
        };
        let alone = Job { process_index: 0, devices_per_process: vec![2] };
        assert_eq!(Job::from_launch(None, 2).expect("a job"), alone);
        // mpirun's variables alone are no PJRT job.
        assert_eq!(Job::from_launch(Some(&launch(Launcher::OpenMpi, 1, 2, None)), 2).expect("a job"), alone);
        assert_eq!(
            Job::from_launch(Some(&launch(Launcher::NeuronPjrt, 1, 2, None)), 1).expect("a job"),
            Job { process_index: 1, devices_per_process: vec![1, 1] }
        );
        let listed = launch(Launcher::NeuronPjrt, 1, 2, Some(vec![2, 2]));
        assert_eq!(Job::from_launch(Some(&listed), 2).expect("a job").devices_per_process, [2, 2]);
        let error = Job::from_launch(Some(&launch(Launcher::NeuronPjrt, 2, 2, None)), 1).expect_err("refused");
        assert!(error.message.contains("has 2 processes"), "{error:?}");
        let error = Job::from_launch(Some(&launch(Launcher::NeuronPjrt, 0, 1, Some(vec![4]))), 1).expect_err("refused");
        assert!(error.message.contains("sees 1"), "{error:?}");
    }
}
