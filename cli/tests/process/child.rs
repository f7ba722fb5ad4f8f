//! The worker process: an SDK worker whose handlers log what they do to a file,
//! one line per event (`start ID ATTEMPT`, `done ID ATTEMPT`), so the test can see
//! what ran where even after it killed or froze this process.

use std::{io::Write, time::Duration};

use spool_worker::{Payload, Worker};

pub const CONFIG_ENV: &str = "SPOOL_TEST_WORKER_CONFIG";

fn log(path: &str, line: String) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the worker log");
    // One write per line with O_APPEND: lines never interleave.
    file.write_all(format!("{line}\n").as_bytes())
        .expect("write the worker log");
}

pub fn run(config: &str) {
    let config: serde_json::Value = serde_json::from_str(config).expect("worker config");
    let server = config["server"].as_str().expect("server").to_owned();
    let log_path = config["log"].as_str().expect("log").to_owned();
    let concurrency = config["concurrency"].as_u64().expect("concurrency") as u32;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("info")
        .init();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let sleep_log = log_path.clone();
    let forever_log = log_path;
    let result = runtime.block_on(
        Worker::new(server)
            .max_concurrency(concurrency)
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
            .activity("sleep", move |ctx, input: Payload| {
                let log_path = sleep_log.clone();
                async move {
                    let info = ctx.info().clone();
                    let input: serde_json::Value =
                        serde_json::from_slice(&input.data).unwrap_or_default();
                    log(
                        &log_path,
                        format!("start {} {}", info.activity_id, info.attempt),
                    );
                    // Deliberately deaf to cancellation: it models work that cannot stop.
                    tokio::time::sleep(Duration::from_millis(input["ms"].as_u64().unwrap_or(0)))
                        .await;
                    log(
                        &log_path,
                        format!("done {} {}", info.activity_id, info.attempt),
                    );
                    spool_worker::json(&serde_json::json!({
                        "pid": std::process::id(),
                        "attempt": info.attempt,
                    }))
                }
            })
            .activity("forever", move |ctx, _| {
                let log_path = forever_log.clone();
                async move {
                    let info = ctx.info().clone();
                    log(
                        &log_path,
                        format!("start {} {}", info.activity_id, info.attempt),
                    );
                    std::future::pending::<()>().await;
                    Ok(Payload::default())
                }
            })
            // SIGTERM: finish what runs, report it, exit 0 (a deploy's stop).
            .run_until_signal(),
    );
    if let Err(e) = result {
        eprintln!("worker stopped: {e}");
        std::process::exit(1);
    }
}
