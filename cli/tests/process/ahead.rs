//! Rows claimed ahead (RUNNING for a busy worker, not yet sent to it) through a
//! crash and a drain: after kill -9 each runs once after the restart; on SIGTERM
//! each goes back SCHEDULED, uncounted.

use std::{collections::BTreeSet, time::Duration};

use spool_proto::v1::{self, ActivityStatus};
use tonic::transport::Channel;

use spool_proto::v1::activity_service_client::ActivityServiceClient;

use crate::support::*;

/// Quick activities, then slow ones, all stored before the worker connects: the
/// quick ones' results make the server claim ahead for the worker, so when the
/// slow ones fill its slots more slow ones wait ahead of it.
const QUICK: usize = 40;
const SLOW: usize = 8;
const SLOTS: u32 = 4;
const SLOW_MS: u64 = 3_000;

async fn submit_quick_then_slow(client: &mut ActivityServiceClient<Channel>) {
    let activities = (0..QUICK)
        .map(|i| sleep_request(&format!("quick{i:02}"), 0, None))
        .chain((0..SLOW).map(|i| sleep_request(&format!("slow{i}"), SLOW_MS, None)))
        .collect();
    client
        .submit_batch(v1::SubmitBatchRequest { activities })
        .await
        .expect("submit");
}

/// Once the worker's slots all run slow activities and the server holds rows
/// ahead for it: the ids of the rows claimed ahead (RUNNING in the store, never
/// started by the worker).
async fn rows_ahead(
    client: &mut ActivityServiceClient<Channel>,
    worker: &WorkerProcess,
) -> BTreeSet<String> {
    eventually_for(
        Duration::from_secs(20),
        "slow ones running, others ahead",
        || {
            let mut client = client.clone();
            let log = worker.log();
            async move {
                let slow_started = (0..SLOW)
                    .filter(|i| !log.attempts("start", &format!("slow{i}")).is_empty())
                    .count();
                if slow_started < SLOTS as usize {
                    return None;
                }
                let stats = client
                    .stats(v1::StatsRequest::default())
                    .await
                    .ok()?
                    .into_inner();
                (stats.claimed_ahead > 0).then_some(())
            }
        },
    )
    .await;
    let log = worker.log();
    let ahead: BTreeSet<String> = list_all(client)
        .await
        .into_iter()
        .filter(|a| status(a) == ActivityStatus::Running)
        .map(|a| a.key.map(|k| k.activity_id).unwrap_or_default())
        .filter(|id| log.attempts("start", id).is_empty())
        .collect();
    assert!(
        !ahead.is_empty(),
        "rows claimed ahead are RUNNING, not started"
    );
    assert!(
        ahead.iter().all(|id| id.starts_with("slow")),
        "only slow rows wait: {ahead:?}"
    );
    ahead
}

/// kill -9 while rows are claimed ahead: at the restart they are reclaimed with
/// the running ones, and each runs once and completes once; nothing is lost.
#[tokio::test]
async fn kill_9_with_rows_claimed_ahead_runs_each_once_after_the_restart() {
    let env = Env::new();
    let args = ["--heartbeat-interval", "1s", "--lease-timeout", "120s"];
    let (mut server, mut client) = env.serving(&args).await;
    submit_quick_then_slow(&mut client).await;
    let worker = env.worker(SLOTS);
    let ahead = rows_ahead(&mut client, &worker).await;
    server.kill_9();
    let log_at_kill = worker.log();
    for id in &ahead {
        assert!(
            log_at_kill.attempts("start", id).is_empty(),
            "{id} was sent before the kill"
        );
    }

    let (_server, mut client) = env.serving(&args).await;
    await_completed(&client, QUICK + SLOW, Duration::from_secs(40)).await;
    let log = worker.log();
    for activity in list_all(&mut client).await {
        let id = activity.key.as_ref().unwrap().activity_id.clone();
        assert_eq!(status(&activity), ActivityStatus::Completed, "{id}");
        let output: serde_json::Value =
            serde_json::from_slice(&activity.output.as_ref().unwrap().data).unwrap();
        assert_eq!(
            output["attempt"], activity.attempt,
            "{id}: the accepted result is the final attempt's"
        );
        if ahead.contains(&id) {
            assert_eq!(
                (log.attempts("start", &id), log.attempts("done", &id)),
                (vec![activity.attempt], vec![activity.attempt]),
                "{id}, claimed ahead at the kill, ran once after the restart"
            );
        }
    }
}

/// SIGTERM while rows are claimed ahead: the drain lets the running ones finish
/// and gives the rows ahead back, SCHEDULED and uncounted; nothing has failed, and
/// they run after the restart.
#[tokio::test]
async fn sigterm_with_rows_claimed_ahead_releases_them_uncounted() {
    let env = Env::new();
    let (mut server, mut client) = env.serving(&["--drain-timeout", "10s"]).await;
    submit_quick_then_slow(&mut client).await;
    let mut worker = env.worker(SLOTS);
    let ahead = rows_ahead(&mut client, &worker).await;
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(10 + 2)).await, Some(0));
    worker.kill_9();

    let (server, mut client) = env.serving(&[]).await;
    let all = list_all(&mut client).await;
    assert_eq!(all.len(), QUICK + SLOW, "nothing lost");
    for activity in &all {
        let id = activity.key.as_ref().unwrap().activity_id.clone();
        assert_ne!(status(activity), ActivityStatus::Failed, "{id}");
        assert!(
            activity.last_error.is_none(),
            "{id}: {:?}",
            activity.last_error
        );
        if ahead.contains(&id) {
            assert_eq!(
                (status(activity), activity.counted_attempts),
                (ActivityStatus::Scheduled, 0),
                "{id}, claimed ahead, went back uncounted"
            );
        }
    }
    let again = env.worker(SLOTS);
    server.await_workers(&mut client, 1).await;
    await_completed(&client, QUICK + SLOW, Duration::from_secs(30)).await;
    drop(again);
}
