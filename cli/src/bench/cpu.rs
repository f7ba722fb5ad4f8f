//! What a benchmark costs in CPU, read from `/proc`: each process's seconds
//! (every thread, user and system), and the local PostgreSQL's processes.
//!
//! A server in the bench's own process shares its threads with the workers, so
//! the server's share is told apart only where the bench starts it as a process
//! of its own (`--nodes N`).

use std::collections::HashMap;

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
pub fn process_seconds(pid: u32) -> Option<f64> {
    stat_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds used so far by each process on this machine named `postgres`
/// (the server and its backends), by process id: where the database runs here,
/// its share of the machine is part of what a benchmark costs.
pub fn local_postgres() -> HashMap<u32, f64> {
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
}
