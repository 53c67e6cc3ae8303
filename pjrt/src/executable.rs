//! `PJRT_Client_Compile`, `PJRT_Executable` and `PJRT_LoadedExecutable`: a framework's
//! `HloModuleProto` compiled into a NEFF by this project's compiler, loaded as a model on
//! the process's NeuronCore, and executed there through the runtime (so every execution
//! is in the system and device traces like any other).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use neuron_runtime::neff::DecodeOptions;
use neuron_runtime::{Model, Neff, TensorSet};
use prost::Message;

use crate::buffer::{Buffer, element};
use crate::client::{Client, Device};
use crate::error::{Code, Error, Result, call, object};
use crate::event::Event;
use crate::ffi::{Head, NamedValue, Of, OfList, OfString, OfValue};
use crate::proto::{
    CompileOptionsProto, HloModuleConfigProto, HloModuleProto, LayoutProto, ProgramShapeProto, ShapeProto,
};

/// A compiled program and what callers ask of it.
pub(crate) struct Compiled {
    pub(crate) name: String,
    /// Copies of the program the framework runs, one per device (torch-xla compiles
    /// every graph for all of the job's devices and runs it on one at a time).
    replicas: usize,
    /// Whether the program has collectives: its copies are then the ranks of one
    /// communicator across the job's processes.
    collectives: bool,
    pub(crate) neff: Vec<u8>,
    /// For each model input, in the model's order, the parameter it binds.
    input_parameters: Vec<usize>,
    parameter_count: usize,
    output_types: Vec<c_int>,
    output_dims: Vec<Vec<i64>>,
    output_dims_flat: Vec<i64>,
    output_dim_sizes: Vec<usize>,
    memory_kinds: Vec<*const c_char>,
    memory_kind_sizes: Vec<usize>,
    /// `HloModuleProtoWithConfig`: the module as given, with its row-major entry layout.
    optimized: Vec<u8>,
    /// The program and compile options as the framework gave them, for serializing.
    program: Vec<u8>,
    options: Vec<u8>,
    fingerprint: String,
}

// SAFETY: the raw pointers are to static strings.
unsafe impl Send for Compiled {}
unsafe impl Sync for Compiled {}

/// What a `PJRT_Executable*` points to.
pub(crate) struct Executable(pub Arc<Compiled>);

/// `PJRT_Program`.
#[repr(C)]
pub(crate) struct Program {
    pub(crate) head: Head,
    pub(crate) code: *mut c_char,
    pub(crate) code_size: usize,
    pub(crate) format: *const c_char,
    pub(crate) format_size: usize,
}

/// `PJRT_Client_Compile_Args`.
#[repr(C)]
pub(crate) struct CompileArgs {
    pub(crate) head: Head,
    pub(crate) client: *mut Client,
    pub(crate) program: *const Program,
    pub(crate) compile_options: *const c_char,
    pub(crate) compile_options_size: usize,
    pub(crate) executable: *mut LoadedExecutable,
}

/// `PJRT_Executable_OptimizedProgram_Args`.
#[repr(C)]
pub(crate) struct OptimizedProgramArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) program: *mut Program,
}

/// `PJRT_Executable_OutputElementTypes_Args`.
#[repr(C)]
pub(crate) struct OutputElementTypesArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) output_types: *const c_int,
    pub(crate) num_output_types: usize,
}

/// `PJRT_Executable_OutputDimensions_Args`.
#[repr(C)]
pub(crate) struct OutputDimensionsArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) num_outputs: usize,
    pub(crate) dims: *const i64,
    pub(crate) dim_sizes: *const usize,
}

/// `PJRT_Executable_OutputMemoryKinds_Args`.
#[repr(C)]
pub(crate) struct OutputMemoryKindsArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) num_outputs: usize,
    pub(crate) memory_kinds: *const *const c_char,
    pub(crate) memory_kind_sizes: *const usize,
}

/// `PJRT_Executable_GetCostAnalysis_Args`.
#[repr(C)]
pub(crate) struct CostAnalysisArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) num_properties: usize,
    pub(crate) properties: *const NamedValue,
}

/// `PJRT_ExecuteOptions` (host callbacks are refused; the rest is read as given).
#[repr(C)]
pub(crate) struct ExecuteOptions {
    pub(crate) head: Head,
    pub(crate) send_callbacks: *mut c_void,
    pub(crate) recv_callbacks: *mut c_void,
    pub(crate) num_send_ops: usize,
    pub(crate) num_recv_ops: usize,
    pub(crate) launch_id: c_int,
}

/// `PJRT_LoadedExecutable_Execute_Args`.
#[repr(C)]
pub(crate) struct ExecuteArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut LoadedExecutable,
    pub(crate) options: *mut ExecuteOptions,
    pub(crate) argument_lists: *const *const *mut Buffer,
    pub(crate) num_devices: usize,
    pub(crate) num_args: usize,
    pub(crate) output_lists: *const *mut *mut Buffer,
    pub(crate) device_complete_events: *mut *mut Event,
    pub(crate) execute_device: *mut Device,
}

/// What a `PJRT_LoadedExecutable*` points to.
pub(crate) struct LoadedExecutable {
    compiled: Arc<Compiled>,
    client: *const Client,
    devices: Vec<*mut Device>,
    /// The model on each core it was loaded on.
    models: Mutex<HashMap<u32, Model>>,
    deleted: AtomicBool,
}

// SAFETY: the client and devices outlive the executables compiled by the client.
unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

/// The array shapes of a result: its tuple's elements, or itself.
fn result_arrays(result: &ShapeProto) -> Vec<&ShapeProto> {
    if result.element_type == crate::proto::primitive::TUPLE {
        result.tuple_shapes.iter().collect()
    } else {
        vec![result]
    }
}

/// `shape` with the row-major layout this plugin's buffers have.
fn row_major(shape: &ShapeProto) -> ShapeProto {
    let mut shape = shape.clone();
    if shape.element_type == crate::proto::primitive::TUPLE {
        shape.tuple_shapes = shape.tuple_shapes.iter().map(row_major).collect();
    } else {
        shape.layout = Some(LayoutProto { minor_to_major: (0..shape.dimensions.len() as i64).rev().collect() });
    }
    shape
}

/// Compiles `code`, or takes `neff` (from a serialized executable) as its compiled form.
fn compile(client: &Client, code: &[u8], format: &str, options: &[u8], neff: Option<Neff>) -> Result<Compiled> {
    match format {
        "hlo" => {}
        "mlir" => {
            return Err(Error::invalid(
                "this plugin compiles HLO (format \"hlo\", a serialized HloModuleProto), not StableHLO; \
                 unset XLA_STABLEHLO_COMPILE so that torch-xla sends HLO",
            ));
        }
        other => return Err(Error::invalid(format!("unknown program format `{other}`; this plugin takes \"hlo\""))),
    }
    let module =
        HloModuleProto::decode(code).map_err(|e| Error::invalid(format!("the HloModuleProto does not decode: {e}")))?;
    let decoded = CompileOptionsProto::decode(options)
        .map_err(|e| Error::invalid(format!("the CompileOptionsProto does not decode: {e}")))?;
    let build = decoded.executable_build_options.unwrap_or_default();
    if build.num_partitions > 1 {
        return Err(Error::unimplemented(
            "PJRT_Client_Compile",
            &format!(" for SPMD programs ({} partitions) yet", build.num_partitions),
        ));
    }
    let replicas = build.num_replicas.max(1) as usize;
    let entry = module
        .computations
        .iter()
        .find(|c| c.id == module.entry_computation_id)
        .or(module.computations.last())
        .ok_or_else(|| Error::invalid("the module has no computations"))?;
    let program_shape = module
        .host_program_shape
        .clone()
        .or_else(|| entry.program_shape.clone())
        .ok_or_else(|| Error::invalid("the module has no program shape"))?;
    let result = program_shape.result.clone().ok_or_else(|| Error::invalid("the module has no result shape"))?;

    let fingerprint = crate::cache::key(code, &format!("{:?}", client.compile_options));
    let name = format!("{}.{}", module.name, &fingerprint[..8]);
    let kept = client.cache.as_ref().map(|cache| (cache, cache.entry(&fingerprint)));
    let cached = neff.or_else(|| {
        kept.as_ref().and_then(|(cache, entry)| {
            let bytes = cache.read(entry)?;
            match Neff::decode(&bytes, DecodeOptions { validate_hash: true }) {
                Ok(neff) => {
                    tracing::info!("Using a cached neff at {} for `{}`", entry.display(), module.name);
                    Some(neff)
                }
                Err(e) => {
                    tracing::warn!("compile cache: {} does not decode ({e}); compiling again", entry.display());
                    None
                }
            }
        })
    });
    let mut compile_us = 0;
    let neff = match cached {
        Some(neff) => neff,
        None => {
            let text = crate::hlo_text::module_text(&module);
            crate::debug::dump(&module.name, code, text.as_deref().unwrap_or_default());
            let failed = |e: String| {
                let origin =
                    crate::hlo_text::origin_of_error(&module, &e).map(|o| format!(" ({o})")).unwrap_or_default();
                Error::invalid(format!("graph `{}` does not compile{origin}: {e}", module.name))
            };
            let text = text.map_err(failed)?;
            let started = std::time::Instant::now();
            let program =
                neuron_runtime::compile_hlo_with(&text, &client.compile_options).map_err(|e| failed(e.to_string()))?;
            let neff = Neff::new(&name, program);
            compile_us = started.elapsed().as_micros() as u64;
            tracing::info!("compiled graph `{}` in {:.1} ms", module.name, compile_us as f64 / 1e3);
            if let Some((cache, entry)) = &kept {
                cache.write(entry, &neff.encode());
            }
            neff
        }
    };
    let (before, detail) = client.graphs.compiled(&module, &program_shape, &fingerprint[..8]);
    if before > 0 {
        tracing::info!("{detail}, after {before} executions");
    }
    // What the tools name recompilations from; a trace that cannot take it loses only that.
    let _ = client.runtime.record_graph_compile(&detail, before, compile_us);

    // Which parameter each of the program's inputs is.
    let strip = |n: &str| n.trim_start_matches('%').to_owned();
    let parameters: HashMap<String, usize> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .map(|i| (strip(&crate::hlo_text::name_token(&i.name)), i.parameter_number as usize))
        .collect();
    let input_parameters = neff
        .program
        .inputs
        .iter()
        .map(|io| {
            parameters.get(&strip(&io.hlo_name)).copied().ok_or_else(|| {
                Error::new(Code::Internal, format!("input `{}` is no parameter of the entry", io.hlo_name))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let arrays = result_arrays(&result);
    if arrays.len() != neff.program.outputs.len() {
        return Err(Error::new(
            Code::Internal,
            format!("the program has {} outputs for a result of {} arrays", neff.program.outputs.len(), arrays.len()),
        ));
    }
    let output_types = arrays
        .iter()
        .map(|s| {
            element::from_primitive(s.element_type)
                .ok_or_else(|| Error::new(Code::Unimplemented, format!("results of element type {}", s.element_type)))
        })
        .collect::<Result<Vec<_>>>()?;
    let output_dims: Vec<Vec<i64>> = arrays.iter().map(|s| s.dimensions.clone()).collect();
    let config = HloModuleConfigProto {
        entry_computation_layout: Some(ProgramShapeProto {
            parameters: program_shape.parameters.iter().map(row_major).collect(),
            result: Some(row_major(&result)),
            parameter_names: program_shape.parameter_names.clone(),
        }),
        replica_count: 1,
        num_partitions: 1,
    };
    let collectives = module.computations.iter().flat_map(|c| &c.instructions).any(|i| {
        matches!(
            i.opcode.as_str(),
            "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all" | "collective-permute"
        )
    });
    Ok(Compiled {
        neff: neff.encode(),
        name,
        replicas,
        collectives,
        input_parameters,
        parameter_count: program_shape.parameters.len(),
        output_dims_flat: output_dims.iter().flatten().copied().collect(),
        output_dim_sizes: output_dims.iter().map(Vec::len).collect(),
        memory_kinds: vec![c"device".as_ptr(); output_types.len()],
        memory_kind_sizes: vec![6; output_types.len()],
        output_types,
        output_dims,
        optimized: crate::proto::module_with_config(code, &config),
        program: code.to_vec(),
        options: options.to_vec(),
        fingerprint,
    })
}

impl LoadedExecutable {
    /// The model on `device`'s core (for the overhead benchmark).
    #[cfg(test)]
    pub(crate) fn loaded_model(&self, client: &Client, device: &Device) -> Result<Model> {
        self.model(client, device)
    }

    /// The model on `device`'s core, loaded on first use.
    fn model(&self, client: &Client, device: &Device) -> Result<Model> {
        let core = device.core.ok_or_else(|| Error::invalid("the device is not one of this process's"))?;
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(model) = models.get(&core) {
            return Ok(model.clone());
        }
        let model = if self.compiled.collectives && self.compiled.replicas > 1 {
            // Rank = the device's id in the job (torch-xla's replica id).
            let (rank, count) = (device.id as u32, self.compiled.replicas as u32);
            client.runtime.load_collectives_across(&self.compiled.neff, core, rank, count)?
        } else {
            client.runtime.load(&self.compiled.neff, Some(core))?
        };
        models.insert(core, model.clone());
        Ok(model)
    }

    /// Runs the program on `device` with `arguments`, returning its outputs.
    fn run(&self, client: &Client, device: *mut Device, arguments: &[&Buffer]) -> Result<Vec<*mut Buffer>> {
        let compiled = &self.compiled;
        let device_ref = client.addressable_device(device)?;
        let model = self.model(client, device_ref)?;
        if arguments.len() != compiled.parameter_count {
            return Err(Error::invalid(format!(
                "`{}` takes {} arguments; {} were given",
                compiled.name,
                compiled.parameter_count,
                arguments.len()
            )));
        }
        let mut inputs = TensorSet::new();
        for (io, &parameter) in model.inputs().iter().zip(&compiled.input_parameters) {
            let tensor = arguments[parameter].live_tensor()?;
            let wanted = model.tensor_type(io).size_bytes().unwrap_or(0);
            if tensor.size() < wanted {
                return Err(Error::invalid(format!(
                    "argument {parameter} of `{}` has {} bytes; the program reads {wanted} ({})",
                    compiled.name,
                    tensor.size(),
                    model.tensor_type(io)
                )));
            }
            inputs.add(&io.name, tensor.clone());
        }
        let core = device_ref.core.unwrap_or_default();
        let mut outputs = TensorSet::new();
        let mut tensors = Vec::new();
        for io in model.outputs() {
            let ty = model.tensor_type(io);
            let size = ty.size_bytes().unwrap_or(0);
            let tensor = client.pool.take(&client.runtime, core, size, Some(ty), &io.name)?;
            outputs.add(&io.name, tensor.clone());
            tensors.push(tensor);
        }
        client.graphs.executed();
        client.runtime.execute(&model, &inputs, &outputs)?;
        Ok(tensors
            .into_iter()
            .enumerate()
            .map(|(k, tensor)| {
                let (ty, dims) = (compiled.output_types[k], compiled.output_dims[k].clone());
                let buffer = Buffer::new(tensor, ty, dims, device, Some(Arc::clone(&client.pool)));
                Box::into_raw(Box::new(buffer))
            })
            .collect())
    }
}

/// `compiled` loaded on the devices of its replicas in this process.
fn load(client: &Client, compiled: Compiled) -> Result<*mut LoadedExecutable> {
    let compiled = Arc::new(compiled);
    if compiled.replicas > client.device_count() {
        return Err(Error::invalid(format!(
            "a program of {} replicas, but the job has {} devices",
            compiled.replicas,
            client.device_count()
        )));
    }
    let devices = client.addressable_devices(compiled.replicas);
    let first = *devices.first().ok_or_else(|| {
        Error::invalid(format!("none of the program's {} replicas is a device of this process", compiled.replicas))
    })?;
    let loaded = LoadedExecutable {
        compiled,
        client,
        devices,
        models: Mutex::new(HashMap::new()),
        deleted: AtomicBool::new(false),
    };
    // Loaded now, so that a program the runtime refuses fails here, not at its first
    // execution.
    // SAFETY: one of this client's devices.
    loaded.model(client, unsafe { &*first })?;
    Ok(Box::into_raw(Box::new(loaded)))
}

pub(crate) unsafe extern "C" fn client_compile(args: *mut CompileArgs) -> *mut Error {
    call("PJRT_Client_Compile", args, |args| {
        // SAFETY: a client this plugin made and the caller's program.
        let client = unsafe { object("client", args.client) }?;
        let program = unsafe { object("program", args.program as *mut Program) }?;
        let bytes = |pointer: *const c_char, size: usize, what: &str| -> Result<&[u8]> {
            if pointer.is_null() && size > 0 {
                return Err(Error::invalid(format!("the {what} is NULL")));
            }
            // SAFETY: the caller's bytes of the size it gives.
            Ok(if size == 0 { &[] } else { unsafe { std::slice::from_raw_parts(pointer.cast(), size) } })
        };
        let code = bytes(program.code, program.code_size, "program")?;
        let format =
            String::from_utf8_lossy(bytes(program.format, program.format_size, "program format")?).into_owned();
        let options = bytes(args.compile_options, args.compile_options_size, "compile options")?;
        args.executable = load(client, compile(client, code, &format, options, None)?)?;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_destroy(args: *mut Of<LoadedExecutable>) -> *mut Error {
    call("PJRT_LoadedExecutable_Destroy", args, |args| {
        if !args.object.is_null() {
            // SAFETY: an executable this plugin made, destroyed once by its owner.
            let loaded = unsafe { Box::from_raw(args.object) };
            // SAFETY: the client outlives its executables.
            let client = unsafe { &*loaded.client };
            for model in loaded.models.lock().unwrap_or_else(|e| e.into_inner()).values() {
                let _ = client.runtime.unload(model);
            }
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_get_executable(
    args: *mut OfValue<LoadedExecutable, *mut Executable>,
) -> *mut Error {
    call("PJRT_LoadedExecutable_GetExecutable", args, |args| {
        // SAFETY: an executable this plugin made.
        let loaded = unsafe { object("executable", args.object) }?;
        args.value = Box::into_raw(Box::new(Executable(Arc::clone(&loaded.compiled))));
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_devices(args: *mut OfList<LoadedExecutable, Device>) -> *mut Error {
    call("PJRT_LoadedExecutable_AddressableDevices", args, |args| {
        // SAFETY: an executable this plugin made.
        let loaded = unsafe { object("executable", args.object) }?;
        (args.list, args.count) = (loaded.devices.as_ptr(), loaded.devices.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_delete(args: *mut Of<LoadedExecutable>) -> *mut Error {
    call("PJRT_LoadedExecutable_Delete", args, |args| {
        // SAFETY: an executable this plugin made.
        let loaded = unsafe { object("executable", args.object) }?;
        loaded.deleted.store(true, Ordering::Release);
        // SAFETY: the client outlives its executables.
        let client = unsafe { &*loaded.client };
        for (_, model) in loaded.models.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            client.runtime.unload(&model)?;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_is_deleted(args: *mut OfValue<LoadedExecutable, bool>) -> *mut Error {
    call("PJRT_LoadedExecutable_IsDeleted", args, |args| {
        // SAFETY: an executable this plugin made.
        args.value = unsafe { object("executable", args.object) }?.deleted.load(Ordering::Acquire);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn execute(args: *mut ExecuteArgs) -> *mut Error {
    call("PJRT_LoadedExecutable_Execute", args, |args| {
        // SAFETY: an executable this plugin made.
        let loaded = unsafe { object("executable", args.executable) }?;
        if loaded.deleted.load(Ordering::Acquire) {
            return Err(Error::new(Code::FailedPrecondition, "the executable has been deleted"));
        }
        // SAFETY: the client outlives its executables.
        let client = unsafe { &*loaded.client };
        // SAFETY: the caller's options, if any.
        if let Some(options) = unsafe { args.options.as_ref() }
            && (options.num_send_ops > 0 || options.num_recv_ops > 0)
        {
            return Err(Error::unimplemented("PJRT_LoadedExecutable_Execute", " with host send or receive callbacks"));
        }
        let devices: Vec<*mut Device> =
            if args.execute_device.is_null() { loaded.devices.clone() } else { vec![args.execute_device] };
        if args.num_devices != devices.len() {
            return Err(Error::invalid(format!(
                "argument lists for {} devices; the executable runs on {}",
                args.num_devices,
                devices.len()
            )));
        }
        if args.argument_lists.is_null() && args.num_args > 0 || args.output_lists.is_null() {
            return Err(Error::invalid("the argument or output lists are NULL"));
        }
        for (d, &device) in devices.iter().enumerate() {
            let arguments = (0..args.num_args)
                .map(|a| {
                    // SAFETY: the caller's `num_devices` lists of `num_args` buffers.
                    let pointer = unsafe { *(*args.argument_lists.add(d)).add(a) };
                    // SAFETY: buffers this plugin made.
                    unsafe { object("argument buffer", pointer) }
                })
                .collect::<Result<Vec<_>>>()?;
            let outputs = loaded.run(client, device, &arguments)?;
            for (k, output) in outputs.into_iter().enumerate() {
                // SAFETY: the caller's output list for this device holds an entry per output.
                unsafe { *(*args.output_lists.add(d)).add(k) = output };
            }
            if !args.device_complete_events.is_null() {
                // The execution ran to its end before this returns.
                // SAFETY: the caller's array of `num_devices` events.
                unsafe { *args.device_complete_events.add(d) = Event::done(None) };
            }
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn destroy(args: *mut Of<Executable>) -> *mut Error {
    call("PJRT_Executable_Destroy", args, |args| {
        if !args.object.is_null() {
            // SAFETY: an executable this plugin made, destroyed once by its owner.
            drop(unsafe { Box::from_raw(args.object) });
        }
        Ok(())
    })
}

/// # Safety
/// `pointer` is NULL or an executable this plugin handed out and not destroyed.
unsafe fn compiled<'a>(pointer: *mut Executable) -> Result<&'a Compiled> {
    // SAFETY: as the caller promises.
    Ok(&unsafe { object("executable", pointer) }?.0)
}

pub(crate) unsafe extern "C" fn name(args: *mut OfString<Executable>) -> *mut Error {
    call("PJRT_Executable_Name", args, |args| {
        // SAFETY: an executable this plugin made; the name lives as long as it.
        let compiled = unsafe { compiled(args.object) }?;
        (args.text, args.size) = (compiled.name.as_ptr().cast(), compiled.name.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn num_replicas(args: *mut OfValue<Executable, usize>) -> *mut Error {
    call("PJRT_Executable_NumReplicas", args, |args| {
        // SAFETY: an executable this plugin made.
        args.value = unsafe { compiled(args.object) }?.replicas;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn num_partitions(args: *mut OfValue<Executable, usize>) -> *mut Error {
    call("PJRT_Executable_NumPartitions", args, |args| {
        // SAFETY: an executable this plugin made.
        unsafe { compiled(args.object) }?;
        args.value = 1;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn num_outputs(args: *mut OfValue<Executable, usize>) -> *mut Error {
    call("PJRT_Executable_NumOutputs", args, |args| {
        // SAFETY: an executable this plugin made.
        args.value = unsafe { compiled(args.object) }?.output_types.len();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn code_size(args: *mut OfValue<Executable, i64>) -> *mut Error {
    call("PJRT_Executable_SizeOfGeneratedCodeInBytes", args, |args| {
        // SAFETY: an executable this plugin made: its NEFF's size.
        args.value = unsafe { compiled(args.object) }?.neff.len() as i64;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn cost_analysis(args: *mut CostAnalysisArgs) -> *mut Error {
    call("PJRT_Executable_GetCostAnalysis", args, |args| {
        // SAFETY: an executable this plugin made.
        unsafe { compiled(args.executable) }?;
        (args.properties, args.num_properties) = (std::ptr::null(), 0);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn output_memory_kinds(args: *mut OutputMemoryKindsArgs) -> *mut Error {
    call("PJRT_Executable_OutputMemoryKinds", args, |args| {
        // SAFETY: an executable this plugin made.
        let compiled = unsafe { compiled(args.executable) }?;
        args.num_outputs = compiled.memory_kinds.len();
        (args.memory_kinds, args.memory_kind_sizes) =
            (compiled.memory_kinds.as_ptr(), compiled.memory_kind_sizes.as_ptr());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn output_element_types(args: *mut OutputElementTypesArgs) -> *mut Error {
    call("PJRT_Executable_OutputElementTypes", args, |args| {
        // SAFETY: an executable this plugin made.
        let compiled = unsafe { compiled(args.executable) }?;
        (args.output_types, args.num_output_types) = (compiled.output_types.as_ptr(), compiled.output_types.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn output_dimensions(args: *mut OutputDimensionsArgs) -> *mut Error {
    call("PJRT_Executable_OutputDimensions", args, |args| {
        // SAFETY: an executable this plugin made.
        let compiled = unsafe { compiled(args.executable) }?;
        args.num_outputs = compiled.output_dim_sizes.len();
        (args.dims, args.dim_sizes) = (compiled.output_dims_flat.as_ptr(), compiled.output_dim_sizes.as_ptr());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn optimized_program(args: *mut OptimizedProgramArgs) -> *mut Error {
    call("PJRT_Executable_OptimizedProgram", args, |args| {
        // SAFETY: an executable this plugin made, and the caller's program struct.
        let compiled = unsafe { compiled(args.executable) }?;
        let program = unsafe { args.program.as_mut() }.ok_or_else(|| Error::invalid("the program is NULL"))?;
        let format = "hlo_with_config";
        (program.format, program.format_size) = (format.as_ptr().cast(), format.len());
        if program.code.is_null() {
            program.code_size = compiled.optimized.len();
            return Ok(());
        }
        if program.code_size < compiled.optimized.len() {
            return Err(Error::invalid(format!(
                "the program buffer holds {} bytes; the program has {}",
                program.code_size,
                compiled.optimized.len()
            )));
        }
        // SAFETY: the caller's buffer of `code_size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(compiled.optimized.as_ptr(), program.code.cast(), compiled.optimized.len())
        };
        program.code_size = compiled.optimized.len();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn fingerprint(args: *mut OfString<Executable>) -> *mut Error {
    call("PJRT_Executable_Fingerprint", args, |args| {
        // SAFETY: an executable this plugin made; the text lives as long as it.
        let compiled = unsafe { compiled(args.object) }?;
        (args.text, args.size) = (compiled.fingerprint.as_ptr().cast(), compiled.fingerprint.len());
        Ok(())
    })
}

/// `PJRT_Executable_Serialize_Args`.
#[repr(C)]
pub(crate) struct SerializeArgs {
    pub(crate) head: Head,
    pub(crate) executable: *mut Executable,
    pub(crate) bytes: *const c_char,
    pub(crate) size: usize,
    pub(crate) serialized: *mut Vec<u8>,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut Vec<u8>)>,
}

/// `PJRT_Executable_DeserializeAndLoad_Args`.
#[repr(C)]
pub(crate) struct DeserializeArgs {
    pub(crate) head: Head,
    pub(crate) client: *mut Client,
    pub(crate) bytes: *const c_char,
    pub(crate) size: usize,
    pub(crate) loaded: *mut LoadedExecutable,
}

unsafe extern "C" fn free_serialized(serialized: *mut Vec<u8>) {
    if !serialized.is_null() {
        // SAFETY: the buffer `serialize` handed out, freed once by its owner.
        drop(unsafe { Box::from_raw(serialized) });
    }
}

pub(crate) unsafe extern "C" fn serialize(args: *mut SerializeArgs) -> *mut Error {
    call("PJRT_Executable_Serialize", args, |args| {
        // SAFETY: an executable this plugin made.
        let compiled = unsafe { compiled(args.executable) }?;
        let bytes = Box::new(crate::serialized::encode(&compiled.program, &compiled.options, &compiled.neff));
        (args.bytes, args.size) = (bytes.as_ptr().cast(), bytes.len());
        args.serialized = Box::into_raw(bytes);
        args.deleter = Some(free_serialized);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn deserialize_and_load(args: *mut DeserializeArgs) -> *mut Error {
    call("PJRT_Executable_DeserializeAndLoad", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.client) }?;
        if args.bytes.is_null() {
            return Err(Error::invalid("the serialized executable is NULL"));
        }
        // SAFETY: the caller's bytes of the size it gives.
        let bytes = unsafe { std::slice::from_raw_parts(args.bytes.cast::<u8>(), args.size) };
        let [program, options, neff] = crate::serialized::decode(bytes).map_err(Error::invalid)?;
        let neff = Neff::decode(neff, DecodeOptions { validate_hash: true })?;
        args.loaded = load(client, compile(client, program, "hlo", options, Some(neff))?)?;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn loaded_fingerprint(args: *mut OfString<LoadedExecutable>) -> *mut Error {
    call("PJRT_LoadedExecutable_Fingerprint", args, |args| {
        // SAFETY: an executable this plugin made; the text lives as long as it.
        let loaded = unsafe { object("executable", args.object) }?;
        (args.text, args.size) = (loaded.compiled.fingerprint.as_ptr().cast(), loaded.compiled.fingerprint.len());
        Ok(())
    })
}
