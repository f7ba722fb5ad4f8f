//! What an operator reads back: an activity's attempt history over the API and in
//! `spool get --history`, and the CLI's bulk re-drive and cancel by filter.

use spool_proto::v1;

use crate::cli::{spool, stdout};
use crate::support::*;

/// Two failures, then success: three records, in order, with who ran each, on
/// which node, and why the first two failed, the same over the API and the CLI.
#[tokio::test(flavor = "multi_thread")]
async fn a_three_attempt_history_reads_the_same_in_the_api_and_the_cli() {
    let env = Env::new();
    let (server, mut client) = env.serving(&["--node-name", "node-h"]).await;
    let _worker = observed_worker(&server);
    submit(&mut client, quick_retry_request("flaky", "f", 5)).await;
    let done = wait(&mut client, "f").await;
    assert_eq!(status(&done), v1::ActivityStatus::Completed);
    assert!(done.history.is_empty(), "only when asked");

    let got = client
        .get(v1::GetRequest {
            key: Some(key("f")),
            include_history: true,
        })
        .await
        .expect("get")
        .into_inner();
    let outcomes: Vec<(u32, &str)> = got
        .history
        .iter()
        .map(|h| (h.attempt, h.outcome.as_str()))
        .collect();
    assert_eq!(outcomes, [(1, "retried"), (2, "retried"), (3, "completed")]);
    for h in &got.history {
        assert_eq!(
            (h.identity.as_str(), h.node.as_str()),
            ("observed", "node-h")
        );
        assert!(!h.worker_id.is_empty());
        let (started, ended) = (h.started_at.expect("start"), h.ended_at.expect("end"));
        assert!(
            (ended.seconds, ended.nanos) >= (started.seconds, started.nanos),
            "attempt {} ends after it starts",
            h.attempt
        );
    }
    let errors: Vec<Option<(&str, &str)>> = got
        .history
        .iter()
        .map(|h| {
            h.error
                .as_ref()
                .map(|e| (e.r#type.as_str(), e.message.as_str()))
        })
        .collect();
    assert_eq!(
        errors,
        [
            Some(("Flaky", "attempt 1 fails")),
            Some(("Flaky", "attempt 2 fails")),
            None
        ]
    );

    let out = spool(&env, &["get", "p/f", "--history", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let history = json["history"].as_array().expect("a history array");
    let cli: Vec<(u64, &str, &str, &str)> = history
        .iter()
        .map(|h| {
            (
                h["attempt"].as_u64().unwrap_or(0),
                h["outcome"].as_str().unwrap_or(""),
                h["node"].as_str().unwrap_or(""),
                h["error"]["message"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        cli,
        [
            (1, "retried", "node-h", "attempt 1 fails"),
            (2, "retried", "node-h", "attempt 2 fails"),
            (3, "completed", "node-h", ""),
        ]
    );
    let out = spool(&env, &["get", "p/f", "--history"]).await;
    let text = stdout(&out);
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("ATTEMPT"))
        .skip(1)
        .collect();
    assert_rows_say(
        &rows,
        &[
            &["retried", "Flaky"],
            &["retried"],
            &["completed", "observed@node-h"],
        ],
    );
}

/// `retry --all` re-drives every dead letter matching the filter and leaves the
/// others; `cancel --all --dry-run` changes nothing; `cancel --all` cancels what
/// waits.
#[tokio::test(flavor = "multi_thread")]
async fn bulk_retry_and_cancel_act_on_what_the_filter_matches() {
    let env = Env::new();
    let (server, mut client) = env.serving(&[]).await;
    let worker = observed_worker(&server);
    for id in ["p1", "p2"] {
        submit(&mut client, quick_retry_request("poison", id, 5)).await;
    }
    submit(&mut client, quick_retry_request("flaky", "f1", 1)).await;
    for id in ["p1", "p2", "f1"] {
        assert_eq!(
            status(&wait(&mut client, id).await),
            v1::ActivityStatus::Failed
        );
    }

    let out = spool(&env, &["retry", "--all", "--type", "poison"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("re-drive: 2 of 2 done"),
        "{}",
        stdout(&out)
    );
    for id in ["p1", "p2"] {
        assert_eq!(
            status(&wait(&mut client, id).await),
            v1::ActivityStatus::Completed
        );
    }
    assert_eq!(
        status(&get(&mut client, "f1").await),
        v1::ActivityStatus::Failed,
        "another type is left alone"
    );

    drop(worker);
    for id in ["w1", "w2"] {
        submit(&mut client, quick_retry_request("idle", id, 3)).await;
    }
    let out = spool(&env, &["cancel", "--all", "--type", "idle", "--dry-run"]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    assert_eq!(
        status(&get(&mut client, "w1").await),
        v1::ActivityStatus::Scheduled
    );
    let out = spool(
        &env,
        &["cancel", "--all", "--type", "idle", "--reason", "cleanup"],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    for id in ["w1", "w2"] {
        let a = get(&mut client, id).await;
        assert_eq!(status(&a), v1::ActivityStatus::Cancelled);
        assert_eq!(a.last_error.map(|e| e.message), Some("cleanup".into()));
    }
    let out = spool(&env, &["retry"]).await;
    assert!(!out.status.success(), "a key or --all is required");
}
