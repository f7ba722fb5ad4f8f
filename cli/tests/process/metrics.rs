//! `--metrics-listen`: Prometheus text at `/metrics`, counting what happened.

use std::time::Duration;

use spool_proto::v1;
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

/// The value of the sample of `metric` carrying every label of `labels`.
fn sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A known workload, then one scrape: every family is described and says what
/// happened, by namespace and type.
#[tokio::test(flavor = "multi_thread")]
async fn each_family_reads_what_a_known_workload_did() {
    let env = Env::new();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let (server, mut client) = env
        .serving(&["--metrics-listen", &metrics_addr, "--node-name", "node-m"])
        .await;
    let _worker = observed_worker(&server);
    server.await_workers(&mut client, 1).await;
    for id in ["e1", "e2"] {
        submit(&mut client, quick_retry_request("echo", id, 3)).await;
    }
    submit(&mut client, quick_retry_request("flaky", "f", 5)).await;
    submit(&mut client, quick_retry_request("poison", "p", 5)).await;
    let mut later = quick_retry_request("echo", "later", 3);
    later.delay = Some(spool_proto::duration::to_proto(Duration::from_secs(3600)));
    submit(&mut client, later).await;
    for id in ["i1", "i2", "i3"] {
        submit(&mut client, quick_retry_request("idle", id, 3)).await;
    }
    // Limits on a type nobody serves: a full bucket, no keys in use.
    server
        .set_rate_limit("idle", 7, Duration::from_secs(1))
        .await;
    server.set_concurrency_limit("idle", 3).await;
    client
        .cancel(v1::CancelRequest {
            key: Some(key("i3")),
            reason: "not needed".into(),
        })
        .await
        .expect("cancel");
    for id in ["e1", "e2", "f", "p"] {
        wait(&mut client, id).await;
    }

    // The gauges are read from the store every 5 s.
    let text = eventually("the backlog gauges to be refreshed", || {
        let addr = metrics_addr.clone();
        async move {
            let text = scrape(&addr).await?;
            let due = sample(
                &text,
                "spool_backlog",
                &[("activity_type", "idle"), ("state", "due")],
            );
            let dead = sample(&text, "spool_dead_letters", &[("activity_type", "poison")]);
            let available = sample(
                &text,
                "spool_rate_limit_available",
                &[("activity_type", "idle")],
            );
            (due == Some(2.0) && dead == Some(1.0) && available == Some(7.0)).then_some(text)
        }
    })
    .await;

    for (family, kind) in [
        ("spool_build_info", "gauge"),
        ("spool_backlog", "gauge"),
        ("spool_running", "gauge"),
        ("spool_dead_letters", "gauge"),
        ("spool_pickup_seconds", "histogram"),
        ("spool_run_seconds", "histogram"),
        ("spool_outcomes_total", "counter"),
        ("spool_worker_slots", "gauge"),
        ("spool_rate_limit_available", "gauge"),
        ("spool_limit_held", "gauge"),
        ("spool_concurrency_keys", "gauge"),
        ("spool_concurrency_running", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} has no HELP:\n{text}"
        );
        assert!(
            text.contains(&format!("# TYPE {family} {kind}")),
            "{family} is not a {kind}:\n{text}"
        );
    }
    let ns = ("namespace", "default");
    let of = |ty: &'static str| [ns, ("activity_type", ty)];
    for limit in ["rate", "concurrency"] {
        assert_eq!(
            sample(
                &text,
                "spool_limit_held",
                &[ns, ("activity_type", "idle"), ("limit", limit)]
            ),
            Some(0.0),
            "a full bucket and no key hold nothing back: {text}"
        );
    }
    assert_eq!(
        sample(&text, "spool_concurrency_keys", &of("idle")),
        Some(0.0)
    );
    let outcome = |ty: &'static str, outcome: &'static str| {
        sample(
            &text,
            "spool_outcomes_total",
            &[ns, ("activity_type", ty), ("outcome", outcome)],
        )
    };
    assert_eq!(
        sample(
            &text,
            "spool_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "spool_backlog",
            &[ns, ("activity_type", "echo"), ("state", "delayed")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "spool_backlog",
            &[ns, ("activity_type", "idle"), ("state", "delayed")]
        ),
        Some(0.0)
    );
    assert_eq!(sample(&text, "spool_running", &of("idle")), Some(0.0));
    assert_eq!(outcome("echo", "completed"), Some(2.0), "{text}");
    assert_eq!(outcome("flaky", "retried"), Some(2.0), "{text}");
    assert_eq!(outcome("flaky", "completed"), Some(1.0));
    assert_eq!(outcome("poison", "failed"), Some(1.0));
    assert_eq!(outcome("poison", "dead_lettered"), Some(1.0));
    assert_eq!(outcome("idle", "cancelled"), Some(1.0));
    assert_eq!(
        outcome("echo", "retried"),
        None,
        "nothing that did not happen"
    );
    // Each attempt was picked up once and ran once.
    for (family, activity_type, attempts) in [
        ("spool_pickup_seconds_count", "echo", 2.0),
        ("spool_pickup_seconds_count", "flaky", 3.0),
        ("spool_run_seconds_count", "flaky", 3.0),
        ("spool_run_seconds_count", "poison", 1.0),
    ] {
        assert_eq!(
            sample(&text, family, &of(activity_type)),
            Some(attempts),
            "{family} of {activity_type}"
        );
    }
    let group = [ns, ("group", "echo+flaky+poison")];
    assert_eq!(
        sample(
            &text,
            "spool_worker_slots",
            &[group[0], group[1], ("state", "used")]
        ),
        Some(0.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "spool_worker_slots",
            &[group[0], group[1], ("state", "free")]
        )
        .is_some_and(|free| free >= 1.0),
        "{text}"
    );
}
