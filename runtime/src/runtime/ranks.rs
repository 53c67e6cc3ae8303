//! Ranks of communicators that span the job's processes: each process joins the ranks
//! it holds, under a key every process derives the same way, and rank 0's process
//! introduces them to each other (see `collectives::remote` and `collectives::world`).

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::collectives::Communicator;
use crate::collectives::world::auth::Trust;
use crate::collectives::world::clock::ClockOffset;
use crate::collectives::world::{Hooks, World};
use crate::config::MAX_EXEC_TIMEOUT;
use crate::error::{NrtError, NrtResult};
use crate::launch::ENV_ROOT_COMM_ID;
use crate::neff::{DecodeOptions, Neff};
use neuron_datastore::EventIds;
use neuron_datastore::event::{EventType, payload};

use super::*;

/// The name `nrt_build_global_comm`, `nrt_barrier` and `nrt_all_gather` share.
pub const GLOBAL_COMMUNICATOR: &str = "global";

impl Runtime {
    /// Joins rank `rank` of `count` of the job's communicator `name`, on `core` of this
    /// process (`nrt_build_global_comm` joins [`GLOBAL_COMMUNICATOR`]). Every process
    /// joins the ranks it holds under the same name and count; a process may hold any
    /// number of them. The communicator works once all `count` ranks have joined: its
    /// first collective waits for that (up to `NEURON_RT_EXEC_TIMEOUT`), or
    /// [`Communicator::wait_for_ranks`]. After a failure, joining again builds a new
    /// communicator under the same name.
    ///
    /// Rank 0's process listens at `NEURON_RT_ROOT_COMM_ID` (or `MASTER_ADDR`, port
    /// 62182, under torchrun); the others connect to it.
    pub fn join_communicator(&self, name: &str, core: u32, rank: u32, count: u32) -> NrtResult<Communicator> {
        self.join_across(name, (name, None), core, rank, count)
    }

    /// `nrt_load_collectives` in a job of several processes: loads the NEFF on `core` as
    /// rank `rank` of `count`. The ranks that every process loads from the same NEFF with
    /// the same count form one communicator.
    pub fn load_collectives_across(&self, neff_bytes: &[u8], core: u32, rank: u32, count: u32) -> NrtResult<Model> {
        let name = Neff::decode(neff_bytes, DecodeOptions { validate_hash: false })?.name;
        let digest = Sha256::digest(neff_bytes);
        let hash = format!("{:016x}", u64::from_le_bytes(digest[..8].try_into().unwrap_or_default()));
        let key = format!("neff {hash} ranks {count}");
        let communicator = self.join_across(&name, (&key, Some(&hash)), core, rank, count)?;
        self.load_rank(neff_bytes, Some(core), Some((communicator, rank)))
    }

    /// Joins rank `rank` of communicator `key` (a program's when `program` gives the
    /// NEFF's hash).
    fn join_across(
        &self,
        name: &str,
        (key, program): (&str, Option<&str>),
        core: u32,
        rank: u32,
        count: u32,
    ) -> NrtResult<Communicator> {
        self.shared.lifecycle.check()?;
        self.check_held(core)?;
        let world = self.world()?;
        let tracer = self.tracer()?;
        let timeout = self.shared.config.exec_timeout.min(MAX_EXEC_TIMEOUT);
        let communicator = self.with_running(|running| {
            let mut across = lock(&running.across);
            match across.get(key) {
                Some(held) if held.ranks() != count as usize => Err(NrtError::invalid(format!(
                    "communicator `{name}` has {} ranks in this process already, not {count}",
                    held.ranks()
                ))),
                Some(held) if !held.has_failed() => Ok(held.clone()),
                held => {
                    let generation = held.map_or(0, |c| c.generation() + 1);
                    let fresh = Communicator::across(
                        name,
                        (key, generation, program.map(str::to_owned)),
                        count,
                        Arc::clone(&world),
                        Arc::clone(&tracer),
                        Arc::clone(&self.shared.lifecycle),
                        timeout,
                    )?;
                    across.insert(key.to_owned(), fresh.clone());
                    Ok(fresh)
                }
            }
        })??;
        communicator.join(rank, core, &self.shared.topology)?;
        Ok(communicator)
    }

    /// This process's host clock against the root's (rank 0's process), once the
    /// process is in a job and has measured it: at bootstrap, then every 10 s. Each
    /// measure is also a `clock_offset` event in the process ring.
    pub fn clock_offset(&self) -> Option<ClockOffset> {
        self.with_running(|running| running.world.get().and_then(|world| world.clock_offset())).ok().flatten()
    }

    /// Records this process's latest clock offset again, as a `clock_offset` event now:
    /// for a recording that was paused when it was measured (a capture's warm-up) or
    /// began after it. Nothing before the first measure.
    pub fn trace_clock_offset(&self) {
        let _ = self.with_running(|running| {
            if let Some(offset) = running.world.get().and_then(|world| world.clock_offset()) {
                let payload =
                    payload::ClockOffset { offset_ns: offset.offset_ns, uncertainty_ns: offset.uncertainty_ns };
                running.tracer.instant(
                    running.tracer.ring_of(None),
                    EventType::ClockOffset,
                    EventIds::default(),
                    payload,
                );
            }
        });
    }

    /// This process's membership in the job, started on first use.
    fn world(&self) -> NrtResult<Arc<World>> {
        let root = self.shared.config.root_comm.as_ref().ok_or_else(|| {
            NrtError::invalid(format!(
                "a communicator across processes needs rank 0's address: set {ENV_ROOT_COMM_ID}=<ipv4>:<port> in every process (torchrun's MASTER_ADDR also works)"
            ))
        })?;
        let timeout = self.shared.config.exec_timeout.min(MAX_EXEC_TIMEOUT);
        self.with_running(|running| match running.world.get() {
            Some(world) => Ok(Arc::clone(world)),
            None => {
                // Each measure of this process's clock against the root's goes in the
                // process ring, to align the ranks' traces with.
                let tracer = Arc::clone(&running.tracer);
                let on_clock = Box::new(move |offset: ClockOffset| {
                    let payload =
                        payload::ClockOffset { offset_ns: offset.offset_ns, uncertainty_ns: offset.uncertainty_ns };
                    tracer.instant(tracer.ring_of(None), EventType::ClockOffset, EventIds::default(), payload);
                    tracer.store().set_clock_offset(offset.offset_ns, offset.uncertainty_ns);
                });
                // What this process is doing, as its models table says, goes to the others
                // every second; what each of them says goes in the flight record of its
                // ranks, for the tools of this host.
                let tracer = Arc::clone(&running.tracer);
                let doing = Box::new(move || tracer.store().activity().executing);
                // Held weakly: the communicators hold the world, which holds this.
                let across = Arc::downgrade(&running.across);
                let on_heard = Box::new(move |process: u32, heard: &neuron_datastore::flight::Heard| {
                    let Some(across) = across.upgrade() else { return };
                    let communicators: Vec<Communicator> = lock(&across).values().cloned().collect();
                    communicators.iter().for_each(|c| c.record_heard(process, heard));
                });
                let trust = Trust::from_config(&self.shared.config.job_auth)?;
                running.tracer.store().set_job_admission(trust.admission());
                let world = Arc::new(World::start(root, timeout, Hooks { on_clock, doing, on_heard }, trust)?);
                Ok(Arc::clone(running.world.get_or_init(|| world)))
            }
        })?
    }
}
