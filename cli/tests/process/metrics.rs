//! `--metrics-listen`: Prometheus text at `/metrics`, counting what happened.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

async fn scrape(addr: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

fn value(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_submits_dispatches_and_outcomes() {
    let env = Env::new();
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let server = env.server(&[
        "--metrics-listen",
        &metrics_addr,
        "--heartbeat-interval",
        "200ms",
    ]);
    let mut client = server.client().await;
    let _worker = in_process_worker(&server, "sleep");
    for i in 0..3 {
        submit(&mut client, sleep_request(&format!("m{i}"), 0, None)).await;
    }
    for i in 0..3 {
        wait(&mut client, &format!("m{i}")).await;
    }
    let text = eventually("metrics to show three completions", || {
        let addr = metrics_addr.clone();
        async move {
            let text = scrape(&addr).await?;
            let done = value(&text, "spool_finished_total{transition=\"completed\"}") == Some(3.0);
            // The gauges are refreshed by the liveness sweep, every 50 ms here.
            let seen = value(&text, "spool_workers_connected") == Some(1.0);
            (done && seen).then_some(text)
        }
    })
    .await;
    assert_eq!(value(&text, "spool_submitted_total"), Some(3.0), "{text}");
    assert_eq!(value(&text, "spool_dispatched_total"), Some(3.0), "{text}");
    assert!(
        value(&text, "spool_commit_batches_total").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    assert!(text.contains("spool_commit_seconds_bucket"), "{text}");
}
