//! Prometheus metrics, served at `/metrics` on `--metrics-listen` when set.
//!
//! Names (all prefixed `spool_`): counters `submitted_total`, `dispatched_total`,
//! `finished_total{transition}` (completed, retried, snoozed, failed, released),
//! `results_refused_total`, `cancelled_total`, `workers_lost_total`,
//! `timeouts_total{kind}`, `commit_batches_total`, `commit_ops_total`,
//! `commit_failures_total`, `rows_unreadable_total{read}` (stored rows a read left
//! out because they cannot be decoded), `connections_refused_total{reason}`;
//! histogram `commit_seconds` (one write transaction); gauges `workers_connected`,
//! `attempts_running`, `connections_open`.
//!
//! Without `--metrics-listen` no recorder is installed and every update is a no-op.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Installs the process-wide recorder and starts the HTTP listener. Call once, from
/// the binary, inside the runtime.
pub fn serve(addr: SocketAddr) -> Result<(), metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&[
            0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
        ])?
        .install()
}

pub fn submitted(n: u64) {
    metrics::counter!("spool_submitted_total").increment(n);
}

pub fn dispatched(n: u64) {
    metrics::counter!("spool_dispatched_total").increment(n);
}

pub fn finished(transition: &'static str) {
    metrics::counter!("spool_finished_total", "transition" => transition).increment(1);
}

pub fn result_refused() {
    metrics::counter!("spool_results_refused_total").increment(1);
}

pub fn cancelled() {
    metrics::counter!("spool_cancelled_total").increment(1);
}

pub fn worker_lost() {
    metrics::counter!("spool_workers_lost_total").increment(1);
}

pub fn timed_out(kind: &'static str) {
    metrics::counter!("spool_timeouts_total", "kind" => kind).increment(1);
}

pub fn commit(ops: usize, seconds: f64, ok: bool) {
    metrics::counter!("spool_commit_batches_total").increment(1);
    metrics::counter!("spool_commit_ops_total").increment(ops as u64);
    metrics::histogram!("spool_commit_seconds").record(seconds);
    if !ok {
        metrics::counter!("spool_commit_failures_total").increment(1);
    }
}

pub fn liveness(workers: usize, running: usize) {
    metrics::gauge!("spool_workers_connected").set(workers as f64);
    metrics::gauge!("spool_attempts_running").set(running as f64);
}

pub fn row_unreadable(read: &'static str) {
    metrics::counter!("spool_rows_unreadable_total", "read" => read).increment(1);
}

pub fn connections_refused(reason: &'static str) {
    metrics::counter!("spool_connections_refused_total", "reason" => reason).increment(1);
}

pub fn connection_opened() {
    metrics::gauge!("spool_connections_open").increment(1.0);
}

pub fn connection_closed() {
    metrics::gauge!("spool_connections_open").decrement(1.0);
}
