//! The `PJRT_Api` table: every function of the 0.90 header in its order, each either
//! implemented here or answering UNIMPLEMENTED with its own name.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::error::{Error, unimplemented_entry};
use crate::ffi::{API_MAJOR, API_MINOR, ENTRY_COUNT, Entry, Head};
use crate::{buffer, client, error, event, executable};

/// An implementation as a table entry (every entry takes a pointer to its own
/// argument struct and returns an error or NULL).
fn entry<T>(function: unsafe extern "C" fn(*mut T) -> *mut Error) -> Entry {
    // SAFETY: only the pointee type of the one pointer argument differs.
    unsafe { std::mem::transmute::<unsafe extern "C" fn(*mut T) -> *mut Error, Entry>(function) }
}

macro_rules! table {
    ($($name:ident $(= $function:expr)?),* $(,)?) => {
        /// The functions' names, in the table's order.
        #[cfg(test)]
        pub(crate) const NAMES: &[&str] = &[$(concat!("PJRT_", stringify!($name))),*];

/// `PJRT_Api`: the version, then the functions in the header's order
/// ([`crate::table::NAMES`]).
#[repr(C)]
pub(crate) struct Api {
    pub(crate) head: Head,
    pub(crate) version: ApiVersion,
    pub(crate) entries: [Entry; ENTRY_COUNT],
}

/// `PJRT_Api_Version`.
#[repr(C)]
pub(crate) struct ApiVersion {
    pub(crate) head: Head,
    pub(crate) major_version: c_int,
    pub(crate) minor_version: c_int,
}

// SAFETY: the table is immutable once built; its pointers are to static data.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}


        fn entries() -> Vec<Entry> {
            vec![$(table!(@entry $name $(= $function)?)),*]
        }
    };
    (@entry $name:ident = $function:expr) => { entry($function) };
    (@entry $name:ident) => {{
        unsafe extern "C" fn missing(args: *mut c_void) -> *mut c_void {
            unimplemented_entry(concat!("PJRT_", stringify!($name)), args).cast()
        }
        missing as Entry
    }};
}

table! {
    Error_Destroy = error::error_destroy,
    Error_Message = error::error_message,
    Error_GetCode = error::error_get_code,
    Plugin_Initialize = client::plugin_initialize,
    Plugin_Attributes = client::plugin_attributes,
    Event_Destroy = event::destroy,
    Event_IsReady = event::is_ready,
    Event_Error = event::error,
    Event_Await = event::wait,
    Event_OnReady = event::on_ready,
    Client_Create = client::create,
    Client_Destroy = client::destroy,
    Client_PlatformName = client::platform_name,
    Client_ProcessIndex = client::process_index,
    Client_PlatformVersion = client::platform_version,
    Client_Devices = client::devices,
    Client_AddressableDevices = client::addressable_devices,
    Client_LookupDevice = client::lookup_device,
    Client_LookupAddressableDevice = client::lookup_addressable_device,
    Client_AddressableMemories = client::addressable_memories,
    Client_Compile = executable::client_compile,
    Client_DefaultDeviceAssignment = client::default_device_assignment,
    Client_BufferFromHostBuffer = buffer::from_host,
    DeviceDescription_Id = client::description_id,
    DeviceDescription_ProcessIndex = client::description_process_index,
    DeviceDescription_Attributes = client::description_attributes,
    DeviceDescription_Kind = client::description_kind,
    DeviceDescription_DebugString = client::description_debug_string,
    DeviceDescription_ToString = client::description_to_string,
    Device_GetDescription = client::description,
    Device_IsAddressable = client::is_addressable,
    Device_LocalHardwareId = client::local_hardware_id,
    Device_AddressableMemories = client::device_memories,
    Device_DefaultMemory = client::default_memory,
    Device_MemoryStats = client::memory_stats,
    Memory_Id = client::memory_id,
    Memory_Kind = client::memory_kind,
    Memory_DebugString = client::memory_debug_string,
    Memory_ToString = client::memory_debug_string,
    Memory_AddressableByDevices = client::memory_devices,
    Executable_Destroy = executable::destroy,
    Executable_Name = executable::name,
    Executable_NumReplicas = executable::num_replicas,
    Executable_NumPartitions = executable::num_partitions,
    Executable_NumOutputs = executable::num_outputs,
    Executable_SizeOfGeneratedCodeInBytes = executable::code_size,
    Executable_GetCostAnalysis = executable::cost_analysis,
    Executable_OutputMemoryKinds = executable::output_memory_kinds,
    Executable_OptimizedProgram = executable::optimized_program,
    Executable_Serialize = executable::serialize,
    LoadedExecutable_Destroy = executable::loaded_destroy,
    LoadedExecutable_GetExecutable = executable::loaded_get_executable,
    LoadedExecutable_AddressableDevices = executable::loaded_devices,
    LoadedExecutable_Delete = executable::loaded_delete,
    LoadedExecutable_IsDeleted = executable::loaded_is_deleted,
    LoadedExecutable_Execute = executable::execute,
    Executable_DeserializeAndLoad = executable::deserialize_and_load,
    LoadedExecutable_Fingerprint = executable::loaded_fingerprint,
    Buffer_Destroy = buffer::destroy,
    Buffer_ElementType = buffer::element_type,
    Buffer_Dimensions = buffer::dimensions,
    Buffer_UnpaddedDimensions = buffer::unpadded_dimensions,
    Buffer_DynamicDimensionIndices = buffer::dynamic_dimension_indices,
    Buffer_GetMemoryLayout = buffer::memory_layout,
    Buffer_OnDeviceSizeInBytes = buffer::on_device_size,
    Buffer_Device = buffer::device,
    Buffer_Memory = buffer::memory,
    Buffer_Delete = buffer::delete,
    Buffer_IsDeleted = buffer::is_deleted,
    Buffer_CopyToDevice = buffer::copy_to_device,
    Buffer_ToHostBuffer = buffer::to_host,
    Buffer_IsOnCpu = buffer::is_on_cpu,
    Buffer_ReadyEvent = buffer::ready_event,
    Buffer_UnsafePointer = buffer::unsafe_pointer,
    Buffer_IncreaseExternalReferenceCount = buffer::external_reference,
    Buffer_DecreaseExternalReferenceCount = buffer::external_reference,
    Buffer_OpaqueDeviceMemoryDataPointer = buffer::unsafe_pointer,
    CopyToDeviceStream_Destroy,
    CopyToDeviceStream_AddChunk,
    CopyToDeviceStream_TotalBytes,
    CopyToDeviceStream_GranuleSize,
    CopyToDeviceStream_CurrentBytes,
    TopologyDescription_Create,
    TopologyDescription_Destroy,
    TopologyDescription_PlatformName,
    TopologyDescription_PlatformVersion,
    TopologyDescription_GetDeviceDescriptions,
    TopologyDescription_Serialize,
    TopologyDescription_Attributes,
    Compile,
    Executable_OutputElementTypes = executable::output_element_types,
    Executable_OutputDimensions = executable::output_dimensions,
    Buffer_CopyToMemory = buffer::copy_to_memory,
    Client_CreateViewOfDeviceBuffer,
    Executable_Fingerprint = executable::fingerprint,
    Client_TopologyDescription,
    Executable_GetCompiledMemoryStats,
    Memory_Kind_Id = client::memory_kind_id,
    ExecuteContext_Create,
    ExecuteContext_Destroy,
    Buffer_CopyRawToHost = buffer::copy_raw_to_host,
    AsyncHostToDeviceTransferManager_Destroy,
    AsyncHostToDeviceTransferManager_TransferData,
    Client_CreateBuffersForAsyncHostToDevice,
    AsyncHostToDeviceTransferManager_RetrieveBuffer,
    AsyncHostToDeviceTransferManager_Device,
    AsyncHostToDeviceTransferManager_BufferCount,
    AsyncHostToDeviceTransferManager_BufferSize,
    AsyncHostToDeviceTransferManager_SetBufferError,
    AsyncHostToDeviceTransferManager_AddMetadata,
    Client_DmaMap,
    Client_DmaUnmap,
    Client_CreateUninitializedBuffer,
    Client_UpdateGlobalProcessInfo,
    TopologyDescription_Deserialize,
    Client_CreateAliasBuffer,
    Client_FulfillAliasBuffer,
    LoadedExecutable_GetDeviceAssignment,
    Client_CreateErrorBuffer,
    AsyncHostToDeviceTransferManager_TransferLiteral,
    Buffer_CopyRawToHostFuture,
    Device_PoisonExecution,
    Device_CreateAsyncTrackingEvent,
    AsyncTrackingEvent_Destroy,
    Executable_GetCompileOptions,
    Buffer_DonateWithControlDependency,
    Event_Create,
    Event_Set,
}

static API: OnceLock<Api> = OnceLock::new();

/// The table, built once.
pub(crate) fn api() -> &'static Api {
    API.get_or_init(|| {
        let entries: [Entry; ENTRY_COUNT] = entries()
            .try_into()
            .unwrap_or_else(|e: Vec<Entry>| panic!("the PJRT table has {} entries, not {ENTRY_COUNT}", e.len()));
        Api {
            head: Head { struct_size: std::mem::size_of::<Api>(), extension_start: std::ptr::null_mut() },
            version: ApiVersion {
                head: Head { struct_size: std::mem::size_of::<ApiVersion>(), extension_start: std::ptr::null_mut() },
                major_version: API_MAJOR,
                minor_version: API_MINOR,
            },
            entries,
        }
    })
}
