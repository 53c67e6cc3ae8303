//! Where everything is in a datastore file, for one layout version.
//!
//! The file is a contract between processes, specified in `datastore/FORMAT.md`; this
//! module is its single source of offsets. A [`Layout`] is derived from the few sizes
//! the header records (cores, ring capacity, model slots, string table size, devices),
//! so the writer and every reader compute identical offsets, and a reader can check
//! that the file is exactly as long as its header says before touching anything else.

/// `NRTVDS` followed by two zero bytes, as a little-endian `u64`.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"NRTVDS\0\0");
/// The layout this build writes and reads.
pub const LAYOUT_VERSION: u32 = 7;

pub(crate) const HEADER_BYTES: u64 = 4096;
/// Bytes per ring slot: one sequence word and fifteen payload words.
pub(crate) const SLOT_BYTES: u64 = 128;
pub(crate) const SLOT_WORDS: usize = 16;
pub(crate) const RING_HEADER_BYTES: u64 = 256;
pub(crate) const MODEL_SLOT_BYTES: u64 = 256;
pub(crate) const MODEL_HISTOGRAM_BYTES: u64 = 8 * super::histogram::MODEL_BUCKETS as u64;
pub(crate) const PROCESS_BLOCK_BYTES: u64 = 1024;
pub(crate) const STRING_TABLE_HEADER_BYTES: u64 = 64;
pub(crate) const INSTRUCTION_TABLE_HEADER_BYTES: u64 = 64;
/// Scalar counters at the start of each core block, before its two histograms.
pub(crate) const CORE_SCALAR_BYTES: u64 = 256;
/// The most NeuronCores a file describes (an instance has at most 64).
pub const MAX_CORES: u32 = 128;

/// Events kept per ring when nothing asks for more: the always-on rings. 65,536 slots
/// of 128 bytes are 8 MiB per ring, so a runtime's file is about 32 MiB with one
/// NeuronCore and about 16 MiB more per further core (`datastore/FORMAT.md`).
pub const DEFAULT_MAX_EVENTS_PER_NC: u64 = 1 << 16;
/// Events kept per ring when a profile is asked for (`NEURON_RT_INSPECT_ENABLE=1`,
/// `neuron-profile capture` and `inspect`) without a size: 128 MiB per ring.
pub const INSPECT_MAX_EVENTS_PER_NC: u64 = 1 << 20;
/// The largest ring accepted (2²⁴ events, 2 GiB per ring).
pub const MAX_EVENTS_PER_NC: u64 = 1 << 24;
/// The smallest ring.
pub const MIN_EVENTS_PER_NC: u64 = 16;
/// Bytes the device reads per instruction fetched (the instructions DMA queue).
pub const INSTRUCTION_BYTES: u64 = 64;
/// Size of the string table.
pub const DEFAULT_STRING_TABLE_BYTES: u64 = 2 << 20;
/// Size of the instruction table (40 bytes per instruction of each model loaded:
/// about 100,000 instructions).
pub const DEFAULT_INSTRUCTION_TABLE_BYTES: u64 = 4 << 20;
/// Slots of the models table.
pub const DEFAULT_MODEL_SLOTS: u32 = 256;
/// The most devices whose ECC counters a file holds.
pub(crate) const MAX_DEVICES: u32 = 32;

/// The flight record of the communicators a process takes part in (`flight.rs`): this
/// many communicators at once, ranks `0..COMM_RANKS` of each, the last
/// `COMM_HISTORY` collectives of each rank.
pub const COMM_SLOTS: u32 = 4;
pub const COMM_RANKS: u32 = 128;
pub const COMM_HISTORY: u32 = 32;
pub(crate) const COMM_HEADER_BYTES: u64 = 256;
pub(crate) const COMM_ROW_BYTES: u64 = 128;
pub(crate) const COMM_ENTRY_BYTES: u64 = 48;
/// One communicator's slot: header, rank rows, then each rank's history.
pub(crate) const COMM_SLOT_BYTES: u64 =
    COMM_HEADER_BYTES + COMM_ROW_BYTES * COMM_RANKS as u64 + COMM_ENTRY_BYTES * COMM_HISTORY as u64 * COMM_RANKS as u64;

/// Header fields (byte offsets).
pub(crate) mod header {
    pub(crate) const MAGIC: u64 = 0;
    pub(crate) const LAYOUT_VERSION: u64 = 8;
    pub(crate) const HEADER_BYTES: u64 = 12;
    pub(crate) const FILE_BYTES: u64 = 16;
    pub(crate) const PID: u64 = 24;
    /// `STATE_*`, updated by the writer.
    pub(crate) const STATE: u64 = 28;
    pub(crate) const PROCESS_START_TICKS: u64 = 32;
    pub(crate) const HEARTBEAT_MONO_NS: u64 = 40;
    pub(crate) const CREATED_REALTIME_NS: u64 = 48;
    pub(crate) const CREATED_MONO_NS: u64 = 56;
    pub(crate) const TICK_SOURCE: u64 = 64;
    /// `RECORDING_*` bits: what the rings record right now.
    pub(crate) const RECORDING: u64 = 68;
    pub(crate) const CALIBRATION_SEQ: u64 = 72;
    pub(crate) const CALIBRATION_FIRST_TICKS: u64 = 80;
    pub(crate) const CALIBRATION_FIRST_NS: u64 = 88;
    pub(crate) const CALIBRATION_LATEST_TICKS: u64 = 96;
    pub(crate) const CALIBRATION_LATEST_NS: u64 = 104;
    pub(crate) const DEVICE_CLOCK_EPOCH_TICKS: u64 = 112;
    pub(crate) const RING_CAPACITY: u64 = 120;
    pub(crate) const CORE_COUNT: u64 = 128;
    pub(crate) const MODEL_SLOTS: u64 = 132;
    pub(crate) const STRING_TABLE_BYTES: u64 = 136;
    pub(crate) const DEVICE_COUNT: u64 = 144;
    pub(crate) const CORES_PER_DEVICE: u64 = 148;
    pub(crate) const DEVICE_MEMORY_BYTES: u64 = 152;
    pub(crate) const INSTANCE_CORE_COUNT: u64 = 160;
    pub(crate) const HISTOGRAM_BUCKETS: u64 = 164;
    pub(crate) const INITIAL_NS_PER_TICK_FP32: u64 = 168;
    pub(crate) const INSTRUCTION_TABLE_BYTES: u64 = 176;
    /// Host threads a virtual core computes on at most (0 in files of older runtimes).
    pub(crate) const HOST_THREADS: u64 = 184;
    /// The kernel of bf16-rounded matrix products (`ProductKernel::code`; 0 in files of
    /// older runtimes).
    pub(crate) const PRODUCT_KERNEL: u64 = 188;
    /// The command's name (the script for an interpreter), length-prefixed.
    pub(crate) const COMMAND_NAME: u64 = 192;
    pub(crate) const COMMAND_NAME_MAX: u64 = 60;
    /// Length-prefixed strings: a `u32` length, then the bytes.
    pub(crate) const RUNTIME_VERSION: u64 = 256;
    pub(crate) const RUNTIME_VERSION_MAX: u64 = 60;
    pub(crate) const INSTANCE_TYPE: u64 = 320;
    pub(crate) const INSTANCE_TYPE_MAX: u64 = 60;
    pub(crate) const TAG: u64 = 384;
    pub(crate) const TAG_MAX: u64 = 255;
    /// `u32` global core index of each held core, in ring order.
    pub(crate) const CORES: u64 = 768;
    /// `u64` device-clock multiplier (ns per tick, 32.32 fixed point) of each held core.
    pub(crate) const DEVICE_CLOCK_MULT: u64 = 1280;
    /// The command line, length-prefixed, its arguments separated by NUL bytes; cut to
    /// the room left in the header.
    pub(crate) const COMMAND_LINE: u64 = 2304;
    pub(crate) const COMMAND_LINE_MAX: u64 = 4096 - 2304 - 4;
}

pub(crate) const STATE_RUNNING: u32 = 1;
pub(crate) const STATE_CLOSED: u32 = 2;

pub(crate) const TICK_SOURCE_MONOTONIC_NS: u32 = 0;
pub(crate) const TICK_SOURCE_TSC: u32 = 1;

pub(crate) const RECORDING_SYSTEM: u32 = 1;
pub(crate) const RECORDING_DEVICE: u32 = 2;
pub(crate) const RECORDING_DISCARD_MODE: u32 = 4;

/// Process-wide counters (word indexes in the process block).
pub(crate) mod process {
    /// `HostCategory` order: tensors, constants, dma_buffers, application_memory.
    pub(crate) const HOST_MEMORY: u64 = 0;
    pub(crate) const MODEL_SLOTS_OVERFLOWED: u64 = 4;
    /// Communicators not recorded because every communicator slot was taken.
    pub(crate) const COMM_SLOTS_OVERFLOWED: u64 = 5;
    /// Seqlock (odd while written), the root's host clock minus this process's (ns,
    /// signed), and the most that may be off by (0: never measured).
    pub(crate) const CLOCK_SEQ: u64 = 6;
    pub(crate) const CLOCK_OFFSET: u64 = 7;
    pub(crate) const CLOCK_UNCERTAINTY: u64 = 8;
    /// Seqlock (odd while written), the process's user and system CPU time (ns, from
    /// `getrusage`), and when they were read (`CLOCK_MONOTONIC` ns; 0: never), at every
    /// heartbeat: a tool reads them rather than `/proc/<pid>/stat` while the heartbeat
    /// is fresh.
    pub(crate) const CPU_SEQ: u64 = 9;
    pub(crate) const CPU_USER_NS: u64 = 10;
    pub(crate) const CPU_SYSTEM_NS: u64 = 11;
    pub(crate) const CPU_AT_NS: u64 = 12;
    /// How the process's job admits its processes (`JobAdmission::code`; 0: not in a
    /// job of several processes, or a runtime from before it was recorded).
    pub(crate) const JOB_ADMISSION: u64 = 13;
    /// Four words per device: mem corrected, mem uncorrected, sram corrected, sram uncorrected.
    pub(crate) const ECC: u64 = 16;
}

/// Per-core counters (word indexes in a core block).
pub mod core {
    pub const CORE_INDEX: u64 = 0;
    pub const BUSY_NS: u64 = 1;
    /// Six words, `ExecOutcome` order.
    pub const EXECUTIONS: u64 = 2;
    /// Six words, `ErrorClass` order.
    pub const ERRORS: u64 = 8;
    pub const FLOPS: u64 = 14;
    /// Four words, `DmaQueueType` order: input, output, weights, instructions.
    pub const DMA_BYTES: u64 = 15;
    pub const INSTRUCTIONS: u64 = 19;
    /// Five words, `DeviceCategory` order.
    pub const DEVICE_MEMORY: u64 = 20;
    pub const MODEL_SWITCHES: u64 = 25;
    pub const NUMERICAL_ERROR_VALUES: u64 = 26;
    /// Collective operations the core's ranks took part in, and the time they spent in
    /// them (waiting for the other ranks included).
    pub const COLLECTIVES: u64 = 27;
    pub const COLLECTIVES_NS: u64 = 28;
    /// The core's rank + 1 in the communicator it last joined (0: none), and that
    /// communicator's rank count.
    pub const RANK: u64 = 29;
    pub const RANKS: u64 = 30;
}

/// Model slot fields (byte offsets in a slot).
pub mod model {
    pub const SEQ: u64 = 0;
    pub const MODEL_ID: u64 = 8;
    pub const CORE: u64 = 12;
    pub const LOADED_TICKS: u64 = 16;
    pub const UUID: u64 = 24;
    pub const FLOPS_PER_EXECUTION: u64 = 40;
    pub const INSTRUCTIONS: u64 = 48;
    /// Five words, `DeviceCategory` order.
    pub const DEVICE_MEMORY: u64 = 56;
    pub const HOST_MEMORY: u64 = 96;
    pub const NAME_LEN: u64 = 104;
    /// Outside the seqlock: the HLO name's string id (`u32`) of the instruction an
    /// execution of the model is at now (0: none, or not known), rewritten as the
    /// execution moves on.
    pub const AT_INSTRUCTION: u64 = 108;
    pub const NAME: u64 = 112;
    pub const NAME_MAX: u64 = 128;
    /// Outside the seqlock: updated at every execution.
    pub const EXECUTIONS: u64 = 240;
    pub const RUNNING: u64 = 248;
}

/// Communicator slot fields (byte offsets: in the slot's header, in a rank row, in a
/// history entry).
pub(crate) mod comm {
    /// Seqlock of the header (odd while written; the slot is free while `ID` is 0).
    pub(crate) const SEQ: u64 = 0;
    /// The communicator's id as events carry it (`u32`), its rank count (`u32`).
    pub(crate) const ID: u64 = 8;
    pub(crate) const RANKS: u64 = 12;
    /// The name's string id (`u32`), flags (`u32`: [`ACROSS`], [`CLOSED`]).
    pub(crate) const NAME: u64 = 16;
    pub(crate) const FLAGS: u64 = 20;
    /// The communicator spans processes.
    pub(crate) const ACROSS: u32 = 1;
    /// The communicator was closed: its record stays, as it was, until the slot is
    /// taken again.
    pub(crate) const CLOSED: u32 = 2;

    /// Rank rows: pid (`u32`) and host string id (`u32`), flags (`u32`: the `ROW_*`
    /// bits) and core (`u32`), then sequences + 1 (0: none yet).
    pub(crate) const ROW_PID: u64 = 0;
    pub(crate) const ROW_HOST: u64 = 4;
    pub(crate) const ROW_FLAGS: u64 = 8;
    pub(crate) const ROW_CORE: u64 = 12;
    pub(crate) const ROW_ENQUEUED: u64 = 16;
    pub(crate) const ROW_STARTED: u64 = 24;
    pub(crate) const ROW_COMPLETED: u64 = 32;
    /// History entries written for the rank so far (the next goes at this modulo
    /// `COMM_HISTORY`).
    pub(crate) const ROW_RECORDED: u64 = 40;
    /// When the rank's current collective began waiting for another rank (root clock
    /// ns; 0: not waiting long) and that rank + 1.
    pub(crate) const ROW_WAITING_SINCE: u64 = 48;
    pub(crate) const ROW_WAITING_FOR: u64 = 56;
    /// The most the rank's clock may be off the root's (ns; 0: not known here).
    pub(crate) const ROW_UNCERTAINTY: u64 = 64;
    /// The operation of the collective it started last, + 1 (0: none).
    pub(crate) const ROW_OPERATION: u64 = 72;
    /// For a rank of another process: when its process last said what it is doing
    /// (root clock ns; 0: never heard here), and what: the number of models it was
    /// executing + 1 (bits 32–47) and the first one's name (a string id, bits 0–31),
    /// then the HLO instruction that execution was at (a string id; 0: none). Written
    /// by the thread that hears the job's processes, the heard time last.
    pub(crate) const ROW_HEARD_AT: u64 = 80;
    pub(crate) const ROW_DOING: u64 = 88;
    pub(crate) const ROW_DOING_AT: u64 = 96;
    pub(crate) const ROW_KNOWN: u32 = 1;
    pub(crate) const ROW_IN_THIS_PROCESS: u32 = 2;
    pub(crate) const ROW_GONE: u32 = 4;

    /// History entries: the tag (sequence + 1 in bits 0–31, index within the unit in
    /// 32–47, operation in 48–55, algorithm in 56–63; 0 while written), arrival and
    /// departure (root clock ns; departure 0 when not known here), bytes (bits 0–47)
    /// and replica group index (48–63).
    pub(crate) const ENTRY_TAG: u64 = 0;
    pub(crate) const ENTRY_ARRIVED: u64 = 8;
    pub(crate) const ENTRY_DEPARTED: u64 = 16;
    pub(crate) const ENTRY_BYTES: u64 = 24;
    /// What the rank did before it arrived (`flight::Before`'s word; 0: not known).
    pub(crate) const ENTRY_BEFORE: u64 = 32;
    /// The engine busiest before it arrived (`flight::Before`'s second word; 0: none).
    pub(crate) const ENTRY_BUSIEST: u64 = 40;
}

/// Ring header fields (byte offsets in a ring header).
pub(crate) mod ring {
    pub(crate) const CAPACITY: u64 = 0;
    pub(crate) const CORE: u64 = 8;
    pub(crate) const KIND: u64 = 16;
    /// Claimed slots: events produced into the ring (alone on its cache line).
    pub(crate) const HEAD: u64 = 64;
    /// Events refused in discard mode.
    pub(crate) const DROPPED: u64 = 128;
    /// Device rings: device events produced (a record may hold several).
    pub(crate) const EVENTS: u64 = 192;
}

/// `ring::CORE` of the process ring, for system events tied to no core.
pub(crate) const HOST_RING_CORE: u64 = u64::MAX;
pub(crate) const RING_KIND_SYSTEM: u64 = 0;
pub(crate) const RING_KIND_DEVICE: u64 = 1;

/// The sizes a header records, from which every offset follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) core_count: u32,
    pub(crate) ring_capacity: u64,
    pub(crate) model_slots: u32,
    pub(crate) string_table_bytes: u64,
    pub(crate) instruction_table_bytes: u64,
    pub(crate) histogram_buckets: u32,
}

/// Section offsets of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) sizes: Sizes,
    pub(crate) process_block: u64,
    pub(crate) core_blocks: u64,
    pub(crate) core_block_bytes: u64,
    pub(crate) models: u64,
    /// One latency histogram per model slot ([`MODEL_BUCKETS`](super::histogram::MODEL_BUCKETS) words).
    pub(crate) model_histograms: u64,
    pub(crate) strings: u64,
    pub(crate) instructions: u64,
    /// The communicators' flight record.
    pub(crate) comms: u64,
    pub(crate) rings: u64,
    pub(crate) ring_bytes: u64,
    pub(crate) file_bytes: u64,
}

impl Layout {
    /// Offsets for `sizes`, or `None` when they overflow or break a limit (a reader
    /// treats that as a corrupt header).
    pub(crate) fn new(sizes: Sizes) -> Option<Layout> {
        if sizes.core_count == 0
            || sizes.core_count > MAX_CORES
            || !sizes.ring_capacity.is_power_of_two()
            || sizes.histogram_buckets as usize != super::histogram::BUCKETS
            || !sizes.string_table_bytes.is_multiple_of(64)
            || !sizes.instruction_table_bytes.is_multiple_of(64)
        {
            return None;
        }
        let process_block = HEADER_BYTES;
        let core_blocks = process_block + PROCESS_BLOCK_BYTES;
        let core_block_bytes = round_up_64(CORE_SCALAR_BYTES + 2 * 8 * u64::from(sizes.histogram_buckets))
            + super::exemplar::SLOT_BYTES * super::exemplar::SLOTS as u64;
        let models = core_blocks.checked_add(core_block_bytes.checked_mul(u64::from(sizes.core_count))?)?;
        let model_histograms = models.checked_add(MODEL_SLOT_BYTES.checked_mul(u64::from(sizes.model_slots))?)?;
        let strings = model_histograms.checked_add(MODEL_HISTOGRAM_BYTES.checked_mul(u64::from(sizes.model_slots))?)?;
        let instructions = strings.checked_add(STRING_TABLE_HEADER_BYTES)?.checked_add(sizes.string_table_bytes)?;
        let comms =
            instructions.checked_add(INSTRUCTION_TABLE_HEADER_BYTES)?.checked_add(sizes.instruction_table_bytes)?;
        let rings = comms + COMM_SLOT_BYTES * u64::from(COMM_SLOTS);
        let ring_bytes = RING_HEADER_BYTES.checked_add(sizes.ring_capacity.checked_mul(SLOT_BYTES)?)?;
        let file_bytes = rings.checked_add(ring_bytes.checked_mul(Layout::ring_count_of(sizes.core_count))?)?;
        Some(Layout {
            sizes,
            process_block,
            core_blocks,
            core_block_bytes,
            models,
            model_histograms,
            strings,
            instructions,
            comms,
            rings,
            ring_bytes,
            file_bytes,
        })
    }

    fn ring_count_of(core_count: u32) -> u64 {
        1 + 2 * u64::from(core_count)
    }

    /// Byte offset of word `word` of the process block.
    pub(crate) fn process_word(&self, word: u64) -> u64 {
        self.process_block + 8 * word
    }

    /// Byte offset of word `word` of the block of the `slot`-th held core.
    pub(crate) fn core_word(&self, slot: usize, word: u64) -> u64 {
        self.core_blocks + self.core_block_bytes * slot as u64 + 8 * word
    }

    /// Byte offset of bucket `bucket` of a core's device (`total == false`) or total
    /// latency histogram.
    pub(crate) fn histogram_bucket(&self, slot: usize, total: bool, bucket: usize) -> u64 {
        let histogram = u64::from(total) * 8 * u64::from(self.sizes.histogram_buckets);
        self.core_blocks + self.core_block_bytes * slot as u64 + CORE_SCALAR_BYTES + histogram + 8 * bucket as u64
    }

    /// Byte offset of exemplar slot `index` (`exemplar.rs`: the latency slots, then one
    /// per error class) of the `slot`-th held core, after its histograms.
    pub(crate) fn exemplar_slot(&self, slot: usize, index: usize) -> u64 {
        let histograms = round_up_64(CORE_SCALAR_BYTES + 2 * 8 * u64::from(self.sizes.histogram_buckets));
        self.core_blocks + self.core_block_bytes * slot as u64 + histograms + super::exemplar::SLOT_BYTES * index as u64
    }

    pub(crate) fn model_slot(&self, slot: u32) -> u64 {
        self.models + MODEL_SLOT_BYTES * u64::from(slot)
    }

    /// Byte offset of bucket `bucket` of the latency histogram of model slot `slot`.
    pub(crate) fn model_histogram_bucket(&self, slot: u32, bucket: usize) -> u64 {
        self.model_histograms + MODEL_HISTOGRAM_BYTES * u64::from(slot) + 8 * bucket as u64
    }

    /// Byte offset of communicator slot `slot`.
    pub(crate) fn comm_slot(&self, slot: u32) -> u64 {
        self.comms + COMM_SLOT_BYTES * u64::from(slot)
    }

    /// Byte offset of rank `rank`'s row in communicator slot `slot`.
    pub(crate) fn comm_row(&self, slot: u32, rank: u32) -> u64 {
        self.comm_slot(slot) + COMM_HEADER_BYTES + COMM_ROW_BYTES * u64::from(rank)
    }

    /// Byte offset of history entry `entry` of rank `rank` in communicator slot `slot`.
    pub(crate) fn comm_entry(&self, slot: u32, rank: u32, entry: u32) -> u64 {
        let histories = self.comm_slot(slot) + COMM_HEADER_BYTES + COMM_ROW_BYTES * u64::from(COMM_RANKS);
        histories + COMM_ENTRY_BYTES * (u64::from(rank) * u64::from(COMM_HISTORY) + u64::from(entry))
    }

    /// The ring holding system events tied to no core.
    pub(crate) fn host_ring(&self) -> u64 {
        self.rings
    }

    /// The system (`device == false`) or device ring of the `slot`-th held core.
    pub(crate) fn core_ring(&self, slot: usize, device: bool) -> u64 {
        self.rings + self.ring_bytes * (1 + 2 * slot as u64 + u64::from(device))
    }
}

fn round_up_64(n: u64) -> u64 {
    n.div_ceil(64) * 64
}
