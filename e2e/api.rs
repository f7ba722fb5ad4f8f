//! The client API: listing, stats, batches, and every bad input docs/PROTOCOL.md names.

use std::time::Duration;

use spool_proto::v1::{self, ActivityStatus, activity_service_client::ActivityServiceClient};
use spool_worker::Payload;
use tonic::{Code, Request, transport::Channel};

use crate::harness::*;

#[tokio::test]
async fn list_pages_through_everything_and_filters() {
    let (_server, mut client) = TestServer::serving().await;
    let batch = v1::SubmitBatchRequest {
        activities: (0..25)
            .map(|i| {
                request(
                    if i % 5 == 0 { "five" } else { "other" },
                    "wf",
                    &format!("a{i:02}"),
                )
            })
            .collect(),
    };
    client.submit_batch(batch).await.unwrap();
    let pages = list_pages(&mut client, 10).await;
    let seen: Vec<String> = pages
        .iter()
        .flat_map(|page| &page.activities)
        .map(|a| a.key.clone().unwrap().activity_id)
        .collect();
    assert_eq!(pages.len(), 3);
    let expected: Vec<String> = (0..25).map(|i| format!("a{i:02}")).collect();
    assert_eq!(seen, expected, "every activity once, in submission order");

    let fives = client
        .list(v1::ListRequest {
            activity_type: "five".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fives.activities.len(), 5);
    assert!(fives.next_page_token.is_empty());
    let completed = client
        .list(v1::ListRequest {
            status: ActivityStatus::Completed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(completed.activities.is_empty());

    invalid(
        client
            .list(v1::ListRequest {
                page_token: "garbage".into(),
                ..Default::default()
            })
            .await,
        "page_token",
    );
    invalid(
        client
            .list(v1::ListRequest {
                status: 42,
                ..Default::default()
            })
            .await,
        "status",
    );
}

#[tokio::test]
async fn stats_count_statuses_and_workers() {
    // `connected_workers` is the node's own.
    let server = TestServer::one_node().await;
    let _worker = server.worker(|w| {
        w.activity("ok", |_, _| async { Ok(Payload::default()) })
            .activity("bad", |_, _| async {
                Err(spool_worker::ActivityError::terminal("X", "no"))
            })
    });
    server.await_workers(1).await;
    let mut client = server.client().await;
    submit(&mut client, request("ok", "wf", "1")).await;
    submit(&mut client, request("ok", "wf", "2")).await;
    submit(&mut client, request("bad", "wf", "3")).await;
    submit(&mut client, request("unserved", "wf", "4")).await;
    submit(&mut client, request("unserved", "wf", "5")).await;
    cancel(&mut client, key("wf", "5"), "").await.unwrap();
    for id in ["1", "2", "3"] {
        wait(&mut client, key("wf", id)).await;
    }
    let stats = stats(&mut client).await;
    assert_eq!(
        (
            stats.scheduled,
            stats.running,
            stats.completed,
            stats.failed,
            stats.cancelled,
            stats.connected_workers
        ),
        (1, 0, 2, 1, 1, 1)
    );
    let other = client
        .stats(v1::StatsRequest {
            namespace: "other".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((other.scheduled, other.connected_workers), (0, 0));
}

#[tokio::test]
async fn a_batch_is_one_commit_and_all_or_nothing() {
    let (_server, mut client) = TestServer::serving().await;
    submit(&mut client, request("t", "wf", "taken")).await;
    let batch = v1::SubmitBatchRequest {
        activities: vec![
            request("t", "wf", "new-1"),
            request("other", "wf", "taken"),
            request("t", "wf", "new-2"),
        ],
    };
    let err = client.submit_batch(batch).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let missing = get_refused(&mut client, key("wf", "new-1")).await;
    assert_eq!(
        missing.code(),
        Code::NotFound,
        "nothing of a refused batch is stored"
    );

    let batch = v1::SubmitBatchRequest {
        activities: vec![request("t", "wf", "taken"), request("t", "wf", "new-1")],
    };
    let results = client
        .submit_batch(batch)
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(
        results.iter().map(|r| r.created).collect::<Vec<_>>(),
        vec![false, true]
    );

    let mut bad = request("t", "wf", "x");
    bad.activity_type = String::new();
    let err = client
        .submit_batch(v1::SubmitBatchRequest {
            activities: vec![request("t", "wf", "y"), bad],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("activities[1]"),
        "{}",
        err.message()
    );
}

async fn refused(
    client: &mut ActivityServiceClient<Channel>,
    request: v1::SubmitRequest,
    code: Code,
    mention: &str,
) {
    let err = client.submit(request).await.expect_err("must be refused");
    assert_eq!(err.code(), code, "{}", err.message());
    assert!(
        err.message().contains(mention),
        "{:?} should mention {mention:?}",
        err.message()
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_a_clear_status() {
    let (_server, mut client) = TestServer::serving().await;
    let negative = prost_types::Duration {
        seconds: -1,
        nanos: 0,
    };

    let changed = |change: &dyn Fn(&mut v1::SubmitRequest)| {
        let mut r = request("t", "wf", "a");
        change(&mut r);
        r
    };
    let mut bad = vec![
        (changed(&|r| r.activity_type.clear()), "activity_type"),
        (request(&"t".repeat(256), "wf", "a"), "activity_type"),
        (request("t", &"w".repeat(256), "a"), "workflow_id"),
        (request("t", "wf", &"a".repeat(256)), "activity_id"),
        (request("t", "wf\n", "a"), "control"),
        (request("t\u{7}", "wf", "a"), "control"),
        (changed(&|r| r.delay = Some(negative)), "delay"),
        (
            changed(&|r| r.start_to_close_timeout = Some(negative)),
            "start_to_close_timeout",
        ),
        (
            changed(&|r| r.heartbeat_timeout = Some(negative)),
            "heartbeat_timeout",
        ),
        (
            changed(&|r| r.schedule_to_close_timeout = Some(negative)),
            "schedule_to_close_timeout",
        ),
        (
            changed(&|r| {
                r.retry_policy = Some(v1::RetryPolicy {
                    initial_interval: Some(negative),
                    ..Default::default()
                })
            }),
            "initial_interval",
        ),
        (
            changed(&|r| {
                r.retry_policy = Some(v1::RetryPolicy {
                    max_attempts: 10_001,
                    ..Default::default()
                })
            }),
            "max_attempts",
        ),
    ];
    for ns in ["has space", "ümlaut", &"n".repeat(65)] {
        bad.push((changed(&|r| r.namespace = ns.to_owned()), "namespace"));
    }
    for (r, mention) in bad {
        refused(&mut client, r, Code::InvalidArgument, mention).await;
    }

    let err = get_refused(&mut client, key("wf", "missing")).await;
    assert_eq!(err.code(), Code::NotFound);
    let err = get_refused(&mut client, key("", "a")).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client.get(v1::GetRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client
        .wait(v1::WaitRequest {
            key: Some(key("wf", "a")),
            timeout: Some(negative),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Nothing above was stored.
    let stats = stats(&mut client).await;
    assert_eq!(stats.scheduled, 0);
}

#[tokio::test]
async fn an_oversized_payload_is_refused_and_the_server_keeps_serving() {
    let (_server, mut client) = TestServer::serving().await;
    let mut big = request("t", "wf", "big");
    big.input = Some(Payload {
        content_type: "application/octet-stream".into(),
        data: vec![7u8; 5 * 1024 * 1024],
    });
    refused(&mut client, big, Code::ResourceExhausted, "limit").await;
    // Past the message limit itself (not only the payload's), the same code.
    let mut huge = request("t", "wf", "huge");
    huge.input = Some(Payload {
        content_type: "application/octet-stream".into(),
        data: vec![7u8; 20 * 1024 * 1024],
    });
    refused(&mut client, huge, Code::ResourceExhausted, "larger").await;
    let mut ok = request("t", "wf", "fine");
    ok.input = Some(Payload {
        content_type: "application/octet-stream".into(),
        data: vec![7u8; 1024 * 1024],
    });
    assert!(submit(&mut client, ok).await.created);
    let stored = get(&mut client, key("wf", "fine")).await;
    assert_eq!(stored.input.unwrap().data.len(), 1024 * 1024);
    let missing = get_refused(&mut client, key("wf", "big")).await;
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn a_configured_token_is_required() {
    let server =
        TestServer::start_with(|c| c.auth_token = Some("s3cret-token-0123456789".into())).await;
    let mut anonymous = server.client().await;
    let err = anonymous.submit(request("t", "wf", "a")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let mut wrong = Request::new(request("t", "wf", "a"));
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_eq!(
        anonymous.submit(wrong).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    let mut right = Request::new(request("t", "wf", "a"));
    right.metadata_mut().insert(
        "authorization",
        "Bearer s3cret-token-0123456789".parse().unwrap(),
    );
    assert!(anonymous.submit(right).await.unwrap().into_inner().created);

    // Workers too.
    let refused = server.completing("t");
    let err = tokio::time::timeout(WAIT, refused.stop_when_done())
        .await
        .unwrap();
    assert!(
        matches!(err, Err(spool_worker::Error::Rejected(s)) if s.code() == Code::Unauthenticated)
    );
    let _worker = server.worker(|w| {
        w.token("s3cret-token-0123456789")
            .activity("t", |_, _| async { Ok(Payload::default()) })
    });
    let mut right = Request::new(v1::WaitRequest {
        key: Some(key("wf", "a")),
        timeout: Some(prost_types_duration(Duration::from_secs(10))),
    });
    right.metadata_mut().insert(
        "authorization",
        "Bearer s3cret-token-0123456789".parse().unwrap(),
    );
    let done = anonymous.wait(right).await.unwrap().into_inner();
    assert_eq!(status(&done), ActivityStatus::Completed);
}

#[tokio::test]
async fn tokens_have_roles_and_namespaces() {
    const CLIENT: &str = "client-orders-0123456789";
    const WORKER: &str = "worker-orders-0123456789";
    const ADMIN: &str = "admin-everything-0123456";
    let tokens = tokens_file(serde_json::json!([
        {"token": CLIENT, "role": "client", "namespaces": ["orders"]},
        {"token": WORKER, "role": "worker", "namespaces": ["orders"]},
        {"token": ADMIN, "role": "admin"},
    ]));
    // The admin token's ListWorkers is the node's own.
    let server = TestServer::one_node_with(|c| c.tokens_file = Some(tokens.path.clone())).await;
    let mut client = server.client().await;
    let in_orders = || {
        let mut r = request("t", "wf", "a");
        r.namespace = "orders".into();
        r
    };

    // A client token: its namespace only, the client API only.
    assert!(client.submit(with_token(in_orders(), CLIENT)).await.is_ok());
    let err = client
        .submit(with_token(request("t", "wf", "a"), CLIENT))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("\"default\""), "{}", err.message());
    let err = client
        .stats(with_token(
            v1::StatsRequest {
                namespace: "billing".into(),
            },
            CLIENT,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let mut admin = server.admin().await;
    let err = admin
        .drain(with_token(v1::DrainRequest::default(), CLIENT))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let weight = v1::SetFairnessWeightRequest {
        fairness_weight: Some(v1::FairnessWeight {
            namespace: "orders".into(),
            activity_type: "t".into(),
            fairness_key: "k".into(),
            weight: 2,
            ..Default::default()
        }),
    };
    let err = admin
        .set_fairness_weight(with_token(weight.clone(), CLIENT))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        admin
            .set_fairness_weight(with_token(weight, ADMIN))
            .await
            .is_ok()
    );
    // Reading the weights is a client's too; deleting one is not.
    let listed = admin
        .list_fairness_weights(with_token(
            v1::ListFairnessWeightsRequest {
                namespace: "orders".into(),
            },
            CLIENT,
        ))
        .await
        .unwrap()
        .into_inner()
        .fairness_weights;
    assert_eq!(listed.len(), 1);
    let delete = v1::DeleteFairnessWeightRequest {
        namespace: "orders".into(),
        activity_type: "t".into(),
        fairness_key: "k".into(),
    };
    let err = admin
        .delete_fairness_weight(with_token(delete, CLIENT))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    // A worker token cannot submit; it may serve its namespace only.
    let err = client
        .submit(with_token(in_orders(), WORKER))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let refused = server.worker(|w| {
        w.token(WORKER)
            .activity("t", |_, _| async { Ok(Payload::default()) })
    });
    let err = tokio::time::timeout(WAIT, refused.stop_when_done())
        .await
        .unwrap();
    assert!(
        matches!(err, Err(spool_worker::Error::Rejected(s)) if s.code() == Code::PermissionDenied)
    );
    let _worker = server.worker(|w| {
        w.token(WORKER)
            .namespace("orders")
            .activity("t", |_, _| async { Ok(Payload::default()) })
    });
    let mut waited = with_token(
        v1::WaitRequest {
            key: Some(v1::ActivityKey {
                namespace: "orders".into(),
                workflow_id: "wf".into(),
                activity_id: "a".into(),
            }),
            timeout: Some(prost_types_duration(WAIT)),
        },
        CLIENT,
    );
    waited.set_timeout(WAIT);
    let done = client.wait(waited).await.unwrap().into_inner();
    assert_eq!(status(&done), ActivityStatus::Completed);

    // An admin token: everything.
    let workers = admin
        .list_workers(with_token(v1::ListWorkersRequest::default(), ADMIN))
        .await
        .unwrap()
        .into_inner()
        .workers;
    assert_eq!(workers.len(), 1);
    assert!(
        client
            .submit(with_token(request("t", "wf", "b"), ADMIN))
            .await
            .is_ok()
    );
    let err = client
        .submit(with_token(request("t", "wf", "c"), "not-a-token-at-all"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}
