//! What the dashboard's benchmarks share: the device program their generated profiles
//! run.

use ntff::{Descriptor, DescriptorId, Writer};

/// The descriptors of `count` instructions and transfers cycling through `program`
/// (engine or `DMA`, opcode or queue, length in ns), each with its length.
pub(crate) fn program_descriptors<W: std::io::Write>(
    w: &mut Writer<W>,
    program: &[(&str, &str, u64)],
    count: usize,
) -> Vec<(DescriptorId, u64)> {
    (0..count)
        .map(|k| {
            let (engine, op, ns) = program[k % program.len()];
            let d = if engine == "DMA" {
                Descriptor::Dma { model_id: 1, queue: w.intern(op), index: k as u32, bytes: 1 << 16 }
            } else {
                Descriptor::Instruction {
                    model_id: 1,
                    engine: w.intern(engine),
                    opcode: w.intern(op),
                    hlo: w.intern(&format!("fusion.{}", k / 3)),
                    step: k as u32,
                    flops: 1 << 20,
                    bytes_read: 1 << 14,
                    bytes_written: 1 << 14,
                }
            };
            (w.descriptor(&d), ns)
        })
        .collect()
}
