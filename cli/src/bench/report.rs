//! The report's numbers: the disk's commit floor they are compared with,
//! percentiles and rates, and the human summary.

use std::time::{Duration, Instant};

use super::Error;

/// The disk's durable-commit floor, measured on a scratch SQLite file the way the
/// server writes (WAL, `synchronous=FULL`), one row per transaction: what a queue
/// without group commit could do here, and the least a durable pickup can take.
pub(super) async fn baseline() -> Result<serde_json::Value, Error> {
    use sqlx::{
        ConnectOptions,
        sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
    };
    const COMMITS: usize = 300;
    let dir = tempfile::tempdir().map_err(|e| Error::Setup(e.to_string()))?;
    let mut conn = SqliteConnectOptions::new()
        .filename(dir.path().join("baseline.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .map_err(|e| Error::Setup(format!("baseline database: {e}")))?;
    let setup = |e: sqlx::Error| Error::Setup(format!("baseline: {e}"));
    sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        .execute(&mut conn)
        .await
        .map_err(setup)?;
    let mut latencies = Vec::with_capacity(COMMITS);
    let started = Instant::now();
    for _ in 0..COMMITS {
        let t = Instant::now();
        sqlx::query("INSERT INTO t (v) VALUES (zeroblob(64))")
            .execute(&mut conn)
            .await
            .map_err(setup)?;
        latencies.push(t.elapsed());
    }
    let took = started.elapsed();
    Ok(serde_json::json!({
        "commits_per_second": round(COMMITS as f64 / took.as_secs_f64()),
        "commit_ms": percentiles(latencies),
    }))
}

/// Each throughput as a multiple of the baseline's commit rate, and each latency
/// percentile as a multiple of one commit, so runs on noisy machines compare.
pub(super) fn add_ratios(report: &mut serde_json::Value) {
    let commits = report["baseline"]["commits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    let commit_p50 = report["baseline"]["commit_ms"]["p50"]
        .as_f64()
        .unwrap_or(0.0);
    if commits <= 0.0 || commit_p50 <= 0.0 {
        return;
    }
    let per_second = |v: &serde_json::Value| v["per_second"].as_f64();
    for path in [["submit", "single"], ["submit", "batched"]] {
        if let Some(x) = per_second(&report[path[0]][path[1]]) {
            report[path[0]][path[1]]["x_baseline"] = round(x / commits);
        }
    }
    for phase in ["drain", "end_to_end"] {
        if let Some(x) = per_second(&report[phase]) {
            report[phase]["x_baseline"] = round(x / commits);
        }
    }
    for key in ["pickup_ms", "end_to_end_ms"] {
        if let Some(p50) = report["latency"][key]["p50"].as_f64() {
            report["latency"][key]["p50_x_commit"] = round(p50 / commit_p50);
        }
    }
}

pub(super) fn rate(
    count: usize,
    took: Duration,
    mut extra: serde_json::Value,
) -> serde_json::Value {
    let seconds = took.as_secs_f64();
    extra["count"] = count.into();
    extra["seconds"] = round(seconds);
    extra["per_second"] = round(count as f64 / seconds.max(1e-9));
    extra
}

pub(super) fn round(x: f64) -> serde_json::Value {
    serde_json::json!((x * 1000.0).round() / 1000.0)
}

pub(super) fn percentiles(mut samples: Vec<Duration>) -> serde_json::Value {
    if samples.is_empty() {
        return serde_json::Value::Null;
    }
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        round(samples[i].as_secs_f64() * 1000.0)
    };
    serde_json::json!({
        "samples": samples.len(),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": at(1.0),
    })
}

/// The human summary of a report.
pub(super) fn summary(report: &serde_json::Value) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "server: {}  database: {}  payload: {} B  preload: {}",
        report["server"].as_str().unwrap_or("?"),
        report["database"].as_str().unwrap_or("?"),
        report["payload_bytes"],
        report["preload"]
    ));
    let b = &report["baseline"];
    line(format!(
        "baseline: {}/s single-row durable commits (p50 {} ms) on this disk",
        b["commits_per_second"], b["commit_ms"]["p50"]
    ));
    if let Some(s) = report.get("submit") {
        line(format!(
            "submit, one per call ({} callers):   {:>9}/s  ({}x baseline)",
            s["single"]["concurrency"], s["single"]["per_second"], s["single"]["x_baseline"]
        ));
        line(format!(
            "submit, batches of {} ({} callers): {:>9}/s  ({}x baseline)",
            s["batched"]["batch"],
            s["batched"]["concurrency"],
            s["batched"]["per_second"],
            s["batched"]["x_baseline"]
        ));
    }
    if let Some(d) = report.get("drain") {
        line(format!(
            "drain {} (concurrency {}):      {:>9}/s  ({}x baseline)",
            d["count"], d["concurrency"], d["per_second"], d["x_baseline"]
        ));
        line(cpu_line(&d["cpu"]));
    }
    if let Some(l) = report.get("latency") {
        line(format!(
            "latency at {}/s offered ({}/s achieved, {} failed):",
            l["offered_rate"], l["achieved_rate"], l["failed"]
        ));
        for (name, key) in [("pickup", "pickup_ms"), ("end to end", "end_to_end_ms")] {
            let p = &l[key];
            line(format!(
                "  {name:<10} p50 {} ms  p90 {} ms  p99 {} ms  max {} ms",
                p["p50"], p["p90"], p["p99"], p["max"]
            ));
        }
    }
    if let Some(e) = report.get("end_to_end") {
        line(format!(
            "end to end {} (submit + run + record): {:>9}/s  ({}x baseline)",
            e["count"], e["per_second"], e["x_baseline"]
        ));
        line(cpu_line(&e["cpu"]));
    }
    out
}

/// A phase's CPU seconds per 10,000 activities, by process.
fn cpu_line(cpu: &serde_json::Value) -> String {
    let Some(parts) = cpu.as_object() else {
        return "  CPU: not measured".to_owned();
    };
    let shown: Vec<String> = parts
        .iter()
        .filter(|(_, used)| used["seconds"].as_f64().is_some_and(|s| s > 0.0))
        .filter_map(|(name, used)| Some(format!("{name} {} s", used.get("seconds_per_10k")?)))
        .collect();
    format!("  CPU per 10,000 activities: {}", shown.join(", "))
}
