//! The plugin through its C table, as a framework calls it: the table's shape and
//! version, every entry given NULL or too short a struct (an error, never a crash),
//! devices and memories, buffers to and from the host, a program compiled from an
//! `HloModuleProto` and executed, the optimized program torch-xla reads back, events.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

use prost::Message;

use crate::buffer::Buffer;
use crate::buffer::{BufferFromHostArgs, ToHostArgs};
use crate::client::ClientCreateArgs;
use crate::client::{Client, Device, Memory};
use crate::error::{Code, Error};
use crate::event::Event;
use crate::event::EventOnReadyArgs;
use crate::executable::{CompileArgs, DeserializeArgs, ExecuteArgs, OptimizedProgramArgs, Program, SerializeArgs};
use crate::executable::{Executable, LoadedExecutable};
use crate::ffi::*;
use crate::proto::*;
use crate::table::Api;
use crate::table::NAMES;

static ENVIRONMENT: Once = Once::new();

/// The table, with the runtime's files in a directory of this test binary's own.
fn api() -> &'static Api {
    ENVIRONMENT.call_once(|| {
        let dir = std::env::temp_dir().join(format!("neuron-pjrt-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the runtime's files");
        // SAFETY: set once, before any test of this binary reads the environment.
        unsafe {
            std::env::set_var("NEURON_VIRT_LOCK_DIR", &dir);
            std::env::set_var("NEURON_VIRT_DATASTORE_DIR", dir.join("datastores"));
            std::env::set_var(
                "NEURON_CC_FLAGS",
                format!("--auto-cast none --cache_dir={}", dir.join("cache").display()),
            );
            // Executions on the instance's second core fail, for the test of failures.
            std::env::set_var("NEURON_RT_FAULT_INJECT", "oob:core=1");
            std::env::remove_var("NEURON_RT_VISIBLE_CORES");
            std::env::remove_var("NEURON_PJRT_PROCESS_INDEX");
            std::env::remove_var("NEURON_PJRT_WORLD_SIZE");
        }
    });
    // SAFETY: the plugin's own table.
    unsafe { &*crate::GetPjrtApi().cast::<Api>() }
}

fn index(name: &str) -> usize {
    NAMES.iter().position(|n| *n == name).unwrap_or_else(|| panic!("{name} is not in the table"))
}

fn head<T>() -> Head {
    Head { struct_size: std::mem::size_of::<T>(), extension_start: std::ptr::null_mut() }
}

/// Calls the entry `name` on `args`; `Err((code, message))` when it fails.
fn call<T>(name: &str, args: &mut T) -> Result<(), (c_int, String)> {
    let entry = api().entries[index(name)];
    // SAFETY: the entry of that name takes that argument struct.
    let error = unsafe { entry((args as *mut T).cast::<c_void>()) }.cast::<Error>();
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: an error the plugin made, read then freed.
    let error = unsafe { Box::from_raw(error) };
    Err((error.code as c_int, error.message))
}

fn client() -> *mut Client {
    let mut args = ClientCreateArgs {
        head: head::<ClientCreateArgs>(),
        create_options: std::ptr::null(),
        num_options: 0,
        kv_get_callback: std::ptr::null_mut(),
        kv_get_user_arg: std::ptr::null_mut(),
        kv_put_callback: std::ptr::null_mut(),
        kv_put_user_arg: std::ptr::null_mut(),
        client: std::ptr::null_mut(),
    };
    call("PJRT_Client_Create", &mut args).expect("a client");
    args.client
}

/// The client's addressable devices.
fn devices(client: *mut Client) -> Vec<*mut Device> {
    let mut args = OfList::<Client, Device> {
        head: head::<OfList<Client, Device>>(),
        object: client,
        list: std::ptr::null(),
        count: 0,
    };
    call("PJRT_Client_AddressableDevices", &mut args).expect("devices");
    // SAFETY: the plugin's list of `count` devices.
    unsafe { std::slice::from_raw_parts(args.list, args.count) }.to_vec()
}

fn first_device(client: *mut Client) -> *mut Device {
    *devices(client).first().expect("a device")
}

fn upload(
    client: *mut Client,
    device: *mut Device,
    values: &[f32],
    dims: &[i64],
    strides: Option<&[i64]>,
) -> *mut Buffer {
    let mut args = BufferFromHostArgs {
        head: head::<BufferFromHostArgs>(),
        client,
        data: values.as_ptr().cast(),
        element_type: 11,
        dims: dims.as_ptr(),
        num_dims: dims.len(),
        byte_strides: strides.map_or(std::ptr::null(), <[i64]>::as_ptr),
        num_byte_strides: strides.map_or(0, <[i64]>::len),
        host_buffer_semantics: 0,
        device,
        memory: std::ptr::null_mut(),
        device_layout: std::ptr::null_mut(),
        done_with_host_buffer: std::ptr::null_mut(),
        buffer: std::ptr::null_mut(),
    };
    call("PJRT_Client_BufferFromHostBuffer", &mut args).expect("a buffer");
    destroy_event(args.done_with_host_buffer);
    args.buffer
}

fn download(buffer: *mut Buffer) -> Vec<f32> {
    let mut args = ToHostArgs {
        head: head::<ToHostArgs>(),
        src: buffer,
        host_layout: std::ptr::null_mut(),
        dst: std::ptr::null_mut(),
        dst_size: 0,
        event: std::ptr::null_mut(),
    };
    call("PJRT_Buffer_ToHostBuffer", &mut args).expect("the size");
    let mut out = vec![0f32; args.dst_size / 4];
    args.dst = out.as_mut_ptr().cast();
    call("PJRT_Buffer_ToHostBuffer", &mut args).expect("the values");
    let mut wait = Of::<Event> { head: head::<Of<Event>>(), object: args.event };
    call("PJRT_Event_Await", &mut wait).expect("the copy completes");
    destroy_event(args.event);
    out
}

fn destroy_event(event: *mut Event) {
    let mut args = Of::<Event> { head: head::<Of<Event>>(), object: event };
    call("PJRT_Event_Destroy", &mut args).expect("destroyed");
}

fn destroy<T>(name: &str, object: *mut T) {
    let mut args = Of::<T> { head: head::<Of<T>>(), object };
    call(name, &mut args).expect("destroyed");
}

fn shape(element_type: i32, dims: &[i64]) -> ShapeProto {
    ShapeProto { element_type, dimensions: dims.to_vec(), tuple_shapes: Vec::new(), layout: None }
}

fn instruction(id: i64, name: &str, opcode: &str, shape: ShapeProto, operands: &[i64]) -> HloInstructionProto {
    HloInstructionProto {
        id,
        name: name.into(),
        opcode: opcode.into(),
        shape: Some(shape),
        operand_ids: operands.to_vec(),
        ..Default::default()
    }
}

/// `(x + y, x * y)` over `f32[2,3]`, as torch-xla would send it (a tuple result, a
/// layout on the program shape, metadata with a source line).
fn module() -> HloModuleProto {
    let array = shape(primitive::F32, &[2, 3]);
    let mut x = instruction(1, "p0.1", "parameter", array.clone(), &[]);
    x.parameter_number = 0;
    let mut y = instruction(2, "p1.2", "parameter", array.clone(), &[]);
    y.parameter_number = 1;
    let mut add = instruction(3, "add.3", "add", array.clone(), &[1, 2]);
    add.metadata = Some(OpMetadata {
        op_type: "aten__add".into(),
        op_name: "aten__add".into(),
        source_file: "train.py".into(),
        source_line: 12,
    });
    let mul = instruction(4, "multiply.4", "multiply", array.clone(), &[1, 2]);
    let result =
        ShapeProto { element_type: primitive::TUPLE, tuple_shapes: vec![array.clone(); 2], ..Default::default() };
    let tuple = instruction(5, "tuple.5", "tuple", result.clone(), &[3, 4]);
    let program_shape = ProgramShapeProto {
        parameters: vec![array.clone(), array],
        result: Some(result),
        parameter_names: vec!["p0".into(), "p1".into()],
    };
    HloModuleProto {
        name: "SyncTensorsGraph.5".into(),
        entry_computation_name: "main.6".into(),
        computations: vec![HloComputationProto {
            name: "main.6".into(),
            instructions: vec![x, y, add, mul, tuple],
            program_shape: Some(program_shape.clone()),
            id: 6,
            root_id: 5,
        }],
        host_program_shape: Some(program_shape),
        id: 7,
        entry_computation_id: 6,
    }
}

fn compile(client: *mut Client, code: &[u8], format: &str) -> Result<*mut LoadedExecutable, (c_int, String)> {
    let options = CompileOptionsProto {
        executable_build_options: Some(ExecutableBuildOptionsProto {
            device_ordinal: -1,
            num_replicas: 1,
            num_partitions: 1,
        }),
    }
    .encode_to_vec();
    let program = Program {
        head: head::<Program>(),
        code: code.as_ptr() as *mut c_char,
        code_size: code.len(),
        format: format.as_ptr().cast(),
        format_size: format.len(),
    };
    let mut args = CompileArgs {
        head: head::<CompileArgs>(),
        client,
        program: &program,
        compile_options: options.as_ptr().cast(),
        compile_options_size: options.len(),
        executable: std::ptr::null_mut(),
    };
    call("PJRT_Client_Compile", &mut args).map(|()| args.executable)
}

/// Executes `loaded` on `arguments`, on `device` (NULL: its own); its 2 outputs and the
/// completion event, or the error.
fn execute(
    loaded: *mut LoadedExecutable,
    arguments: &[*mut Buffer],
    device: *mut Device,
) -> Result<([*mut Buffer; 2], *mut Event), (c_int, String)> {
    let argument_lists = [arguments.as_ptr()];
    let mut outputs = [std::ptr::null_mut::<Buffer>(); 2];
    let output_lists = [outputs.as_mut_ptr()];
    let mut events = [std::ptr::null_mut::<Event>()];
    let mut args = ExecuteArgs {
        head: head::<ExecuteArgs>(),
        executable: loaded,
        options: std::ptr::null_mut(),
        argument_lists: argument_lists.as_ptr().cast(),
        num_devices: 1,
        num_args: arguments.len(),
        output_lists: output_lists.as_ptr(),
        device_complete_events: events.as_mut_ptr(),
        execute_device: device,
    };
    call("PJRT_LoadedExecutable_Execute", &mut args)?;
    Ok((outputs, events[0]))
}

#[test]
fn the_table_has_every_entry_of_the_090_header_and_its_version() {
    let api = api();
    assert_eq!(NAMES.len(), ENTRY_COUNT);
    assert_eq!((api.version.major_version, api.version.minor_version), (0, 90));
    assert_eq!(api.head.struct_size, std::mem::size_of::<Api>());
    assert_eq!(NAMES.last(), Some(&"PJRT_Event_Set"));
}

#[test]
fn every_entry_answers_null_and_short_structs_with_an_error_and_unimplemented_ones_name_themselves() {
    let api = api();
    for (k, name) in NAMES.iter().enumerate() {
        // SAFETY: a NULL argument struct, which every entry must refuse.
        let error = unsafe { (api.entries[k])(std::ptr::null_mut()) }.cast::<Error>();
        if matches!(*name, "PJRT_Error_Destroy" | "PJRT_Error_Message") {
            assert!(error.is_null(), "{name}");
            continue;
        }
        assert!(!error.is_null(), "{name} accepted a NULL argument struct");
        // SAFETY: the plugin's error.
        let error = unsafe { Box::from_raw(error) };
        assert!(matches!(error.code, Code::InvalidArgument | Code::Unimplemented), "{name}: {error:?}");
        if error.code == Code::Unimplemented {
            assert!(error.message.starts_with(name), "{name}: {}", error.message);
        }
        // A struct that stops before the fields every caller has.
        let mut short = Head { struct_size: 8, extension_start: std::ptr::null_mut() };
        if let Err((code, message)) = call(name, &mut short) {
            assert!(
                code == Code::InvalidArgument as c_int || code == Code::Unimplemented as c_int,
                "{name}: {message}"
            );
        }
    }
}

#[test]
fn devices_memories_and_buffers_round_trip_through_device_memory() {
    let client = client();
    let device = first_device(client);
    let mut kind =
        OfString::<Device> { head: head::<OfString<Device>>(), object: device, text: std::ptr::null(), size: 0 };
    call("PJRT_DeviceDescription_Kind", &mut kind).expect("a kind");
    // SAFETY: the plugin's text of `size` bytes.
    let text = unsafe { std::slice::from_raw_parts(kind.text.cast::<u8>(), kind.size) };
    assert_eq!(text, b"NC_v2");
    let mut memory = OfValue::<Device, *mut Memory> {
        head: head::<OfValue<Device, *mut Memory>>(),
        object: device,
        value: std::ptr::null_mut(),
    };
    call("PJRT_Device_DefaultMemory", &mut memory).expect("a memory");
    let mut kind =
        OfString::<Memory> { head: head::<OfString<Memory>>(), object: memory.value, text: std::ptr::null(), size: 0 };
    call("PJRT_Memory_Kind", &mut kind).expect("a kind");
    assert_eq!(kind.size, "device".len());

    let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let buffer = upload(client, device, &values, &[2, 3], None);
    assert_eq!(download(buffer), values);
    let mut dims =
        OfList::<Buffer, i64> { head: head::<OfList<Buffer, i64>>(), object: buffer, list: std::ptr::null(), count: 0 };
    call("PJRT_Buffer_Dimensions", &mut dims).expect("dimensions");
    // SAFETY: the plugin's list of `count` dimensions.
    assert_eq!(unsafe { std::slice::from_raw_parts(dims.list.cast::<i64>(), dims.count) }, [2, 3]);
    // A column-major host array (byte strides 4 and 8) arrives row-major.
    let transposed = upload(client, device, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], &[2, 3], Some(&[4, 8]));
    assert_eq!(download(transposed), values);

    // A deleted buffer is refused by what reads it, and says so.
    destroy("PJRT_Buffer_Delete", transposed);
    let mut args = ToHostArgs {
        head: head::<ToHostArgs>(),
        src: transposed,
        host_layout: std::ptr::null_mut(),
        dst: values.as_ptr() as *mut c_void,
        dst_size: 24,
        event: std::ptr::null_mut(),
    };
    let (code, message) = call("PJRT_Buffer_ToHostBuffer", &mut args).expect_err("deleted");
    assert_eq!((code, message.as_str()), (Code::FailedPrecondition as c_int, "the buffer has been deleted"));
    // Too small a host buffer.
    let mut small = [0f32; 2];
    let mut args = ToHostArgs { src: buffer, dst: small.as_mut_ptr().cast(), dst_size: 8, ..args };
    let (code, message) = call("PJRT_Buffer_ToHostBuffer", &mut args).expect_err("too small");
    assert_eq!(code, Code::InvalidArgument as c_int, "{message}");
    destroy("PJRT_Buffer_Destroy", transposed);
    destroy("PJRT_Buffer_Destroy", buffer);
    destroy("PJRT_Client_Destroy", client);
}

#[test]
fn a_module_compiles_runs_and_gives_back_its_optimized_program() {
    let client = client();
    let device = first_device(client);
    let code = module().encode_to_vec();
    let (code_value, message) = compile(client, &code, "mlir").expect_err("StableHLO is refused");
    assert_eq!(code_value, Code::InvalidArgument as c_int);
    assert!(message.contains("unset XLA_STABLEHLO_COMPILE"), "{message}");
    let (_, message) = compile(client, b"not a proto", "hlo").expect_err("garbage is refused");
    assert!(message.contains("does not decode"), "{message}");
    let loaded = compile(client, &code, "hlo").expect("compiles");

    let x = upload(client, device, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], None);
    let y = upload(client, device, &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0], &[2, 3], None);
    let (outputs, event) = execute(loaded, &[x, y], std::ptr::null_mut()).expect("runs");
    assert_eq!(download(outputs[0]), [11.0, 22.0, 33.0, 44.0, 55.0, 66.0]);
    assert_eq!(download(outputs[1]), [10.0, 40.0, 90.0, 160.0, 250.0, 360.0]);
    let mut ready = OfValue::<Event, bool> { head: head::<OfValue<Event, bool>>(), object: event, value: false };
    call("PJRT_Event_IsReady", &mut ready).expect("asked");
    assert!(ready.value, "the execution completed before Execute returned");
    destroy_event(event);
    let (_, message) = execute(loaded, &[x], std::ptr::null_mut()).expect_err("one argument short");
    assert!(message.contains("takes 2 arguments; 1 were given"), "{message}");

    // What torch-xla reads back after compiling: the module with its entry layout.
    let mut get = OfValue::<LoadedExecutable, *mut Executable> {
        head: head::<OfValue<LoadedExecutable, *mut Executable>>(),
        object: loaded,
        value: std::ptr::null_mut(),
    };
    call("PJRT_LoadedExecutable_GetExecutable", &mut get).expect("the executable");
    let mut program = Program {
        head: head::<Program>(),
        code: std::ptr::null_mut(),
        code_size: 0,
        format: std::ptr::null(),
        format_size: 0,
    };
    let mut optimized =
        OptimizedProgramArgs { head: head::<OptimizedProgramArgs>(), executable: get.value, program: &mut program };
    call("PJRT_Executable_OptimizedProgram", &mut optimized).expect("the size");
    let mut bytes = vec![0u8; program.code_size];
    program.code = bytes.as_mut_ptr().cast();
    let mut optimized = OptimizedProgramArgs { program: &mut program, ..optimized };
    call("PJRT_Executable_OptimizedProgram", &mut optimized).expect("the program");
    // SAFETY: the plugin's static format text.
    let format = unsafe { std::slice::from_raw_parts(program.format.cast::<u8>(), program.format_size) };
    assert_eq!(format, b"hlo_with_config");
    #[derive(Clone, PartialEq, Message)]
    struct WithConfig {
        #[prost(message, optional, tag = "1")]
        hlo_module: Option<HloModuleProto>,
        #[prost(message, optional, tag = "2")]
        config: Option<HloModuleConfigProto>,
    }
    let read = WithConfig::decode(bytes.as_slice()).expect("an HloModuleProtoWithConfig");
    assert_eq!(read.hlo_module.expect("the module"), module());
    let layout = read.config.and_then(|c| c.entry_computation_layout).expect("the entry layout");
    assert_eq!(layout.parameters[0].layout.as_ref().map(|l| l.minor_to_major.clone()), Some(vec![1, 0]));
    let mut outputs_count =
        OfValue::<Executable, usize> { head: head::<OfValue<Executable, usize>>(), object: get.value, value: 0 };
    call("PJRT_Executable_NumOutputs", &mut outputs_count).expect("a count");
    assert_eq!(outputs_count.value, 2);

    destroy("PJRT_Executable_Destroy", get.value);
    for buffer in [x, y, outputs[0], outputs[1]] {
        destroy("PJRT_Buffer_Destroy", buffer);
    }
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    destroy("PJRT_Client_Destroy", client);
}

#[test]
fn a_compiled_graph_is_kept_in_the_cache_and_a_bad_entry_is_compiled_again() {
    let client = client();
    // A graph of its own, so that no other test's compile touches its entry.
    let mut graph = module();
    graph.name = "cached.1".into();
    let code = graph.encode_to_vec();
    let loaded = compile(client, &code, "hlo").expect("compiles");
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    // SAFETY: the client this test made.
    let cache = unsafe { &*client }.cache.clone().expect("a cache");
    let options = format!("{:?}", unsafe { &*client }.compile_options);
    let entry = cache.entry(&crate::cache::key(&code, &options));
    let kept = std::fs::read(&entry).expect("the NEFF is kept");
    let options_decode = neuron_runtime::neff::DecodeOptions { validate_hash: true };
    let neff = neuron_runtime::Neff::decode(&kept, options_decode).expect("a NEFF");
    assert!(neff.name.starts_with("cached.1."), "{}", neff.name);
    // A damaged entry is not used: the graph compiles again and the entry is rewritten.
    std::fs::write(&entry, b"not a NEFF").expect("damaged");
    let loaded = compile(client, &code, "hlo").expect("compiles again");
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    assert_eq!(std::fs::read(&entry).expect("kept again"), kept);
    destroy("PJRT_Client_Destroy", client);
}

#[test]
fn a_failed_execution_is_an_error_with_the_neuron_status_and_the_runtimes_message() {
    let client = client();
    let devices = devices(client);
    assert_eq!(devices.len(), 2, "the default instance's two cores");
    let second = devices[1];
    let mut graph = module();
    graph.name = "failing.1".into();
    let loaded = compile(client, &graph.encode_to_vec(), "hlo").expect("compiles");
    let x = upload(client, second, &[1.0; 6], &[2, 3], None);
    let (code, message) = execute(loaded, &[x, x], second).expect_err("the fault strikes");
    assert_eq!(code, Code::Internal as c_int, "{message}");
    assert!(message.starts_with("NRT_EXEC_OOB (1006): ") && message.contains("out-of-bound access"), "{message}");
    destroy("PJRT_Buffer_Destroy", x);
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    destroy("PJRT_Client_Destroy", client);
}

#[test]
fn a_serialized_executable_loads_back_without_compiling_and_runs() {
    let client = client();
    let device = first_device(client);
    let mut graph = module();
    graph.name = "serialized.1".into();
    let loaded = compile(client, &graph.encode_to_vec(), "hlo").expect("compiles");
    let mut get = OfValue::<LoadedExecutable, *mut Executable> {
        head: head::<OfValue<LoadedExecutable, *mut Executable>>(),
        object: loaded,
        value: std::ptr::null_mut(),
    };
    call("PJRT_LoadedExecutable_GetExecutable", &mut get).expect("the executable");
    let mut serialize = SerializeArgs {
        head: head::<SerializeArgs>(),
        executable: get.value,
        bytes: std::ptr::null(),
        size: 0,
        serialized: std::ptr::null_mut(),
        deleter: None,
    };
    call("PJRT_Executable_Serialize", &mut serialize).expect("serialized");
    // SAFETY: the plugin's bytes, alive until the deleter runs.
    let bytes = unsafe { std::slice::from_raw_parts(serialize.bytes.cast::<u8>(), serialize.size) }.to_vec();
    // SAFETY: the deleter the plugin gave, on the buffer it gave.
    unsafe { (serialize.deleter.expect("a deleter"))(serialize.serialized) };
    let mut deserialize = DeserializeArgs {
        head: head::<DeserializeArgs>(),
        client,
        bytes: bytes.as_ptr().cast(),
        size: bytes.len(),
        loaded: std::ptr::null_mut(),
    };
    call("PJRT_Executable_DeserializeAndLoad", &mut deserialize).expect("loads");
    let x = upload(client, device, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], None);
    let (outputs, event) = execute(deserialize.loaded, &[x, x], std::ptr::null_mut()).expect("runs");
    assert_eq!(download(outputs[1]), [1.0, 4.0, 9.0, 16.0, 25.0, 36.0]);
    destroy_event(event);
    // A damaged NEFF inside is refused by its hash, not run.
    let mut damaged = bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    let mut args = DeserializeArgs { bytes: damaged.as_ptr().cast(), size: damaged.len(), ..deserialize };
    let (_, message) = call("PJRT_Executable_DeserializeAndLoad", &mut args).expect_err("refused");
    assert!(message.contains("NRT_"), "{message}");
    for buffer in [x, outputs[0], outputs[1]] {
        destroy("PJRT_Buffer_Destroy", buffer);
    }
    destroy("PJRT_Executable_Destroy", get.value);
    destroy("PJRT_LoadedExecutable_Destroy", deserialize.loaded);
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    destroy("PJRT_Client_Destroy", client);
}

#[test]
fn a_callback_on_an_event_runs_with_its_argument() {
    api();
    unsafe extern "C" fn note(error: *mut Error, user_arg: *mut c_void) {
        // SAFETY: the counter the test registered; the callback owns the error.
        unsafe {
            *user_arg.cast::<u32>() += 1;
            if !error.is_null() {
                drop(Box::from_raw(error));
            }
        }
    }
    let mut count = 0u32;
    let event = Event::done(None);
    let mut args = EventOnReadyArgs {
        head: head::<EventOnReadyArgs>(),
        event,
        callback: Some(note),
        user_arg: (&mut count as *mut u32).cast(),
    };
    call("PJRT_Event_OnReady", &mut args).expect("registered");
    assert_eq!(count, 1);
    let mut missing = EventOnReadyArgs { callback: None, ..args };
    assert!(call("PJRT_Event_OnReady", &mut missing).is_err());
    destroy_event(event);
}

/// The plugin's cost per execution over the runtime's own `execute` of the same NEFF
/// (a benchmark, not run by `cargo test`):
/// `cargo test --release -p neuron-pjrt -- --ignored --nocapture execution_overhead`.
#[test]
#[ignore = "a benchmark"]
fn execution_overhead() {
    use std::time::Instant;
    let client = client();
    let device = first_device(client);
    let mut graph = module();
    graph.name = "overhead.1".into();
    let loaded = compile(client, &graph.encode_to_vec(), "hlo").expect("compiles");
    let x = upload(client, device, &[1.0; 6], &[2, 3], None);
    let y = upload(client, device, &[2.0; 6], &[2, 3], None);
    let arguments = [x, y];
    let through_plugin = || {
        let (outputs, event) = execute(loaded, &arguments, std::ptr::null_mut()).expect("runs");
        destroy_event(event);
        for output in outputs {
            destroy("PJRT_Buffer_Destroy", output);
        }
    };
    // The runtime's own execute of the same model, inputs and outputs allocated once.
    // SAFETY: objects of the live client and executable above.
    let (runtime, model) = unsafe {
        let client = &*client;
        let loaded = &*loaded;
        (client.runtime.clone(), loaded.loaded_model(client, &*device).expect("the model"))
    };
    let mut inputs = neuron_runtime::TensorSet::new();
    for (io, buffer) in model.inputs().iter().zip(arguments) {
        // SAFETY: buffers this test made.
        inputs.add(&io.name, unsafe { &*buffer }.tensor.clone());
    }
    let mut outputs_set = neuron_runtime::TensorSet::new();
    for io in model.outputs() {
        let tensor = runtime
            .allocate_tensor_for(
                neuron_runtime::TensorPlacement::Device { core: model.core() },
                model.tensor_type(io),
                "out",
            )
            .expect("an output");
        outputs_set.add(&io.name, tensor);
    }
    let direct = || {
        runtime.execute(&model, &inputs, &outputs_set).expect("runs");
    };
    let median = |f: &dyn Fn()| {
        let mut rounds: Vec<f64> = (0..7)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..2000 {
                    f();
                }
                started.elapsed().as_secs_f64() * 1e6 / 2000.0
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        rounds[3]
    };
    for _ in 0..500 {
        through_plugin();
        direct();
    }
    let (plugin, runtime_only) = (median(&through_plugin), median(&direct));
    println!(
        "per execution: through the plugin {plugin:.2} µs, the runtime's execute {runtime_only:.2} µs, \
         overhead {:.2} µs (ratio {:.2})",
        plugin - runtime_only,
        plugin / runtime_only
    );
    destroy("PJRT_Buffer_Destroy", x);
    destroy("PJRT_Buffer_Destroy", y);
    destroy("PJRT_LoadedExecutable_Destroy", loaded);
    destroy("PJRT_Client_Destroy", client);
}
