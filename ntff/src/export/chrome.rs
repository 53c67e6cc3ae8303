//! The Chrome JSON encoder: `{"traceEvents": [...]}` with `B`/`E` slices, `i`
//! instants, `C` counters, `s`/`f` flows and `M` names, timestamps in microseconds.
//!
//! The format has no track groups: engine, queue and counter tracks become named
//! pseudo-threads of their process, their names prefixed with their group's.

use std::io::Write;

use super::{Annotation, AnnotationValue, Name, Sink, Track, TrackIx, TrackKind};

/// Thread ids of tracks that are not host threads start here.
const PSEUDO_TID: u64 = 1 << 31;

#[derive(Debug, Clone)]
enum Place {
    /// Slices and instants on (pid, tid).
    Thread {
        pid: u32,
        tid: u64,
    },
    /// A counter of process `pid`, by name.
    Counter {
        pid: u32,
        name: String,
    },
    None,
}

#[derive(Debug)]
pub(crate) struct ChromeSink<W: Write> {
    out: std::io::BufWriter<W>,
    places: Vec<Place>,
    /// Names of tracks, for prefixing their children's, and which are groups.
    names: Vec<String>,
    groups: Vec<bool>,
    first: bool,
    bytes: u64,
}

impl<W: Write> ChromeSink<W> {
    pub(crate) fn new(out: W) -> ChromeSink<W> {
        ChromeSink {
            out: std::io::BufWriter::with_capacity(1 << 20, out),
            places: Vec::new(),
            names: Vec::new(),
            groups: Vec::new(),
            first: true,
            bytes: 0,
        }
    }

    /// Starts the next event object: `{` after a separator.
    fn event(&mut self) -> std::io::Result<()> {
        let sep: &[u8] = if self.first { b"\n{" } else { b",\n{" };
        self.first = false;
        self.write(sep)
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    fn string(&mut self, s: &str) -> std::io::Result<()> {
        let text = serde_json::to_string(s).map_err(std::io::Error::other)?;
        self.write(text.as_bytes())
    }

    fn thread(&self, track: TrackIx) -> std::io::Result<(u32, u64)> {
        match self.places.get(track as usize) {
            Some(Place::Thread { pid, tid }) => Ok((*pid, *tid)),
            _ => Err(std::io::Error::other(format!("track {track} takes no slices"))),
        }
    }

    /// `"ph":"X","pid":…,"tid":…,"ts":…` without braces.
    fn head(&mut self, phase: &str, pid: u32, tid: u64, ts: u64) -> std::io::Result<()> {
        let text = format!("\"ph\":\"{phase}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{}", micros(ts));
        self.write(text.as_bytes())
    }

    fn args(&mut self, args: &[Annotation<'_>]) -> std::io::Result<()> {
        if args.is_empty() {
            return Ok(());
        }
        self.write(b",\"args\":{")?;
        for (k, arg) in args.iter().enumerate() {
            if k > 0 {
                self.write(b",")?;
            }
            self.string(arg.key_text)?;
            self.write(b":")?;
            match arg.value {
                AnnotationValue::U64(v) => self.write(v.to_string().as_bytes())?,
                AnnotationValue::I64(v) => self.write(v.to_string().as_bytes())?,
                AnnotationValue::Str(_, s) => self.string(s)?,
            }
        }
        self.write(b"}")
    }

    /// A metadata event; `value` is written as it is (JSON).
    fn metadata(&mut self, kind: &str, pid: u32, tid: u64, key: &str, value: &str) -> std::io::Result<()> {
        self.event()?;
        self.write(
            format!("\"ph\":\"M\",\"name\":\"{kind}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"{key}\":").as_bytes(),
        )?;
        self.write(value.as_bytes())?;
        self.write(b"}}")
    }

    fn name_metadata(&mut self, kind: &str, pid: u32, tid: u64, name: &str) -> std::io::Result<()> {
        let name = serde_json::to_string(name).map_err(std::io::Error::other)?;
        self.metadata(kind, pid, tid, "name", &name)
    }

    fn flow(&mut self, phase: &str, pid: u32, tid: u64, ts: u64, id: u64) -> std::io::Result<()> {
        self.event()?;
        self.head(phase, pid, tid, ts)?;
        let binding = if phase == "f" { ",\"bp\":\"e\"" } else { "" };
        self.write(format!(",\"name\":\"execution\",\"cat\":\"flow\",\"id\":\"0x{id:x}\"{binding}}}").as_bytes())
    }
}

impl<W: Write> Sink for ChromeSink<W> {
    type Out = W;

    fn start(&mut self, _start: u64, _realtime: Option<i64>) -> std::io::Result<()> {
        self.write(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")
    }

    fn track(&mut self, track: &Track) -> std::io::Result<()> {
        let group = track.parent.filter(|&p| self.groups.get(p as usize).copied().unwrap_or(false));
        let full = match group.map(|p| &self.names[p as usize]) {
            Some(parent) => format!("{parent} {}", track.name()),
            None => track.name().to_string(),
        };
        let place = match &track.kind {
            TrackKind::Process { pid, name, .. } => {
                self.name_metadata("process_name", *pid, 0, name)?;
                Place::None
            }
            TrackKind::Thread { pid, tid, name } => {
                self.name_metadata("thread_name", *pid, u64::from(*tid), name)?;
                Place::Thread { pid: *pid, tid: u64::from(*tid) }
            }
            TrackKind::Group { .. } => Place::None,
            TrackKind::Slices { .. } => {
                let tid = PSEUDO_TID + u64::from(track.ix);
                self.name_metadata("thread_name", track.pid, tid, &full)?;
                let rank = (i64::from(track.parent.unwrap_or(0)) << 16) + i64::from(track.rank);
                self.metadata("thread_sort_index", track.pid, tid, "sort_index", &rank.to_string())?;
                Place::Thread { pid: track.pid, tid }
            }
            TrackKind::Counter { .. } => Place::Counter { pid: track.pid, name: full.clone() },
        };
        let ix = track.ix as usize;
        if self.places.len() <= ix {
            self.places.resize(ix + 1, Place::None);
            self.names.resize(ix + 1, String::new());
            self.groups.resize(ix + 1, false);
        }
        self.places[ix] = place;
        self.names[ix] = full;
        self.groups[ix] = matches!(track.kind, TrackKind::Group { .. });
        Ok(())
    }

    fn begin(
        &mut self,
        track: TrackIx,
        ts: u64,
        name: Name<'_>,
        args: &[Annotation<'_>],
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> std::io::Result<()> {
        let (pid, tid) = self.thread(track)?;
        self.event()?;
        self.head("B", pid, tid, ts)?;
        self.write(b",\"name\":")?;
        self.string(name.text)?;
        self.args(args)?;
        self.write(b"}")?;
        if let Some(id) = flow_out {
            self.flow("s", pid, tid, ts, id)?;
        }
        if let Some(id) = flow_in {
            self.flow("f", pid, tid, ts, id)?;
        }
        Ok(())
    }

    fn end(&mut self, track: TrackIx, ts: u64) -> std::io::Result<()> {
        let (pid, tid) = self.thread(track)?;
        self.event()?;
        self.head("E", pid, tid, ts)?;
        self.write(b"}")
    }

    fn instant(&mut self, track: TrackIx, ts: u64, name: Name<'_>, args: &[Annotation<'_>]) -> std::io::Result<()> {
        let (pid, tid) = self.thread(track)?;
        self.event()?;
        self.head("i", pid, tid, ts)?;
        self.write(b",\"s\":\"t\",\"name\":")?;
        self.string(name.text)?;
        self.args(args)?;
        self.write(b"}")
    }

    fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> std::io::Result<()> {
        let Some(Place::Counter { pid, name }) = self.places.get(track as usize).cloned() else {
            return Err(std::io::Error::other(format!("track {track} is not a counter")));
        };
        self.event()?;
        self.write(format!("\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"name\":", micros(ts)).as_bytes())?;
        self.string(&name)?;
        let value = if value.is_finite() { value } else { 0.0 };
        self.write(format!(",\"args\":{{\"value\":{value}}}}}").as_bytes())
    }

    fn dropped(&mut self, _track: TrackIx, _reasons: u32) {
        // The format has no loss marker; the "events lost" counters show it.
    }

    fn finish(mut self) -> std::io::Result<(W, u64)> {
        self.write(b"\n]}\n")?;
        self.out.flush()?;
        let out = self.out.into_inner().map_err(|e| e.into_error())?;
        Ok((out, self.bytes))
    }
}

/// Nanoseconds as microseconds with three decimals, exactly.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}
