//! What a benchmark costs in CPU, read from `/proc`: each process's seconds
//! (every thread, user and system), and the local PostgreSQL's processes.
//!
//! A server in the bench's own process shares its threads with the workers, so
//! the server's share is told apart only where the bench starts it as a process
//! of its own (`--nodes N`). The SQLite writer is one thread whichever process it
//! is in, and all of SQLite's writes go through it: its seconds are read apart,
//! to show how near one core it is.

use std::{collections::HashMap, sync::atomic::Ordering, time::Duration};

use spool_server::store::sqlite::WRITER_THREAD;

use super::{Bench, report::round};

/// The clock ticks of `/proc/<pid>/stat`: Linux reports CPU times in `USER_HZ`,
/// which is 100 on every architecture it exports to userspace.
const USER_HZ: f64 = 100.0;

/// User and system seconds in a `/proc/…/stat` line.
fn stat_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces: count
    // fields after its closing one. utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// CPU seconds (user and system, every thread) process `pid` has used, or
/// `None` where `/proc` cannot say.
fn process_seconds(pid: u32) -> Option<f64> {
    stat_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds used so far by the threads of process `pid` named `name`, or
/// `None` where it has none. `/proc` keeps a thread's name to its first 15 bytes.
fn threads_seconds(pid: u32, name: &str) -> Option<f64> {
    let kept = name.get(..name.len().min(15))?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks
        .filter_map(|task| {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim_end() != kept {
                return None;
            }
            stat_seconds(&std::fs::read_to_string(dir.join("stat")).ok()?)
        })
        .reduce(|a, b| a + b)
}

/// CPU seconds used so far by each process on this machine named `postgres`
/// (the server and its backends), by process id: where the database runs here,
/// its share of the machine is part of what a benchmark costs.
fn local_postgres() -> HashMap<u32, f64> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim_end() == "postgres")
        })
        .filter_map(|pid| Some((pid, process_seconds(pid)?)))
        .collect()
}

/// CPU seconds used so far: by the bench's processes (this one, then the nodes),
/// and by each local PostgreSQL process; and the handler calls that had returned.
pub(super) struct Cpu {
    ours: Vec<Option<f64>>,
    /// The SQLite writer thread's, in each of ours that has one.
    writers: Vec<Option<f64>>,
    postgres: HashMap<u32, f64>,
    handled: usize,
}

impl Bench {
    /// CPU seconds used so far by each process (`None` where it cannot be read),
    /// and by each local PostgreSQL process.
    pub(super) fn cpu(&self) -> Cpu {
        Cpu {
            ours: self
                .processes
                .iter()
                .map(|(_, pid)| process_seconds(*pid))
                .collect(),
            writers: self
                .processes
                .iter()
                .map(|(_, pid)| threads_seconds(*pid, WRITER_THREAD))
                .collect(),
            postgres: local_postgres(),
            handled: self.handled.load(Ordering::Relaxed),
        }
    }

    /// What each process used since `before`, over `wall` seconds: CPU seconds,
    /// the share of one core, and (where activities ran) the seconds per 10,000
    /// of them. Local PostgreSQL processes count as one.
    pub(super) fn cpu_since(&self, before: &Cpu, wall: Duration) -> serde_json::Value {
        let handled = self
            .handled
            .load(Ordering::Relaxed)
            .saturating_sub(before.handled);
        let mut out = serde_json::Map::new();
        let entry = |used: f64| {
            let mut entry = serde_json::json!({
                "seconds": round(used),
                "cores": round(used / wall.as_secs_f64().max(1e-9)),
            });
            if handled > 0 {
                entry["seconds_per_10k"] = round(used * 10_000.0 / handled as f64);
            }
            entry
        };
        for ((name, pid), then) in self.processes.iter().zip(&before.ours) {
            let (Some(then), Some(now)) = (then, process_seconds(*pid)) else {
                continue;
            };
            out.insert(name.clone(), entry(now - then));
        }
        // The one thread every write of a SQLite server goes through: at one
        // core it bounds the server, whatever the process has left.
        for ((name, pid), then) in self.processes.iter().zip(&before.writers) {
            let (Some(then), Some(now)) = (then, threads_seconds(*pid, WRITER_THREAD)) else {
                continue;
            };
            out.insert(format!("{name} SQLite writer"), entry(now - then));
        }
        let postgres: f64 = local_postgres()
            .iter()
            .map(|(pid, now)| now - before.postgres.get(pid).copied().unwrap_or(0.0))
            .sum();
        if !before.postgres.is_empty() {
            out.insert("postgres (local)".to_owned(), entry(postgres));
        }
        serde_json::Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn spin(for_: Duration) {
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < for_ {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        spin(Duration::from_millis(50));
        let used = process_seconds(std::process::id());
        assert!(matches!(used, Some(s) if s > 0.0), "{used:?}");
    }

    /// A thread is found by its full name, though `/proc` keeps only 15 bytes of
    /// it, and a process without such a thread has none to report.
    #[test]
    fn a_named_threads_cpu_is_read_apart() {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        };
        let name = "spool-test-cpu-reader";
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let spinner = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                while !spinning.load(Ordering::Relaxed) {
                    spin(Duration::from_millis(1));
                }
            })
            .unwrap_or_else(|e| panic!("{e}"));
        // CPU time is counted in ticks: wait for the first, however busy the
        // machine.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut used = threads_seconds(std::process::id(), name);
        while !matches!(used, Some(s) if s > 0.0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            used = threads_seconds(std::process::id(), name);
        }
        stop.store(true, Ordering::Relaxed);
        let _ = spinner.join();
        assert!(matches!(used, Some(s) if s > 0.0), "{used:?}");
        assert_eq!(threads_seconds(std::process::id(), "no-such-thread"), None);
    }

    /// The SQLite store's writer runs on a thread of the name the bench reads.
    #[tokio::test]
    async fn the_sqlite_writer_is_found_by_name() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let url = format!("sqlite://{}", dir.path().join("spool.db").display());
        let store = spool_server::store::sqlite::SqliteStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let found = threads_seconds(
            std::process::id(),
            spool_server::store::sqlite::WRITER_THREAD,
        );
        drop(store);
        assert!(
            found.is_some(),
            "no thread named {}",
            spool_server::store::sqlite::WRITER_THREAD
        );
    }
}
