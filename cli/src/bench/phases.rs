//! The phases: submit, drain, latency and end to end, each measured on its own.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use spool_proto::v1;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    BACKLOG, Bench, Error, Phase,
    load::join_all,
    progress::Progress,
    queue_table,
    report::{percentiles, rate, round},
};

impl Bench {
    /// Runs `--phases` in order, each one's results under its name in `report`.
    pub(super) async fn run_phases(&self, report: &mut serde_json::Value) -> Result<(), Error> {
        for phase in &self.options.phases {
            let cpu_before = self.cpu();
            let started = Instant::now();
            let (name, mut result) = match phase {
                Phase::Submit => ("submit", self.submit_phase().await?),
                Phase::Drain => ("drain", self.drain_phase().await?),
                Phase::Latency => ("latency", self.latency_phase().await?),
                Phase::EndToEnd => ("end_to_end", self.end_to_end_phase().await?),
            };
            // A phase that measures only part of its run (the drain, not the storing
            // of its backlog) reports the CPU of that part itself.
            if result.get("cpu").is_none() {
                result["cpu"] = self.cpu_since(&cpu_before, started.elapsed());
            }
            report[name] = result;
        }
        Ok(())
    }

    async fn submit_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        // One activity per call.
        let next = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start("submit (single)", count, next.clone());
        let started = Instant::now();
        let mut callers = JoinSet::new();
        for caller in 0..self.options.submit_concurrency.max(1) {
            let next = next.clone();
            let mut client = self.client_at(caller);
            let this = self.shallow();
            callers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return Ok::<_, Error>(());
                    }
                    let request = this.submit_request("bench.unserved", "single", i);
                    client.submit(this.request(request)).await?;
                }
            });
        }
        join_all(callers).await?;
        let single = started.elapsed();
        progress.finish();
        let started = Instant::now();
        self.submit_batched("bench.unserved", count, "submit (batched)")
            .await?;
        let batched = started.elapsed();
        Ok(serde_json::json!({
            "single": rate(count, single, serde_json::json!({"concurrency": self.options.submit_concurrency})),
            "batched": rate(count, batched, serde_json::json!({"concurrency": self.options.submit_concurrency, "batch": self.options.batch})),
        }))
    }

    async fn drain_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        let before = self.completed().await?;
        let acked_before = self.acked.count();
        self.submit_batched("bench.drain", count, "drain (backlog)")
            .await?;
        // The CPU of draining alone, not of storing the backlog.
        let cpu_before = self.cpu();
        let started = Instant::now();
        let first = Arc::new(Mutex::new(None::<Instant>));
        let f = first.clone();
        let by_node = self.handled_by_node();
        let stop = self.start_workers(
            "bench.drain",
            Arc::new(move |_| {
                let mut first = f.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(Instant::now);
            }),
        );
        let last = self
            .await_completed(before + count as u64, acked_before, "drain", count)
            .await;
        stop.cancel();
        let last = last?;
        let first = first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ok_or_else(|| Error::Setup("no activity was dispatched".into()))?;
        let took = last.duration_since(first);
        let mut result = rate(
            count,
            took,
            serde_json::json!({"concurrency": self.options.concurrency, "workers": self.options.workers, "per_node": self.per_node_since(&by_node, took)}),
        );
        result["cpu"] = self.cpu_since(&cpu_before, started.elapsed());
        Ok(result)
    }

    async fn latency_phase(&self) -> Result<serde_json::Value, Error> {
        if self.options.backlog > 0 {
            self.submit_batched("bench.latency", self.options.backlog, BACKLOG)
                .await?;
        }
        let handled_before = self.handled.load(Ordering::Relaxed);
        let pickups = Arc::new(Mutex::new(Vec::new()));
        let p = pickups.clone();
        let stop = self.start_workers(
            "bench.latency",
            Arc::new(move |latency| p.lock().unwrap_or_else(|e| e.into_inner()).push(latency)),
        );
        let watcher = self.watched.clone().map(|url| {
            let stop = CancellationToken::new();
            (stop.clone(), tokio::spawn(queue_table::watch(url, stop)))
        });
        // Let the workers connect before the clock starts.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let total = (u64::from(self.options.rate) * self.options.duration.as_millis() as u64 / 1000)
            as usize;
        let sent = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start("latency", total, sent.clone());
        let interval = Duration::from_secs_f64(1.0 / f64::from(self.options.rate.max(1)));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let end_to_end = Arc::new(Mutex::new(Vec::with_capacity(total)));
        let failures = Arc::new(AtomicU64::new(0));
        let mut calls = JoinSet::new();
        let started = Instant::now();
        for i in 0..total {
            ticker.tick().await;
            sent.store(i + 1, Ordering::Relaxed);
            let this = self.shallow();
            let mut client = self.client_at(i);
            let end_to_end = end_to_end.clone();
            let failures = failures.clone();
            calls.spawn(async move {
                let t0 = Instant::now();
                let request = this.submit_request("bench.latency", "latency", i);
                let key = v1::ActivityKey {
                    namespace: request.namespace.clone(),
                    workflow_id: request.workflow_id.clone(),
                    activity_id: request.activity_id.clone(),
                };
                if client.submit(this.request(request)).await.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let waited = client
                    .wait(this.request(v1::WaitRequest {
                        key: Some(key),
                        timeout: Some(spool_proto::duration::to_proto(Duration::from_secs(60))),
                    }))
                    .await;
                match waited {
                    Ok(a) if a.get_ref().status == v1::ActivityStatus::Completed as i32 => {
                        end_to_end
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(t0.elapsed());
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let offered_for = started.elapsed();
        while calls.join_next().await.is_some() {}
        progress.finish();
        stop.cancel();
        let phase = started.elapsed();
        let backlog_drained =
            (self.handled.load(Ordering::Relaxed) - handled_before).saturating_sub(total);
        let pickups = std::mem::take(&mut *pickups.lock().unwrap_or_else(|e| e.into_inner()));
        let end_to_end = std::mem::take(&mut *end_to_end.lock().unwrap_or_else(|e| e.into_inner()));
        let queue_table = match watcher {
            Some((stop, task)) => {
                stop.cancel();
                task.await
                    .map_err(|e| Error::Setup(e.to_string()))?
                    .map_err(Error::Setup)?
            }
            None => serde_json::Value::Null,
        };
        Ok(serde_json::json!({
            "queue_table": queue_table,
            "offered_rate": self.options.rate,
            "achieved_rate": round(end_to_end.len() as f64 / offered_for.as_secs_f64()),
            "activities": total,
            "failed": failures.load(Ordering::Relaxed),
            "pickup_ms": percentiles(pickups),
            "end_to_end_ms": percentiles(end_to_end),
            "backlog": (self.options.backlog > 0).then(|| serde_json::json!({
                "rows": self.options.backlog,
                "drained": backlog_drained,
                "drained_per_second": round(backlog_drained as f64 / phase.as_secs_f64()),
            })),
        }))
    }

    async fn end_to_end_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        let before = self.completed().await?;
        let acked_before = self.acked.count();
        let by_node = self.handled_by_node();
        let stop = self.start_workers("bench.e2e", Arc::new(|_| {}));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        // The completion count draws the progress line.
        let submitting = self.submit_batched("bench.e2e", count, "");
        let completing = self.await_completed(before + count as u64, acked_before, "e2e", count);
        let (submitted, last) = tokio::join!(submitting, completing);
        stop.cancel();
        submitted?;
        let last = last?;
        let took = last.duration_since(started);
        Ok(rate(
            count,
            took,
            serde_json::json!({"concurrency": self.options.concurrency, "workers": self.options.workers, "batch": self.options.batch, "submit_concurrency": self.options.submit_concurrency, "per_node": self.per_node_since(&by_node, took)}),
        ))
    }
}
