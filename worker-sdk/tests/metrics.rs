//! The SDK's metrics, read through a recorder installed for this test process:
//! tasks received, handler run times by outcome, and reconnects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;

/// Running totals: a snapshot takes what it reads (counters and histograms start
/// over), so each one is added to what earlier ones read.
#[derive(Default)]
struct Totals(Vec<Sample>);

/// A metric's name, its labels, and what one snapshot read of it.
type Sample = (String, Vec<(String, String)>, u64);

impl Totals {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => continue,
            };
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            self.0.push((key.key().name().to_owned(), labels, n));
        }
    }

    /// The total of `name` over the samples carrying every label of `labels`.
    fn of(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, n)| n)
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_handler_times_and_reconnects_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test process");

    let server = spool_server::testing::TestServer::start().await.unwrap();
    let stop = CancellationToken::new();
    let worker = Worker::new(server.endpoint())
        .activity("ok", |_, input| async move { Ok(input) })
        .activity("bad", |_, _| async move {
            Err(ActivityError::terminal("Bad", "always"))
        });
    let running = tokio::spawn(worker.run(stop.clone()));
    let client = spool_client::Client::builder(server.endpoint())
        .connect()
        .await
        .unwrap();
    for (ty, id) in [("ok", "a"), ("ok", "b"), ("bad", "c")] {
        client
            .submit(spool_proto::v1::SubmitRequest {
                activity_type: ty.into(),
                workflow_id: "w".into(),
                activity_id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    for id in ["a", "b", "c"] {
        let key = spool_proto::v1::ActivityKey {
            namespace: "default".into(),
            workflow_id: "w".into(),
            activity_id: id.into(),
        };
        client
            .wait(key, Some(Duration::from_secs(10)))
            .await
            .unwrap();
    }

    // A worker whose server is not there retries its connection, and counts it.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let lonely = Worker::new(nowhere)
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(20))
        .activity("ok", |_, input| async move { Ok(input) });
    let stop_lonely = CancellationToken::new();
    let lonely = tokio::spawn(lonely.run(stop_lonely.clone()));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut totals = Totals::default();
    loop {
        totals.take(&snapshotter);
        let received = totals.of(
            "spool_worker_tasks_received_total",
            &[("activity_type", "ok")],
        );
        let reconnects = totals.of("spool_worker_reconnects_total", &[]);
        if received >= 2 && reconnects >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "received {received}, reconnects {reconnects}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        totals.of(
            "spool_worker_tasks_received_total",
            &[("activity_type", "ok")]
        ),
        2
    );
    assert_eq!(
        totals.of(
            "spool_worker_tasks_received_total",
            &[("activity_type", "bad")]
        ),
        1
    );
    let handled = |ty, outcome| {
        totals.of(
            "spool_worker_handler_seconds",
            &[("activity_type", ty), ("outcome", outcome)],
        )
    };
    assert_eq!(handled("ok", "completed"), 2);
    assert_eq!(handled("bad", "failed"), 1);
    assert_eq!(handled("ok", "failed"), 0);
    assert_eq!(
        totals.of("spool_worker_pickup_seconds", &[("activity_type", "ok")]),
        2
    );
    stop_lonely.cancel();
    lonely.await.unwrap().unwrap();
    stop.cancel();
    running.await.unwrap().unwrap();
}
