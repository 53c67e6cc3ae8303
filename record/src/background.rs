//! A recording of a process's own runtime, drained by a background thread: what
//! `nrt_profile_start` and `neuron_virt.profile` write. The thread drains the rings
//! every [`DRAIN_INTERVAL`] (so they do not overwrite what the file needs) and flushes
//! the file every [`FLUSH_INTERVAL`](crate::FLUSH_INTERVAL); finishing drains what is
//! left and writes the index.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;

use neuron_datastore::{DatastoreReader, Tail};

use crate::{DRAIN_INTERVAL, RecordError, Recorder, Result};

/// A recording running on its own thread until [`BackgroundRecording::finish`].
#[derive(Debug)]
pub struct BackgroundRecording {
    stop: Sender<()>,
    drainer: JoinHandle<Result<ntff::WriteSummary>>,
}

impl BackgroundRecording {
    /// Starts draining what `tail` reads from `reader` into `recorder`, with the models
    /// of the runtime as they are loaded.
    pub fn start(
        reader: DatastoreReader,
        tail: Tail,
        recorder: Recorder<ntff::ProfileFile>,
    ) -> std::io::Result<BackgroundRecording> {
        let (stop, stopped) = channel();
        let drainer = std::thread::Builder::new()
            .name("neuron-record".into())
            .spawn(move || drain(reader, tail, recorder, &stopped))?;
        Ok(BackgroundRecording { stop, drainer })
    }

    /// Drains what is left, finishes the file and says what it holds.
    pub fn finish(self) -> Result<ntff::WriteSummary> {
        let _ = self.stop.send(());
        self.drainer.join().map_err(|_| RecordError::Thread)?
    }
}

fn drain(
    reader: DatastoreReader,
    mut tail: Tail,
    mut recorder: Recorder<ntff::ProfileFile>,
    stopped: &Receiver<()>,
) -> Result<ntff::WriteSummary> {
    loop {
        recorder.models(&reader.models(), &|_| String::new())?;
        let last = !matches!(stopped.recv_timeout(DRAIN_INTERVAL), Err(RecvTimeoutError::Timeout));
        recorder.drain(&reader, &mut tail, last)?;
        if last {
            let (file, summary) = recorder.finish()?;
            file.place()?;
            return Ok(summary);
        }
        recorder.flush_when_due()?;
    }
}
