//! A soak worker process: an SDK worker whose handler sleeps as long as the
//! activity's input says, and logs every task it starts and every ack it gets.
//! Its output names this incarnation and the attempt, so the checker can tell
//! whose result the store kept.

use std::{path::PathBuf, sync::Arc, time::Duration};

use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;

use super::{
    ACTIVITY_TYPE, NAMESPACE,
    history::{Log, WorkerEvent, now_ms},
};

#[derive(Debug, Clone)]
pub struct Options {
    pub server: String,
    pub history: PathBuf,
    /// This incarnation's name: the worker slot and how many times it was started.
    pub identity: String,
    pub concurrency: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Input {
    pub ms: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Output {
    pub by: String,
    pub attempt: u32,
}

/// Appends `event`, or ends the process: a history with a hole in it would make
/// the whole run meaningless.
fn record(log: &Log, event: &WorkerEvent) {
    if let Err(e) = log.write(event) {
        eprintln!("soak worker: cannot write the history: {e}");
        std::process::exit(70);
    }
}

pub async fn run(options: Options) -> anyhow::Result<()> {
    let log = Arc::new(Log::create(&options.history)?);
    let identity = options.identity.clone();
    let acks = log.clone();
    let acked_by = identity.clone();
    let worker = Worker::new(options.server)
        .namespace(NAMESPACE)
        .identity(identity.clone())
        .max_concurrency(options.concurrency)
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .on_ack(move |ack| {
            let event = WorkerEvent::Ack {
                k: ack.activity_id.clone(),
                n: ack.attempt,
                ok: ack.accepted,
                w: acked_by.clone(),
                t: now_ms(),
            };
            record(&acks, &event);
        })
        .activity(ACTIVITY_TYPE, move |ctx, input| {
            let log = log.clone();
            let identity = identity.clone();
            async move {
                let info = ctx.info();
                let event = WorkerEvent::Start {
                    k: info.activity_id.clone(),
                    n: info.attempt,
                    w: identity.clone(),
                    t: now_ms(),
                };
                record(&log, &event);
                let Input { ms } = serde_json::from_slice(&input.data)
                    .map_err(|e| ActivityError::terminal("BadInput", e.to_string()))?;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = ctx.cancelled() => {
                        return Err(ActivityError::retryable("Cancelled", "the server cancelled this attempt"));
                    }
                }
                spool_worker::json(&Output {
                    by: identity,
                    attempt: info.attempt,
                })
            }
        });
    worker.run(CancellationToken::new()).await?;
    Ok(())
}
