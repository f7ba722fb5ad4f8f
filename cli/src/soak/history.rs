//! The soak's history: what every client was told and what every worker saw, as
//! JSON lines. Workers append one line per event with a single `write` on a file
//! opened for appending, so a line written before a `kill -9` is kept whole.
//!
//! Times are wall-clock milliseconds since the Unix epoch, the clock the server
//! stamps `started_at`/`finished_at` with on this machine.

use std::{
    io::{BufRead, Write},
    path::Path,
    sync::Mutex,
};

use serde::{Deserialize, Serialize};

/// One line of a worker's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// A task reached a handler.
    Start {
        k: String,
        n: u32,
        w: String,
        t: i64,
    },
    /// The server answered a result: accepted (`ok`) or refused.
    Ack {
        k: String,
        n: u32,
        ok: bool,
        w: String,
        t: i64,
    },
}

/// What the driver did and was told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum DriverEvent {
    /// A submit was acknowledged (OK, or ALREADY_EXISTS for a retried one).
    Submitted { k: String, once: bool, t: i64 },
    /// A submit whose outcome is unknown: every try failed.
    Unknown { k: String, t: i64 },
    /// A fault, from its injection to the end of its recovery.
    Fault {
        kind: String,
        target: String,
        t: i64,
        until: i64,
    },
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, spool_proto::time::millis)
}

/// An append-only JSON-lines file; each line goes out in one `write`.
pub struct Log {
    file: Mutex<std::fs::File>,
}

impl Log {
    pub fn create(path: &Path) -> std::io::Result<Log> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Log {
            file: Mutex::new(file),
        })
    }

    pub fn write<T: Serialize>(&self, event: &T) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = self
            .file
            .lock()
            .map_err(|_| std::io::Error::other("history lock poisoned"))?;
        file.write_all(&line)
    }
}

/// Reads a JSON-lines file. A torn last line (a writer killed mid-write, which a
/// single small `write` makes unlikely) is skipped; any other bad line is an error.
pub fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Vec<T>> {
    let file = std::fs::File::open(path)?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()?;
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(event) => events.push(event),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "{}:{}: {e}",
                    path.display(),
                    i + 1
                )));
            }
        }
    }
    Ok(events)
}

/// The driver's history: in memory for the checker, and on disk for a reader.
pub(super) struct Events {
    list: Mutex<Vec<DriverEvent>>,
    log: Log,
}

impl Events {
    pub(super) fn create(path: &Path) -> std::io::Result<Events> {
        Ok(Events {
            list: Mutex::new(Vec::new()),
            log: Log::create(path)?,
        })
    }

    pub(super) fn push(&self, event: DriverEvent) {
        let _ = self.log.write(&event);
        if let Ok(mut list) = self.list.lock() {
            list.push(event);
        }
    }

    pub(super) fn take(&self) -> Vec<DriverEvent> {
        self.list
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Faults injected and submits acknowledged so far.
    pub(super) fn counts(&self) -> (usize, usize) {
        self.list
            .lock()
            .map(|l| {
                let faults = l
                    .iter()
                    .filter(|e| matches!(e, DriverEvent::Fault { .. }))
                    .count();
                let acked = l
                    .iter()
                    .filter(|e| matches!(e, DriverEvent::Submitted { .. }))
                    .count();
                (faults, acked)
            })
            .unwrap_or_default()
    }
}

/// Every worker's history in the run directory `dir`.
pub(super) fn read_workers(dir: &Path) -> std::io::Result<Vec<WorkerEvent>> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("history-") && name.ends_with(".jsonl") {
            events.extend(read::<WorkerEvent>(&path)?);
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("h.jsonl");
        let log = Log::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let events = vec![
            WorkerEvent::Start {
                k: "a".into(),
                n: 1,
                w: "w0.0".into(),
                t: 5,
            },
            WorkerEvent::Ack {
                k: "a".into(),
                n: 1,
                ok: true,
                w: "w0.0".into(),
                t: 6,
            },
        ];
        for e in &events {
            log.write(e).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"ev\":\"sta"))
            .unwrap_or_else(|e| panic!("{e}"));
        let back: Vec<WorkerEvent> = read(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, events);
    }
}
