//! Durability on SQLite, as the kernel sees it: a change is acknowledged only
//! after the write-ahead log holding it reached the disk. The server runs under
//! `strace`, which logs each `fsync`/`fdatasync` of the WAL with when it began and
//! how long it took; every acknowledged submit and cancel must have one that began
//! after its request was sent and returned before its answer came back.
//!
//! (SQLite's WAL in `synchronous = FULL` syncs the log at each commit; with
//! `NORMAL` it syncs only at checkpoints, and a power cut after an answer could
//! lose what was answered. This test fails on `NORMAL`.)

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use spool_proto::v1;

use crate::support::*;

/// `strace` attached to every thread of a running process, logging its syncs.
struct Traced {
    strace: Child,
    log: std::path::PathBuf,
}

impl Traced {
    async fn attach(env: &Env, pid: u32) -> Self {
        let log = env.path("syncs.trace");
        let stderr = env.path("strace.stderr");
        let strace = Command::new("strace")
            .args([
                "-f",
                "-ttt",
                "-T",
                "-y",
                "-e",
                "trace=fsync,fdatasync",
                "-o",
            ])
            .arg(&log)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("strace stderr"))
            .spawn()
            .expect("run strace (apt-get install strace)");
        // It says so on stderr once per thread it attached to.
        eventually("strace to attach", || {
            let stderr = stderr.clone();
            async move {
                let said = std::fs::read_to_string(&stderr).ok()?;
                said.contains("attached").then_some(())
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        Self { strace, log }
    }

    /// Detaches, and returns each sync of a file named `*-wal`: (began, returned),
    /// in seconds since the epoch.
    fn wal_syncs(mut self) -> Vec<(f64, f64)> {
        let _ = Command::new("kill")
            .args(["-INT", &self.strace.id().to_string()])
            .status();
        let _ = self.strace.wait();
        let log = std::fs::read_to_string(&self.log).expect("strace log");
        log.lines().filter_map(wal_sync).collect()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

/// `TID 1796597657.354291 fsync(14</d/spool.db-wal>) = 0 <0.000344>`.
fn wal_sync(line: &str) -> Option<(f64, f64)> {
    let mut words = line.split_whitespace();
    let _tid = words.next()?;
    let began: f64 = words.next()?.parse().ok()?;
    let call = words.next()?;
    if !(call.starts_with("fsync(") || call.starts_with("fdatasync(")) || !call.contains("-wal>)") {
        return None;
    }
    let rest: Vec<&str> = words.collect();
    let ["=", "0", took] = rest.as_slice() else {
        return None;
    };
    let took: f64 = took
        .trim_start_matches('<')
        .trim_end_matches('>')
        .parse()
        .ok()?;
    Some((began, began + took))
}

fn wall() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Submits `id`, a row delayed an hour (stored, not run): what it was, and when
/// it was sent and answered.
async fn timed_submit(
    mut client: v1::activity_service_client::ActivityServiceClient<tonic::transport::Channel>,
    id: String,
) -> (String, f64, f64) {
    let sent = wall();
    let delayed = sleep_request(&id, 1, Some(Duration::from_secs(3600)));
    client.submit(delayed).await.expect("submit");
    (format!("submit {id}"), sent, wall())
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_strace), ignore = "needs strace: docs/TESTING.md")]
async fn every_acknowledged_change_was_synced_to_disk_before_its_answer() {
    let env = Env::new();
    let (server, client) = env.serving(&[]).await;
    let traced = Traced::attach(&env, server.pid()).await;

    // (what, sent, answered)
    let mut answered: Vec<(String, f64, f64)> = Vec::new();
    for i in 0..10 {
        answered.push(timed_submit(client.clone(), format!("one-{i}")).await);
    }
    // Concurrent submits share commits (and syncs): each still waits for its own.
    let mut together = tokio::task::JoinSet::new();
    for i in 0..20 {
        together.spawn(timed_submit(client.clone(), format!("many-{i}")));
    }
    while let Some(done) = together.join_next().await {
        answered.push(done.expect("a submit task"));
    }
    for i in 0..5 {
        let mut client = client.clone();
        let sent = wall();
        client
            .cancel(v1::CancelRequest {
                key: Some(key(&format!("one-{i}"))),
                ..Default::default()
            })
            .await
            .expect("cancel");
        answered.push((format!("cancel one-{i}"), sent, wall()));
    }

    let syncs = traced.wal_syncs();
    assert!(!syncs.is_empty(), "no sync of the WAL was seen at all");
    let unsynced: Vec<&str> = answered
        .iter()
        .filter(|(_, sent, answer)| {
            !syncs
                .iter()
                .any(|(began, returned)| began >= sent && returned <= answer)
        })
        .map(|(what, _, _)| what.as_str())
        .collect();
    assert!(
        unsynced.is_empty(),
        "answered with no sync of the WAL in between ({} syncs seen): {unsynced:?}",
        syncs.len()
    );
}
