//! Loading and unloading: a NEFF decoded, validated, charged and published on a
//! core (or on several, as the ranks of a communicator), and released again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::backend::Executable;
use crate::collectives::{self, Communicator};
use crate::config::MAX_EXEC_TIMEOUT;
use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::{BufferKind, CollectiveKind, DmaQueueKind, Op, Program, format_groups};
use crate::memory::{Charge, MemoryCharge};
use crate::neff::{DecodeOptions, Neff};
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::core as counter;
use neuron_datastore::event::payload;
use neuron_datastore::event::{DmaQueueType, EventType};
use neuron_datastore::record::{DEVICE_KIND_DMA, DeviceRecord};
use neuron_datastore::{At, DeviceCategory, EventIds, HostCategory, InstructionTrace, ModelEntry, RingPos, Tracer};

use super::*;

impl Runtime {
    /// Loads a NEFF onto `core`, or onto the held core with the fewest models. A program
    /// with collectives runs as a single rank; see [`Runtime::load_collectives`].
    pub fn load(&self, neff_bytes: &[u8], core: Option<u32>) -> NrtResult<Model> {
        self.load_rank(neff_bytes, core, None)
    }

    /// Loads a NEFF once per core of `cores`, as ranks `0..cores.len()` of one
    /// communicator (`nrt_load_collectives`): the program's collectives (HLO
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`) exchange data between
    /// the ranks. Every rank is executed like any model, each from its own thread or
    /// execution unit; a rank's collective waits for the other ranks of its replica
    /// group, up to `NEURON_RT_EXEC_TIMEOUT`. The replica groups must split the ranks.
    pub fn load_collectives(&self, neff_bytes: &[u8], cores: &[u32]) -> NrtResult<Vec<Model>> {
        self.shared.lifecycle.check()?;
        let name = Neff::decode(neff_bytes, DecodeOptions { validate_hash: false })?.name;
        let communicator = self.communicator_named(Some(&name), cores)?;
        let mut models = Vec::with_capacity(cores.len());
        for (rank, &core) in cores.iter().enumerate() {
            match self.load_rank(neff_bytes, Some(core), Some((communicator.clone(), rank as u32))) {
                Ok(model) => models.push(model),
                Err(error) => {
                    for model in &models {
                        let _ = self.unload(model);
                    }
                    return Err(error);
                }
            }
        }
        Ok(models)
    }

    /// A communicator whose ranks `0..cores.len()` run on `cores`, for collectives called
    /// through [`Communicator::run`] or [`Runtime::collective_schedule`].
    pub fn communicator(&self, cores: &[u32]) -> NrtResult<Communicator> {
        self.communicator_named(None, cores)
    }

    /// Loads one rank of a collectives program onto `core` (`nrt_load_collectives` as a
    /// C program calls it, once per rank): rank `rank` of `communicator`, whose core for
    /// that rank must be `core`.
    pub fn load_collective_rank(
        &self,
        neff_bytes: &[u8],
        core: u32,
        communicator: &Communicator,
        rank: u32,
    ) -> NrtResult<Model> {
        if communicator.core(rank) != Some(core) {
            return Err(NrtError::invalid(format!(
                "rank {rank} of communicator `{}` does not run on nc{core}",
                communicator.name()
            )));
        }
        self.load_rank(neff_bytes, Some(core), Some((communicator.clone(), rank)))
    }

    pub(super) fn communicator_named(&self, name: Option<&str>, cores: &[u32]) -> NrtResult<Communicator> {
        self.shared.lifecycle.check()?;
        for &core in cores {
            self.check_held(core)?;
        }
        Communicator::new(
            name,
            cores,
            &self.shared.topology,
            self.tracer()?,
            Arc::clone(&self.shared.lifecycle),
            self.shared.config.exec_timeout.min(MAX_EXEC_TIMEOUT),
        )
    }

    pub(super) fn load_rank(
        &self,
        neff_bytes: &[u8],
        core: Option<u32>,
        rank: Option<(Communicator, u32)>,
    ) -> NrtResult<Model> {
        let called = ticks();
        self.shared.lifecycle.check()?;
        let tracer = self.tracer()?;
        let neff = Neff::decode(neff_bytes, DecodeOptions { validate_hash: self.shared.config.validate_hash })?;
        let program = &neff.program;
        if program.target != self.shared.topology.core_version {
            return Err(NrtError::invalid(format!(
                "NEFF `{}` was compiled for NeuronCore-{} but {} has NeuronCore-{}; recompile with a matching --target",
                neff.name, program.target, self.shared.topology.instance_type, self.shared.topology.core_version
            )));
        }
        let core = self.pick_core(core)?;
        let ranks = rank.as_ref().map_or(1, |(c, _)| c.ranks());
        check_collectives(program, &neff.name, ranks)?;
        let rank = match rank {
            Some(rank) => Some(rank),
            None if program.has_collectives() => Some((self.communicator_named(Some(&neff.name), &[core])?, 0)),
            None => None,
        };
        let slot = tracer.store().core_slot(core).ok_or_else(|| NrtError::invalid(format!("nc{core} is not held")))?;
        let ring = tracer.ring_of(Some(core));
        let id = self.shared.next_model_id.fetch_add(1, Ordering::Relaxed);
        let name_id = tracer.store().intern(&neff.name);
        let ids = EventIds { model_id: id, ..EventIds::default() };
        let load = tracer.span(ring, EventType::NrtLoad, ids);
        tracer.open(At::Ticks(called), &load, payload::Model { name: name_id, status: None });
        let loaded = self.load_on(&tracer, neff, neff_bytes.len() as u64, core, slot, ring, id, name_id, rank);
        tracer.stop(&load, payload::Model { name: name_id, status: loaded.as_ref().err().map(|e| e.status.code()) });
        let model = loaded?;
        tracing::info!(model = %model.inner.name, id, core, "model loaded");
        Ok(model)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_on(
        &self,
        tracer: &Tracer,
        neff: Neff,
        neff_len: u64,
        core: u32,
        slot: usize,
        ring: RingPos,
        id: u32,
        name_id: u32,
        rank: Option<(Communicator, u32)>,
    ) -> NrtResult<Model> {
        let program = &neff.program;
        let collectives = program.instructions().filter(|i| matches!(i.op, Op::Collective(_))).count() as u32;
        let charges = self.charge_model(program, neff_len, core)?;
        let size_of = |b: u32| program.buffers[b as usize].ty.size_bytes().unwrap_or(0);
        let input_bytes = program.inputs.iter().map(|io| size_of(io.buffer)).sum();
        let output_bytes = program.outputs.iter().map(|io| size_of(io.buffer)).sum();
        let executable = Executable::new(neff.program, self.shared.config.fusion);
        let program = executable.program();
        let moved = executable.moved_bytes();
        let instructions = executable
            .trace_table()
            .into_iter()
            .zip(moved)
            .map(|((instruction, program), moved)| {
                let operand_types: Vec<&ArrayType> =
                    instruction.operands.iter().map(|&o| &program.buffers[o as usize].ty).collect();
                let output_type = &program.buffers[instruction.output as usize].ty;
                let hlo = program.hlo_names.get(instruction.hlo as usize).map_or("", String::as_str);
                InstructionTrace {
                    engine: instruction.op.engine() as u8,
                    opcode_id: tracer.store().intern(instruction.op.opcode()),
                    hlo_id: tracer.store().intern(hlo),
                    step: instruction.step,
                    flops: instruction.op.flops(&operand_types, output_type),
                    // Fused members are charged what the group moves, not what each
                    // would move alone (their share of its time would claim more).
                    bytes_read: moved
                        .map_or_else(|| operand_types.iter().map(|t| t.size_bytes().unwrap_or(0)).sum(), |m| m.0),
                    bytes_written: moved.map_or_else(|| output_type.size_bytes().unwrap_or(0), |m| m.1),
                }
            })
            .collect::<Vec<_>>();
        let device_memory = |category| {
            charges.iter().filter(|c| c.charge() == (Charge::Device { core, category })).map(|c| c.bytes()).sum()
        };
        let entry = ModelEntry {
            model_id: id,
            core,
            name: neff.name.clone(),
            uuid: neff.uuid,
            loaded_ticks: ticks(),
            flops_per_execution: program.flops_per_execution(),
            instructions: instructions.len() as u64,
            device_memory: std::array::from_fn(|k| device_memory(DeviceCategory::ALL[k])),
            host_memory: charges.iter().filter(|c| matches!(c.charge(), Charge::Host(_))).map(|c| c.bytes()).sum(),
        };
        let instructions_in_table = tracer.store().add_instructions(id, &instructions);
        if !instructions_in_table {
            tracing::warn!(
                model = %neff.name,
                "the datastore's instruction table is full: this model's device events take one record per instruction"
            );
        }
        let table_slot = tracer.store().publish_model(&entry);
        self.emit_weight_transfers(tracer, program, core, slot, id);
        let model = Arc::new(LoadedModel {
            id,
            name: neff.name,
            uuid: neff.uuid,
            core,
            flops_per_execution: entry.flops_per_execution,
            executable,
            charges: Mutex::new(charges),
            slot,
            ring,
            name_id,
            table_slot,
            instructions,
            instructions_in_table,
            input_bytes,
            output_bytes,
            rank,
            collectives,
            spans_last: Default::default(),
        });
        {
            // Checked again under the models lock: a concurrent close drains the table
            // after marking the runtime closed, so a model inserted here is never missed.
            let mut models = lock(&self.shared.models);
            if let Err(e) = self.shared.lifecycle.check() {
                if let Some(s) = table_slot {
                    tracer.store().retract_model(s);
                }
                return Err(e);
            }
            models.insert(id, Arc::clone(&model));
        }
        Ok(Model { inner: model })
    }

    /// Weights DMA at load: one device event per constant (viewed in place from the
    /// NEFF, so the transfers take no time), under the core's lock as every device
    /// event is.
    pub(super) fn emit_weight_transfers(
        &self,
        tracer: &Tracer,
        program: &Program,
        core: u32,
        slot: usize,
        model_id: u32,
    ) {
        let weights: u64 = program
            .buffers
            .iter()
            .filter(|b| matches!(b.kind, BufferKind::Constant { .. }))
            .map(|b| b.ty.size_bytes().unwrap_or(0))
            .sum();
        tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Weights as u64, weights);
        if !tracer.device_enabled(slot) {
            return;
        }
        let core_locks = lock(&self.shared.running).as_ref().map(|r| Arc::clone(&r.core_locks));
        let Some(core_locks) = core_locks else { return };
        let _busy = core_locks.get(&core).map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let now = tracer.device_ns(slot, ticks());
        for queue in program.dma_queues.iter().filter(|q| q.kind == DmaQueueKind::Weights) {
            for transfer in &queue.transfers {
                tracer.emit_device(
                    slot,
                    &DeviceRecord {
                        start_ns: now,
                        end_ns: now,
                        model_id,
                        kind: DEVICE_KIND_DMA,
                        unit: DmaQueueType::Weights as u8,
                        opcode_or_index: transfer.index,
                        flops_or_bytes: transfer.bytes,
                        ..DeviceRecord::default()
                    },
                );
            }
        }
    }

    /// Unloads a model; its handle is invalid afterwards.
    pub fn unload(&self, model: &Model) -> NrtResult<()> {
        let tracer = self.tracer()?;
        let m = &model.inner;
        let ids = EventIds { model_id: m.id, ..EventIds::default() };
        let unload = tracer.start(m.ring, EventType::NrtUnload, ids, payload::Model { name: m.name_id, status: None });
        let removed = lock(&self.shared.models).remove(&m.id);
        let result = match removed {
            Some(loaded) => {
                lock(&loaded.charges).clear();
                if let Some(slot) = loaded.table_slot {
                    tracer.store().retract_model(slot);
                }
                tracing::info!(model = %m.name, id = m.id, "model unloaded");
                Ok(())
            }
            None => Err(stale_model(model)),
        };
        tracer
            .stop(&unload, payload::Model { name: m.name_id, status: result.as_ref().err().map(|e| e.status.code()) });
        result
    }

    pub(super) fn check_held(&self, core: u32) -> NrtResult<()> {
        let held = self.cores()?;
        if held.contains(core) {
            Ok(())
        } else {
            Err(NrtError::invalid(format!(
                "nc{core} is not one of this process's NeuronCores ({held}); set NEURON_RT_VISIBLE_CORES to include it"
            )))
        }
    }

    pub(super) fn pick_core(&self, wanted: Option<u32>) -> NrtResult<u32> {
        if let Some(core) = wanted {
            self.check_held(core)?;
            return Ok(core);
        }
        let held = self.cores()?;
        let models = lock(&self.shared.models);
        held.cores()
            .iter()
            .copied()
            .min_by_key(|&c| models.values().filter(|m| m.core == c).count())
            .ok_or_else(|| NrtError::new(NrtStatus::LoadNotEnoughNc, "this runtime holds no NeuronCores"))
    }

    /// Charges a model's memory: constants, code, descriptors and scratchpad on the
    /// device, and the runtime's copy of the program on the host.
    pub(super) fn charge_model(&self, program: &Program, neff_len: u64, core: u32) -> NrtResult<Vec<MemoryCharge>> {
        let ledger = &self.shared.ledger;
        let device = |category| Charge::Device { core, category };
        let descriptors: u64 = program.dma_queues.iter().map(|q| q.transfers.len() as u64).sum();
        let code_bytes = neff_len.saturating_sub(program.constant_bytes());
        Ok(vec![
            ledger.charge(device(DeviceCategory::Constants), program.constant_bytes())?,
            ledger.charge(device(DeviceCategory::ModelCode), code_bytes)?,
            ledger.charge(device(DeviceCategory::RuntimeMemory), descriptors * DMA_DESCRIPTOR_BYTES)?,
            ledger.charge(device(DeviceCategory::ModelSharedScratchpad), program.scratchpad_bytes)?,
            ledger.charge(Charge::Host(HostCategory::ApplicationMemory), code_bytes)?,
        ])
    }
}

/// Checks at load that a program's collectives fit `ranks` ranks: their replica groups
/// split the ranks, and a gather, scatter or exchange over every rank divides its
/// dimension by the number of ranks.
fn check_collectives(program: &Program, name: &str, ranks: usize) -> NrtResult<()> {
    for instruction in program.instructions() {
        let Op::Collective(op) = &instruction.op else { continue };
        let hlo = program.hlo_names.get(instruction.hlo as usize).map_or("", String::as_str);
        let needed = op.groups.iter().flatten().map(|&r| r as usize + 1).max().unwrap_or(1);
        let operand = &program.buffers[instruction.operands[0] as usize].ty;
        let output = &program.buffers[instruction.output as usize].ty;
        let factor = match op.kind {
            CollectiveKind::AllGather { dim } => output.dims[dim as usize] / operand.dims[dim as usize].max(1),
            CollectiveKind::ReduceScatter { dim, .. } => operand.dims[dim as usize] / output.dims[dim as usize].max(1),
            _ => 1,
        };
        let hint = |need: usize| {
            format!(
                "; load it on {need} cores as {need} ranks (Runtime::load_collectives, or neuron-bench exec --cores 0-{})",
                need.saturating_sub(1)
            )
        };
        if let Err(error) = collectives::check_groups(&op.groups, ranks) {
            let hint = if needed > ranks { hint(needed) } else { String::new() };
            return Err(NrtError::invalid(format!(
                "`{name}` is loaded as {ranks} rank(s), but its {} (HLO `{hlo}`) with replica_groups={}: {}{hint}",
                op.kind.name(),
                format_groups(&op.groups),
                error.message
            )));
        }
        let gathers = matches!(op.kind, CollectiveKind::AllGather { .. } | CollectiveKind::ReduceScatter { .. });
        if gathers && op.groups.is_empty() && factor as usize != ranks {
            return Err(NrtError::invalid(format!(
                "`{name}` is loaded as {ranks} rank(s), but its {} (HLO `{hlo}`) of {operand} into {output} is over {factor} ranks{}",
                op.kind.name(),
                hint(factor as usize)
            )));
        }
        if let CollectiveKind::AllToAll { dim } = op.kind {
            let sizes: Vec<usize> =
                if op.groups.is_empty() { vec![ranks] } else { op.groups.iter().map(Vec::len).collect() };
            if let Some(group) = sizes.into_iter().find(|&g| !operand.dims[dim as usize].is_multiple_of(g as u64)) {
                return Err(NrtError::invalid(format!(
                    "`{name}`: all-to-all (HLO `{hlo}`) splits dimension {dim} of {operand} into {group} parts, which does not divide it"
                )));
            }
        }
    }
    Ok(())
}
