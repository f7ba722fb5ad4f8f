//! A node that loses a part it cannot live without stops, non-zero, rather than
//! living on as a zombie; a drain ends even while the database hangs.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use spool_server::server::Error;
use spool_testkit::faults::Faulty;

use crate::harness::*;

async fn server_on(faulty: &Arc<Faulty>) -> TestServer {
    TestServer::on_store(faulty.clone(), |_| {}).await
}

#[tokio::test]
async fn a_dead_committer_stops_the_node_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    // The committer reads the due times as it starts: it dies at once.
    faulty.panic_on_due_times.store(true, Ordering::SeqCst);
    let mut server = server_on(&faulty).await;
    match server.ended_within(WAIT).await {
        Some(Err(Error::TaskDied { task, why })) => {
            assert_eq!(task, "the committer");
            assert!(why.contains("panicked"), "{why}");
        }
        other => panic!("expected the node to stop with TaskDied, got {other:?}"),
    }
}

#[tokio::test]
async fn losing_the_listener_for_other_nodes_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    faulty.listens.store(true, Ordering::SeqCst);
    let mut server = server_on(&faulty).await;
    let mut client = server.client().await;
    submit(&mut client, request("t", "wf", "before")).await;
    assert!(
        server
            .ended_within(Duration::from_millis(200))
            .await
            .is_none()
    );
    faulty.kill_listener();
    match server.ended_within(WAIT).await {
        Some(Err(Error::TaskDied { task, .. })) => assert_eq!(task, "the committer"),
        other => panic!("expected the node to stop with TaskDied, got {other:?}"),
    }
}

#[tokio::test]
async fn a_drain_ends_while_the_database_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let mut server = server_on(&faulty).await;
    let mut client = server.client().await;
    let mut worker = RawWorker::connect(&server, &["t"], 1).await;
    submit(&mut client, request("t", "wf", "running")).await;
    worker.task().await;
    // From now on no write ever returns.
    faulty.stall(true);
    let started = Instant::now();
    server.stop();
    let ended = server
        .ended_within(Duration::from_secs(30))
        .await
        .expect("the node stops although the database hangs");
    assert!(ended.is_ok(), "{ended:?}");
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "took {:?}",
        started.elapsed()
    );
}
