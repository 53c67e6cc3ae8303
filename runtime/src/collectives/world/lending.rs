//! Lending: a rank's input and output tensors read where they lie by the ranks of other
//! processes of this host.
//!
//! Even through the outbox, an all-reduce between processes copies each rank's input
//! once more than in one process (into the outbox), and reads what the peers sent as a
//! whole. When a rank's tensors are in shared memory (a large device tensor of a
//! process of a job: [`MIN_BYTES`]), it instead sends each peer of its host only their
//! places ([`Body::Lent`](super::wire::Body::Lent)); the peer maps them here, read-only,
//! and the all-reduce runs by parts (`remote.rs`): each rank sums its own part of
//! every input into its output, then copies the other parts from the outputs of the
//! ranks that summed them. Neither side of a pair that lent returns before the other
//! said it is done with its memory, so a lent tensor is never changed while read.
//!
//! A receiver keeps each peer's mapped tensors for later calls (training loops
//! all-reduce the same buffers at every step), at most [`MAPPED_PER_PEER`], and lets one
//! go at the first message from the peer after its owner freed it.

use std::sync::Arc;

use crate::shared_memory::{PeerMemory, SharedPlace};

/// Device tensors from this size on are in shared memory in a job of several processes.
pub(crate) const MIN_BYTES: u64 = 1 << 20;
/// How many tensors of one peer a receiver keeps mapped.
const MAPPED_PER_PEER: usize = 16;

/// A peer's input and output tensors, lent for one operation and mapped here.
#[derive(Debug)]
pub(crate) struct LentTensors {
    input: (Arc<PeerMemory>, SharedPlace),
    output: (Arc<PeerMemory>, SharedPlace),
}

impl LentTensors {
    pub(crate) fn input(&self) -> &[u8] {
        self.input.0.bytes(&self.input.1).unwrap_or_default()
    }

    /// The peer's output: a part of it may be read once the peer said it is final.
    pub(crate) fn output(&self) -> &[u8] {
        self.output.0.bytes(&self.output.1).unwrap_or_default()
    }
}

/// The tensors of one peer process mapped here (by its link's reader).
#[derive(Debug, Default)]
pub(crate) struct PeerTensors {
    mapped: Vec<Arc<PeerMemory>>,
}

impl PeerTensors {
    /// Lets go of the tensors their owner freed (at every message from the peer).
    pub(crate) fn let_go_of_freed(&mut self) {
        self.mapped.retain(|memory| !memory.released());
    }

    /// The tensors at `input` and `output`, mapped on first use.
    pub(crate) fn receive(&mut self, input: SharedPlace, output: SharedPlace) -> std::io::Result<LentTensors> {
        Ok(LentTensors { input: (self.map(input)?, input), output: (self.map(output)?, output) })
    }

    fn map(&mut self, place: SharedPlace) -> std::io::Result<Arc<PeerMemory>> {
        let memory = match self.mapped.iter().position(|m| m.is(&place)) {
            Some(at) => self.mapped.remove(at),
            None => Arc::new(PeerMemory::open(place)?),
        };
        if memory.bytes(&place).is_none() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a lent tensor outside its memory"));
        }
        if self.mapped.len() == MAPPED_PER_PEER {
            self.mapped.remove(0);
        }
        self.mapped.push(Arc::clone(&memory));
        Ok(memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_memory::SharedMemory;

    #[test]
    fn lent_tensors_are_mapped_once_and_let_go_when_their_owner_frees_them() {
        let mut input = SharedMemory::create("test", 1, 4096).expect("memfd");
        let output = SharedMemory::create("test", 2, 4096).expect("memfd");
        input.bytes_mut()[..3].copy_from_slice(&[1, 2, 3]);
        let mut peer = PeerTensors::default();
        let lent = peer.receive(input.place(0, 3), output.place(0, 4096)).expect("maps");
        assert_eq!(lent.input(), [1, 2, 3]);
        assert_eq!(lent.output().len(), 4096);
        let again = peer.receive(input.place(1, 2), output.place(0, 4096)).expect("maps");
        assert!(Arc::ptr_eq(&lent.input.0, &again.input.0), "mapped once");
        assert_eq!(again.input(), [2, 3]);
        assert_eq!(peer.mapped.len(), 2);
        drop(input);
        peer.let_go_of_freed();
        let other = SharedMemory::create("test", 3, 4096).expect("memfd");
        peer.receive(other.place(0, 1), output.place(0, 1)).expect("maps");
        assert_eq!(peer.mapped.len(), 2, "the freed input is let go");
        assert!(peer.mapped.iter().all(|m| !m.released()));
    }
}
