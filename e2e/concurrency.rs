//! Concurrency keys: at most the type's limit of the activities sharing a key run
//! at once, over all workers and nodes, and every one of them completes.
//! Fairness keys: one tenant's backlog does not hold back another's rows, and
//! weights given at submit share the claims.

use std::{sync::Arc, time::Duration};

use spool_proto::v1::{self, ActivityStatus, admin_service_client::AdminServiceClient};
use tonic::transport::Channel;

use crate::harness::*;

/// A worker with room for 10 whose activity of type `t` holds its slot 30 ms,
/// counting how many of key `k` run at once.
fn counting_worker(server: &TestServer, keyed: Arc<Gauge>) -> WorkerGuard {
    server.worker(move |w| {
        w.max_concurrency(10).activity("t", move |_, input| {
            let keyed = keyed.clone();
            async move {
                let hold = tokio::time::sleep(Duration::from_millis(30));
                if input.data.starts_with(br#"{"id":"k"#) {
                    keyed.counted(hold).await;
                } else {
                    hold.await;
                }
                spool_worker::json(&"done")
            }
        })
    })
}

/// Sets `limit`, answering it as stored.
async fn set_limit(server: &TestServer, limit: v1::ConcurrencyLimit) -> v1::ConcurrencyLimit {
    server
        .admin()
        .await
        .set_concurrency_limit(v1::SetConcurrencyLimitRequest {
            concurrency_limit: Some(limit),
        })
        .await
        .unwrap()
        .into_inner()
        .concurrency_limit
        .unwrap()
}

/// Every concurrency limit, with its current use.
async fn concurrency_limits(admin: &mut AdminServiceClient<Channel>) -> Vec<v1::ConcurrencyLimit> {
    admin
        .list_concurrency_limits(v1::ListConcurrencyLimitsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .concurrency_limits
}

async fn limit_two(server: &TestServer) {
    let set = set_limit(
        server,
        v1::ConcurrencyLimit {
            activity_type: "t".into(),
            max_running: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!((set.namespace.as_str(), set.max_running), ("default", 2));
}

/// 20 rows of key "customer-1" and 10 without a key; all complete.
async fn submit_and_wait(server: &TestServer) {
    let mut client = server.client().await;
    let activities = (0..20)
        .map(|i| {
            let mut req = request("t", "wf", &format!("k{i}"));
            req.concurrency_key = "customer-1".into();
            req
        })
        .chain((0..10).map(|i| request("t", "wf", &format!("free{i}"))))
        .collect();
    client
        .submit_batch(v1::SubmitBatchRequest { activities })
        .await
        .unwrap();
    for i in 0..20 {
        let done = wait(&mut client, key("wf", &format!("k{i}"))).await;
        assert_eq!(status(&done), ActivityStatus::Completed);
        assert_eq!(done.concurrency_key, "customer-1");
    }
    for i in 0..10 {
        let done = wait(&mut client, key("wf", &format!("free{i}"))).await;
        assert_eq!(status(&done), ActivityStatus::Completed);
    }
}

#[tokio::test]
async fn a_key_never_runs_more_than_its_limit() {
    let server = TestServer::start().await;
    limit_two(&server).await;
    let keyed = Arc::new(Gauge::default());
    let _worker = counting_worker(&server, keyed.clone());
    server.await_workers(1).await;
    submit_and_wait(&server).await;
    assert_eq!(keyed.most(), 2, "at most 2 at once, and the limit was used");
    let limits = concurrency_limits(&mut server.admin().await).await;
    assert_eq!(
        (limits.len(), limits[0].keys, limits[0].running),
        (1, 0, 0),
        "a key with nothing left is forgotten"
    );
}

#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn two_nodes_keep_one_limit() {
    let (a, b) = TestServer::two_on_postgres().await;
    limit_two(&a).await;
    let keyed = Arc::new(Gauge::default());
    let _on_a = counting_worker(&a, keyed.clone());
    let _on_b = counting_worker(&b, keyed.clone());
    a.await_workers(1).await;
    b.await_workers(1).await;
    submit_and_wait(&a).await;
    assert_eq!(keyed.most(), 2);
}

#[tokio::test]
async fn concurrency_limits_refuse_what_cannot_be_enforced() {
    let server = TestServer::start().await;
    let mut admin = server.admin().await;
    for (max_running, activity_type, says) in [
        (0, "t", "max_running is 0"),
        (2_000_000, "t", "max_running is 2000000"),
        (2, "", "activity_type is required"),
    ] {
        invalid(
            admin
                .set_concurrency_limit(v1::SetConcurrencyLimitRequest {
                    concurrency_limit: Some(v1::ConcurrencyLimit {
                        activity_type: activity_type.into(),
                        max_running,
                        ..Default::default()
                    }),
                })
                .await,
            says,
        );
    }
    // What is set for one key: its limit (0, the type's) and weight, never a
    // strategy of its own; a weight only for a key.
    for (concurrency_key, max_running, weight, strategy, says) in [
        ("", 2, 3, 0, "weight is one key's: give its concurrency_key"),
        (
            "k",
            0,
            1_001,
            0,
            "weight is 1001; it must be from 1 to 1000",
        ),
        (
            "k",
            2_000_000,
            1,
            0,
            "max_running is 2000000; it must be from 0",
        ),
        ("k", 1, 1, 2, "strategy is the type's"),
        ("a\u{7}b", 1, 1, 0, "concurrency_key"),
    ] {
        invalid(
            admin
                .set_concurrency_limit(v1::SetConcurrencyLimitRequest {
                    concurrency_limit: Some(v1::ConcurrencyLimit {
                        activity_type: "t".into(),
                        concurrency_key: concurrency_key.into(),
                        max_running,
                        weight,
                        strategy,
                        ..Default::default()
                    }),
                })
                .await,
            says,
        );
    }
    let listed = concurrency_limits(&mut admin).await;
    assert!(listed.is_empty(), "nothing refused was stored: {listed:?}");

    let mut client = server.client().await;
    let mut bad = request("t", "wf", "x");
    bad.concurrency_key = "a\u{7}b".into();
    let err = client.submit(bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("concurrency_key"),
        "{}",
        err.message()
    );

    // Get says why a due row waits.
    limit_two(&server).await;
    for id in ["c0", "c1", "c2"] {
        let mut req = request("t", "wf", id);
        req.concurrency_key = "c".into();
        submit(&mut client, req).await;
    }
    let mut raw = RawWorker::connect(&server, &["t"], 5).await;
    let held = [raw.task().await, raw.task().await];
    let waiting = row_when(&client, key("wf", "c2"), "c2 held back", |c2| {
        !c2.waiting_reason.is_empty()
    })
    .await;
    assert_eq!(status(&waiting), ActivityStatus::Scheduled);
    assert_eq!(
        waiting.waiting_reason,
        r#"concurrency limited: 2 of key "c" run, and t allows 2 per key"#
    );
    assert!(
        held.iter().all(|t| t.activity_id != "c2"),
        "the oldest two run"
    );
    let running = get(&mut client, key("wf", &held[0].activity_id)).await;
    assert_eq!(
        running.waiting_reason, "",
        "only waiting rows have a reason"
    );
    let limits = concurrency_limits(&mut admin).await;
    assert_eq!((limits[0].keys, limits[0].running), (1, 2));
    drop(raw);

    let delete = || v1::DeleteConcurrencyLimitRequest {
        activity_type: "t".into(),
        ..Default::default()
    };
    let deleted = |d: v1::DeleteConcurrencyLimitResponse| d.deleted;
    assert!(deleted(
        admin
            .delete_concurrency_limit(delete())
            .await
            .unwrap()
            .into_inner()
    ));
    assert!(!deleted(
        admin
            .delete_concurrency_limit(delete())
            .await
            .unwrap()
            .into_inner()
    ));
}

#[tokio::test]
async fn strategies_cancel_the_newest_or_the_oldest() {
    let server = TestServer::start().await;
    let mut admin = server.admin().await;
    let limit = |strategy: v1::ConcurrencyStrategy| v1::SetConcurrencyLimitRequest {
        concurrency_limit: Some(v1::ConcurrencyLimit {
            activity_type: "t".into(),
            max_running: 2,
            strategy: strategy as i32,
            ..Default::default()
        }),
    };
    let mut client = server.client().await;
    let submit_keyed = |id: &'static str| {
        let mut client = client.clone();
        async move {
            let mut req = request("t", "wf", id);
            req.concurrency_key = "k".into();
            submit(&mut client, req).await.activity.unwrap()
        }
    };

    // Cancel newest: a third waiting one is cancelled as it comes, and says so.
    admin
        .set_concurrency_limit(limit(v1::ConcurrencyStrategy::CancelNewest))
        .await
        .unwrap();
    submit_keyed("n0").await;
    submit_keyed("n1").await;
    let newest = submit_keyed("n2").await;
    assert_eq!(status(&newest), ActivityStatus::Cancelled);
    assert!(
        newest
            .last_error
            .as_ref()
            .is_some_and(|e| e.message.contains("(cancel newest)")),
        "{newest:?}"
    );

    // Cancel in progress: the oldest running one is cancelled for the newcomer,
    // and its worker is told to stop.
    let mut raw = RawWorker::connect(&server, &["t"], 5).await;
    let first = raw.task().await;
    let second = raw.task().await;
    let mut ran = [first.activity_id.clone(), second.activity_id.clone()];
    ran.sort();
    assert_eq!(ran, ["n0", "n1"]);
    admin
        .set_concurrency_limit(limit(v1::ConcurrencyStrategy::CancelInProgress))
        .await
        .unwrap();
    let newcomer = submit_keyed("p0").await;
    assert_eq!(status(&newcomer), ActivityStatus::Scheduled);
    // The cancel of the oldest, and the newcomer in the room it left (in either
    // order).
    let (started, cancelled) = raw.task_and_cancel().await;
    assert_eq!(cancelled.activity_id, "n0", "the oldest");
    assert_eq!(started.activity_id, "p0", "the newcomer runs");
    assert!(
        cancelled.reason.contains("(cancel in progress)"),
        "{}",
        cancelled.reason
    );
    let oldest = get(&mut client, key("wf", "n0")).await;
    assert_eq!(status(&oldest), ActivityStatus::Cancelled);
    let listed = concurrency_limits(&mut admin).await;
    assert_eq!(
        listed[0].strategy,
        v1::ConcurrencyStrategy::CancelInProgress as i32
    );
}

/// Keys are served in turn: while one key's backlog drains, a row of another key
/// is picked up at the next claim, not after the backlog. (Without keys the same
/// row would wait for every row before it.)
#[tokio::test]
async fn a_backlog_of_one_key_does_not_hold_back_another() {
    a_backlog_does_not_hold_back_another_tenant(|req, tenant| {
        req.concurrency_key = tenant.into();
    })
    .await;
}

/// The same with fairness keys, which hold nothing back and only order the rows.
#[tokio::test]
async fn a_backlog_of_one_fairness_key_does_not_hold_back_another() {
    a_backlog_does_not_hold_back_another_tenant(|req, tenant| {
        req.fairness_key = tenant.into();
    })
    .await;
}

/// Tenant a's backlog of 5,000 rows, then tenant b's rows one at a time, each
/// given its tenant by `tenant`: b's rows start within 500 ms.
async fn a_backlog_does_not_hold_back_another_tenant(tenant: fn(&mut v1::SubmitRequest, &str)) {
    let (server, client) = TestServer::serving().await;
    let activities = (0..5_000)
        .map(|i| {
            let mut req = request("t", "wf", &format!("a{i}"));
            tenant(&mut req, "tenant-a");
            req
        })
        .collect::<Vec<_>>();
    for chunk in activities.chunks(500) {
        client
            .clone()
            .submit_batch(v1::SubmitBatchRequest {
                activities: chunk.to_vec(),
            })
            .await
            .unwrap();
    }
    // 10 slots, 5 ms a row: the backlog takes 2.5 s at least. B's pickup is when
    // its handler starts, as the worker sees it (polling Get would add Get's own
    // time to it).
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let _worker = server.worker(move |w| {
        w.max_concurrency(10).activity("t", move |ctx, _| {
            if ctx.info().activity_id.starts_with('b') {
                let _ = started.send((ctx.info().activity_id.clone(), tokio::time::Instant::now()));
            }
            async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                spool_worker::json(&"done")
            }
        })
    });
    server.await_workers(1).await;
    let mut waits = Vec::new();
    for i in 0..10 {
        let mut req = request("t", "wf", &format!("b{i}"));
        tenant(&mut req, "tenant-b");
        let mut client = client.clone();
        let submitted = tokio::time::Instant::now();
        submit(&mut client, req).await;
        let (id, at) = tokio::time::timeout(WAIT, starts.recv())
            .await
            .expect("b's row started")
            .expect("the worker is running");
        assert_eq!(id, format!("b{i}"));
        waits.push(at.duration_since(submitted));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a_left = get(&mut client.clone(), key("wf", "a4999")).await;
    assert_eq!(
        status(&a_left),
        ActivityStatus::Scheduled,
        "the backlog was still there: the test measured what it meant to"
    );
    waits.sort();
    assert!(
        waits[waits.len() - 1] < Duration::from_millis(500),
        "b's rows waited {waits:?} beside a's backlog"
    );
}

#[tokio::test]
async fn a_heavier_key_is_served_more_often() {
    let server = TestServer::start().await;
    let mut admin = server.admin().await;
    let set = set_limit(
        &server,
        v1::ConcurrencyLimit {
            activity_type: "t".into(),
            concurrency_key: "heavy".into(),
            weight: 3,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (set.concurrency_key.as_str(), set.max_running, set.weight),
        ("heavy", 0, 3)
    );
    let Served {
        heavy,
        raw: _worker,
        next: task,
        ..
    } = serve_40(&server, |req, k| req.concurrency_key = k.into()).await;
    assert!(
        (28..=32).contains(&heavy),
        "weights 3 and 1: the heavy key ran {heavy} of 40"
    );
    // The key's use is its RUNNING rows: the one the worker holds, and any
    // claimed ahead for it.
    let client = server.client().await;
    let running = eventually("the heavy key's use to match its running rows", || {
        let (mut admin, mut client) = (admin.clone(), client.clone());
        async move {
            let limits = concurrency_limits(&mut admin).await;
            assert_eq!(limits.len(), 1, "{limits:?}");
            assert_eq!(limits[0].keys, 1);
            let heavy_running = client
                .list(v1::ListRequest {
                    status: ActivityStatus::Running.into(),
                    activity_type: "t".into(),
                    page_size: 100,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .activities
                .iter()
                .filter(|a| a.concurrency_key == "heavy")
                .count();
            (limits[0].running == heavy_running as u64).then_some(heavy_running)
        }
    })
    .await;
    assert!(
        running >= usize::from(task.activity_id.starts_with("heavy")),
        "{running} running"
    );
    let deleted = admin
        .delete_concurrency_limit(v1::DeleteConcurrencyLimitRequest {
            activity_type: "t".into(),
            concurrency_key: "heavy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .deleted;
    assert!(deleted);
}

/// Fairness weights are given at submit: one slot, rows of weight 3 and of
/// weight 1 waiting together, three of the first for each of the second.
#[tokio::test]
async fn a_heavier_fairness_key_is_served_more_often() {
    let server = TestServer::start().await;
    let (heavy, served) = heavy_share_of_40(&server, 3, 1).await;
    let got = get(&mut server.client().await, key("wf", "heavy-0")).await;
    assert_eq!(got.fairness_key, "heavy");
    assert!(
        (29..=31).contains(&heavy),
        "weights 3 and 1: the heavy key ran {heavy} of 40: {served:?}"
    );
}

/// What a worker of one slot served of 60 rows of key "heavy" and 60 of
/// "light": 40 of them, one at a time, each claim taking one row from the key
/// whose turn it is.
struct Served {
    ids: Vec<String>,
    /// How many of `ids` are the heavy key's.
    heavy: usize,
    raw: RawWorker,
    /// The task that came after the 40, still running.
    next: v1::ActivityTask,
}

/// Submits the rows at once (`keyed` sets a request's key), then serves 40.
async fn serve_40(server: &TestServer, keyed: impl Fn(&mut v1::SubmitRequest, &str)) -> Served {
    let activities = ["heavy", "light"]
        .into_iter()
        .flat_map(|k| (0..60).map(move |i| (k, request("t", "wf", &format!("{k}-{i}")))))
        .map(|(k, mut req)| {
            keyed(&mut req, k);
            req
        })
        .collect();
    server
        .client()
        .await
        .submit_batch(v1::SubmitBatchRequest { activities })
        .await
        .unwrap();
    let mut raw = RawWorker::connect(server, &["t"], 1).await;
    let (ids, next) = raw.serve_one_at_a_time(40).await;
    let heavy = ids.iter().filter(|id| id.starts_with("heavy")).count();
    Served {
        ids,
        heavy,
        raw,
        next,
    }
}

/// [`serve_40`] with fairness keys of these weights: how many of the heavy
/// key's ran, and the order.
async fn heavy_share_of_40(server: &TestServer, heavy: u32, light: u32) -> (usize, Vec<String>) {
    let served = serve_40(server, |req, k| {
        req.fairness_key = k.into();
        req.fairness_weight = if k == "heavy" { heavy } else { light };
    })
    .await;
    (served.heavy, served.ids)
}

/// A weight an operator sets for a fairness key replaces the weights its rows
/// are submitted with: one slot, rows of two keys submitted with weights the
/// other way round, the key set to weight 3 served three times as often.
/// Every fairness weight, with its key's waiting activities.
async fn fairness_weights(admin: &mut AdminServiceClient<Channel>) -> Vec<v1::FairnessWeight> {
    admin
        .list_fairness_weights(v1::ListFairnessWeightsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .fairness_weights
}

#[tokio::test]
async fn a_fairness_weight_set_by_an_operator_replaces_the_rows_own() {
    let server = TestServer::start().await;
    let mut admin = server.admin().await;
    let weight = |key: &str, weight: u32| v1::SetFairnessWeightRequest {
        fairness_weight: Some(v1::FairnessWeight {
            activity_type: "t".into(),
            fairness_key: key.into(),
            weight,
            ..Default::default()
        }),
    };
    let set = admin
        .set_fairness_weight(weight("heavy", 3))
        .await
        .unwrap()
        .into_inner()
        .fairness_weight
        .unwrap();
    assert_eq!((set.namespace.as_str(), set.weight), ("default", 3));
    // The light key's rows say 5, but the operator says 1.
    admin.set_fairness_weight(weight("light", 1)).await.unwrap();
    let listed = fairness_weights(&mut admin).await;
    let listed: Vec<(&str, u32)> = listed
        .iter()
        .map(|w| (w.fairness_key.as_str(), w.weight))
        .collect();
    assert_eq!(listed, [("heavy", 3), ("light", 1)]);

    let (heavy, served) = heavy_share_of_40(&server, 0, 5).await;
    assert!(
        (29..=31).contains(&heavy),
        "weights 3 and 1 set: the heavy key ran {heavy} of 40: {served:?}"
    );

    let delete = || v1::DeleteFairnessWeightRequest {
        activity_type: "t".into(),
        fairness_key: "light".into(),
        ..Default::default()
    };
    let deleted = admin.delete_fairness_weight(delete()).await.unwrap();
    assert!(deleted.into_inner().deleted);
    let again = admin.delete_fairness_weight(delete()).await.unwrap();
    assert!(!again.into_inner().deleted, "nothing left to delete");
}

/// A weight set through one node places the rows another node accepts.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_fairness_weight_set_on_one_node_holds_on_another() {
    let (a, b) = TestServer::two_on_postgres().await;
    for (key, weight) in [("heavy", 3), ("light", 1)] {
        a.admin()
            .await
            .set_fairness_weight(v1::SetFairnessWeightRequest {
                fairness_weight: Some(v1::FairnessWeight {
                    activity_type: "t".into(),
                    fairness_key: key.into(),
                    weight,
                    ..Default::default()
                }),
            })
            .await
            .unwrap();
    }
    let (heavy, served) = heavy_share_of_40(&b, 0, 5).await;
    assert!(
        (29..=31).contains(&heavy),
        "weights 3 and 1 set on the other node: the heavy key ran {heavy} of 40: {served:?}"
    );
}

/// A fairness weight an operator sets is refused out of range, without its type
/// or key, and nothing refused is stored.
#[tokio::test]
async fn a_set_fairness_weight_is_refused_out_of_range_or_unnamed() {
    let server = TestServer::start().await;
    let mut admin = server.admin().await;
    for (activity_type, key, weight, says) in [
        ("t", "k", 0, "weight is 0; it must be from 1 to 1000"),
        ("t", "k", 1_001, "weight is 1001; it must be from 1 to 1000"),
        ("", "k", 2, "activity_type is required"),
        ("t", "", 2, "fairness_key is required"),
        ("t", "a\u{7}b", 2, "fairness_key"),
    ] {
        invalid(
            admin
                .set_fairness_weight(v1::SetFairnessWeightRequest {
                    fairness_weight: Some(v1::FairnessWeight {
                        activity_type: activity_type.into(),
                        fairness_key: key.into(),
                        weight,
                        ..Default::default()
                    }),
                })
                .await,
            says,
        );
    }
    invalid(
        admin
            .set_fairness_weight(v1::SetFairnessWeightRequest::default())
            .await,
        "fairness_weight",
    );
    invalid(
        admin
            .delete_fairness_weight(v1::DeleteFairnessWeightRequest {
                activity_type: "t".into(),
                ..Default::default()
            })
            .await,
        "fairness_key",
    );
    let listed = fairness_weights(&mut admin).await;
    assert!(listed.is_empty(), "nothing refused was stored: {listed:?}");
}

/// A fairness weight out of range, or without its key, is refused before
/// anything is stored.
#[tokio::test]
async fn a_fairness_weight_is_refused_out_of_range_or_alone() {
    let (_server, mut client) = TestServer::serving().await;
    for (key, weight, says) in [
        ("t", 1_001, "from 1 to 1000"),
        ("", 3, "give the fairness_key"),
    ] {
        let mut req = request("t", "wf", "refused");
        req.fairness_key = key.into();
        req.fairness_weight = weight;
        let status = client.submit(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(says), "{}", status.message());
    }
    let found = client
        .get(v1::GetRequest {
            key: Some(key("wf", "refused")),
            ..Default::default()
        })
        .await;
    assert_eq!(found.map(|_| ()).unwrap_err().code(), tonic::Code::NotFound);
}

/// A worker with room for `slots` of type `t`, each held 3 s, that says which
/// rows started.
fn holding_worker(
    server: &TestServer,
    slots: u32,
) -> (WorkerGuard, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (started, starts) = tokio::sync::mpsc::unbounded_channel();
    let worker = server.worker(move |w| {
        w.max_concurrency(slots).activity("t", move |ctx, _| {
            let _ = started.send(ctx.info().activity_id.clone());
            async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                spool_worker::json(&"done")
            }
        })
    });
    (worker, starts)
}

/// The rows that start within `within`.
async fn starts_within(
    starts: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut started = Vec::new();
    while let Ok(Some(id)) = tokio::time::timeout_at(deadline, starts.recv()).await {
        started.push(id);
    }
    started.sort();
    started
}

/// Keys whose rows are all due later are passed over: a row due now of another
/// key starts at once, however many such keys come before it.
#[tokio::test]
async fn keys_with_rows_due_later_do_not_hold_back_a_row_due_now() {
    let (server, mut client) = TestServer::serving().await;
    let (_worker, mut starts) = holding_worker(&server, 2);
    server.await_workers(1).await;
    let later: Vec<_> = (0..4)
        .map(|i| {
            let mut req = request("t", "wf", &format!("later{i}"));
            req.concurrency_key = format!("later{i}");
            req.delay = Some(spool_proto::duration::to_proto(Duration::from_secs(3_600)));
            req
        })
        .collect();
    client
        .submit_batch(v1::SubmitBatchRequest { activities: later })
        .await
        .unwrap();
    let mut now = request("t", "wf", "now");
    // Named to sort after the others: keys served equally often go by name.
    now.concurrency_key = "zz-due".into();
    submit(&mut client, now).await;
    assert_eq!(
        starts_within(&mut starts, Duration::from_secs(2)).await,
        ["now"],
        "the row due now waited behind keys with nothing due"
    );
}

/// A key with fewer rows due than its share of a claim leaves room that the
/// other keys' rows take at once, not when a running row ends.
#[tokio::test]
async fn room_a_key_leaves_in_a_claim_goes_to_the_other_keys() {
    let (server, mut client) = TestServer::serving().await;
    let (_worker, mut starts) = holding_worker(&server, 6);
    server.await_workers(1).await;
    let rows: Vec<_> = std::iter::once(("few", 0))
        .chain((0..6).map(|i| ("many", i)))
        .map(|(key, i)| {
            let mut req = request("t", "wf", &format!("{key}{i}"));
            req.concurrency_key = key.into();
            req
        })
        .collect();
    client
        .submit_batch(v1::SubmitBatchRequest { activities: rows })
        .await
        .unwrap();
    // Well short of the 3 s a start would wait for a slot to free, and long
    // enough for three nodes on a loaded machine to claim twice.
    let started = starts_within(&mut starts, Duration::from_millis(2_500)).await;
    assert_eq!(
        started.len(),
        6,
        "6 slots, 7 rows due, and each held 3 s: only {started:?} started"
    );
}
