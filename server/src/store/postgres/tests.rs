//! Tests of the PostgreSQL store: its plans, its sessions, its notifications.

use std::{
    mem::ManuallyDrop,
    os::fd::{FromRawFd, RawFd},
};

use super::*;
use crate::store::{Reads, SettingChange};
use sqlx::PgConnection;

#[test]
fn migrations_are_numbered_in_order() {
    crate::store::migrations_are_numbered_in_order(&these_migrations());
}

/// A store in a schema of its own, with `extra` session options.
async fn store_with(extra: &[(&str, &str)]) -> PostgresStore {
    let url = spool_testkit::fixtures::postgres_schema("pgstore").await;
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .options(extra.iter().copied());
    PostgresStore::open_with(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The next remote item that `wanted` accepts, within 10 s (other tests' nodes
/// share the channel, so unrelated events are skipped).
async fn next_matching(
    rx: &mut mpsc::Receiver<Remote>,
    wanted: impl Fn(&Remote) -> bool,
) -> Remote {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(remote)) if wanted(&remote) => return remote,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the listener stopped"),
            Err(_) => panic!("nothing matching arrived within 10 s"),
        }
    }
}

/// A node on the database at `url`, and what it hears from the others.
async fn listening_node(url: &str) -> (PostgresStore, mpsc::Receiver<Remote>) {
    let store = PostgresStore::open(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let heard = store
        .subscribe()
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no listener"));
    (store, heard)
}

/// Whether each TCP socket of this process connected to `port` sends without
/// Nagle's algorithm, by file descriptor.
fn nodelay_of_sockets_to(port: u16) -> Vec<(RawFd, bool)> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir("/proc/self/fd").unwrap_or_else(|e| panic!("{e}"));
    for entry in entries.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        // SAFETY: the descriptor is only asked about and never closed (it
        // stays its owner's); one closed meanwhile answers with an error.
        let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        if socket.peer_addr().is_ok_and(|peer| peer.port() == port)
            && let Ok(nodelay) = socket.nodelay()
        {
            found.push((fd, nodelay));
        }
    }
    found
}

/// A node of the version before starts on a database a newer version
/// migrated (a rolling upgrade, a rollback): migrations it does not know are
/// not an error.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_node_starts_on_a_database_a_newer_version_migrated() {
    let url = spool_testkit::fixtures::postgres_schema("pgstore").await;
    let store = PostgresStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let newer = these_migrations()
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
        + 1;
    sqlx::query(
        "INSERT INTO _sqlx_migrations \
           (version, description, success, checksum, execution_time) \
         VALUES ($1, 'a newer version''s', TRUE, '\\x00', 1)",
    )
    .bind(newer)
    .execute(&store.pool)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    drop(store);
    let again = PostgresStore::open(&url).await;
    assert!(again.is_ok(), "{:?}", again.err());
}

/// Every connection to PostgreSQL sends without Nagle's algorithm. With it, a
/// statement whose messages leave in two segments waits for the server's
/// delayed ACK, ~40 ms (sqlx 0.9.0 stopped setting TCP_NODELAY; see
/// vendor/README.md).
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn connections_to_postgres_send_without_nagle() {
    let url = spool_testkit::fixtures::postgres_schema("pgstore").await;
    let port = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .get_port();
    let store = PostgresStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Held, so both pools have a connection open while the sockets are read.
    let _writer = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    let _reader = store
        .readers
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let sockets = nodelay_of_sockets_to(port);
    assert!(sockets.len() >= 2, "connections found: {sockets:?}");
    let nagled: Vec<_> = sockets.iter().filter(|(_, nodelay)| !nodelay).collect();
    assert!(
        nagled.is_empty(),
        "sockets with Nagle's algorithm on: {nagled:?}"
    );
}

/// A batch with claims of several rate-limited types locks all their buckets
/// in one order before any claim: held up at the first bucket, it holds none
/// after it. Claim by claim it would lock `t3` (its first claim's), then wait
/// for `t2` holding it, and a batch naming them the other way round would
/// wait for it in turn.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_batch_locks_its_claims_rate_limit_buckets_in_one_order() {
    let store = Arc::new(store_with(&[]).await);
    for activity_type in ["t2", "t3"] {
        let limit = rate::RateLimit {
            namespace: "default".into(),
            activity_type: activity_type.into(),
            key: None,
            per_period: 1_000,
            period: std::time::Duration::from_secs(1),
            burst: 1_000,
        };
        store
            .apply(
                Arc::from([Op::Setting(SettingChange::RateLimit(limit))]),
                1_000,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    const LOCK: &str = "SELECT 1 FROM rate_limits \
         WHERE namespace = 'default' AND activity_type = $1 FOR UPDATE";
    let mut holder = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::query(LOCK)
        .bind("t2")
        .execute(&mut *holder)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let claim = |activity_type: &str, worker: &str| {
        Op::Claim(crate::store::Claim {
            namespace: "default".into(),
            activity_types: vec![activity_type.into()],
            worker_id: worker.into(),
            identity: "host".into(),
            node: "node".into(),
            limit: 10,
            lease_expires_at: 60_000,
            epoch: 0,
        })
    };
    let batch = {
        let store = store.clone();
        let ops: Arc<[Op]> = Arc::from([claim("t3", "w1"), claim("t2", "w2")]);
        tokio::spawn(async move { store.apply(ops, 1_000).await })
    };
    let mut probe = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&mut *probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    spool_testkit::fixtures::eventually_for(
        std::time::Duration::from_secs(10),
        "the batch to wait for the held bucket",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE '%rate_limits%' \
                   AND pid IN (SELECT pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE c.relname = 'rate_limits' AND n.nspname = $1)",
            )
            .bind(&schema)
            .fetch_one(&mut *store.pool.acquire().await.ok()?)
            .await
            .ok()?;
            (waiting > 0).then_some(())
        },
    )
    .await;
    let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
    let t3 = sqlx::query(
        "SELECT 1 FROM rate_limits \
         WHERE namespace = 'default' AND activity_type = $1 FOR UPDATE NOWAIT",
    )
    .bind("t3")
    .execute(&mut *tx)
    .await;
    drop(tx);
    holder.commit().await.unwrap_or_else(|e| panic!("{e}"));
    let applied = batch.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        t3.is_ok(),
        "the batch held t3's bucket while it waited for t2's: {t3:?}"
    );
    assert!(applied.is_ok(), "{applied:?}");
}

/// Publish/subscribe between two nodes on one schema: once they have heard
/// each other, one's events reach the other, not itself; a listener whose
/// connection is cut comes back and says `Resync`.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn events_reach_other_nodes_and_a_cut_listener_resyncs() {
    let url = spool_testkit::fixtures::postgres_schema("pgstore").await;
    let (a, mut from_a) = listening_node(&url).await;
    let (b, mut from_b) = listening_node(&url).await;
    spool_testkit::fixtures::eventually_for(
        std::time::Duration::from_secs(5),
        "the two nodes to hear each other",
        || async { (a.channel.others_present() && b.channel.others_present()).then_some(()) },
    )
    .await;
    // Each, on first hearing the other, reads the store again: the other did not
    // publish for it until then.
    for from in [&mut from_a, &mut from_b] {
        assert!(matches!(
            next_matching(from, |r| matches!(r, Remote::Resync)).await,
            Remote::Resync
        ));
    }
    let key = Key {
        namespace: "default".into(),
        workflow_id: format!("wf-{}", uuid::Uuid::new_v4().simple()),
        activity_id: "a".into(),
    };
    let finished = Event::Finished { key: key.clone() };
    let is_ours = |r: &Remote| matches!(r, Remote::Event(Event::Finished { key: k }) if k.workflow_id == key.workflow_id);
    b.publish(vec![finished.clone()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(next_matching(&mut from_a, is_ours).await, Remote::Event(e) if e == finished));
    // A node does not hear itself: b's own listener gets a's next event, never its own.
    let second = Event::Finished {
        key: Key {
            activity_id: "b".into(),
            ..key.clone()
        },
    };
    a.publish(vec![second.clone()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(next_matching(&mut from_b, is_ours).await, Remote::Event(e) if e == second),
        "b heard a, not its own earlier event"
    );
    // Cut every listening connection: each listener reconnects and says Resync.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .execute(&a.pool)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        next_matching(&mut from_a, |r| matches!(r, Remote::Resync)).await,
        Remote::Resync
    ));
}

/// A cancel of a running attempt committed by a node that had not yet heard
/// another reaches the other once they hear each other: the worker running
/// the attempt may be connected there.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_cancel_committed_before_another_node_was_heard_reaches_it() {
    let url = spool_testkit::fixtures::postgres_schema("pgstore").await;
    let (a, _from_a) = listening_node(&url).await;
    let cancelled = Event::Cancelled {
        worker_id: "w".into(),
        key: Key {
            namespace: "default".into(),
            workflow_id: format!("wf-{}", uuid::Uuid::new_v4().simple()),
            activity_id: "a".into(),
        },
        attempt: 1,
        reason: "no longer wanted".into(),
    };
    a.publish(vec![cancelled.clone()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_b, mut from_b) = listening_node(&url).await;
    let told = next_matching(&mut from_b, |r| {
        matches!(r, Remote::Event(Event::Cancelled { .. }))
    })
    .await;
    assert!(matches!(told, Remote::Event(e) if e == cancelled));
}

/// A node alone in its schema publishes nothing, though nodes of other
/// schemas (other tests) talk on the same channel of the same database.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_node_alone_in_its_schema_publishes_nothing() {
    let alone = store_with(&[]).await;
    let _events = alone.subscribe().await.unwrap_or_else(|e| panic!("{e}"));
    let mut watcher = sqlx::postgres::PgListener::connect_with(&alone.pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    watcher
        .listen(notify::CHANNEL)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Past a few hellos, in case another node were there to be heard.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    assert!(!alone.channel.others_present());
    let key = Key {
        namespace: "default".into(),
        workflow_id: "wf".into(),
        activity_id: "a".into(),
    };
    alone
        .publish(vec![Event::Finished { key }])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(1_500);
    while let Ok(received) = tokio::time::timeout_at(deadline, watcher.recv()).await {
        let payload = received.unwrap_or_else(|e| panic!("{e}"));
        let envelope: serde_json::Value =
            serde_json::from_str(payload.payload()).unwrap_or_default();
        let from_alone = envelope["node"].as_str() == Some(alone.channel.node());
        let has_events = envelope["events"]
            .as_array()
            .is_some_and(|events| !events.is_empty());
        assert!(!(from_alone && has_events), "published alone: {envelope}");
    }
}

/// The claim's generic plan (what a prepared statement runs after a few calls)
/// as PostgreSQL would run it now.
async fn claim_plan(conn: &mut PgConnection) -> String {
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "claim_plan_{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE {name}(BIGINT, TEXT, BIGINT, TEXT, TEXT, BIGINT, TEXT, TEXT) AS {}",
        sql::CLAIM
    )))
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN EXECUTE {name}(9000000000000, 'w', 1, 'ns', 't', 50, 'i', 'n')"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    plan.join("\n")
}

/// The lines of `plan` under its CTE `name`.
fn cte_plan(plan: &str, name: &str) -> String {
    let header = format!("  CTE {name}");
    plan.lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| line.starts_with("    "))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn analyze(conn: &mut PgConnection) {
    sqlx::query("ANALYZE activities")
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Inserts `n` rows of type `t` with status `status`.
async fn fill(conn: &mut PgConnection, n: i64, status: i64) {
    sqlx::query(
        "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, \
           status, max_attempts, initial_interval_ms, backoff_coefficient, \
           max_interval_ms, input, created_at, next_at, finished_at) \
         SELECT 'ns', 'wf', gen_random_uuid()::TEXT, 't', $2, 3, 1000, 2, 10000, '', \
           g, g, CASE WHEN $2 >= 3 THEN g END \
         FROM generate_series(1, $1) AS g",
    )
    .bind(n)
    .bind(status)
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A change of the priority aging over a backlog larger than one statement's
/// timeout can rank: the setting is stored at once, and the rows are ranked
/// again in steps, each well inside the timeout, until every waiting row has
/// the rank the new setting gives it.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_priority_aging_change_over_a_large_backlog_fits_the_statement_timeout() {
    let store = store_with(&[("statement_timeout", "1s")]).await;
    let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fill(&mut tx, 250_000, 1).await;
    sqlx::query("UPDATE activities SET priority = id % 5, claim_band = -(id % 5)")
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    tx.commit().await.unwrap_or_else(|e| panic!("{e}"));
    // The whole backlog in one statement, as a change used to rank it, does
    // not fit the timeout.
    let whole = sqlx::query(concat!(
        "UPDATE activities SET claim_rank = ",
        rank!("COALESCE(fair_at, next_at)", "priority"),
        " WHERE status = 1"
    ))
    .execute(&store.pool)
    .await;
    assert!(
        whole.is_err_and(|e| e.to_string().contains("statement timeout")),
        "the backlog is too small to show it"
    );
    let changed = store
        .set_priority_aging(Some(std::time::Duration::from_secs(1)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(changed);
    let mut ranked = 0;
    loop {
        let ops: Arc<[Op]> = Arc::from(vec![Op::Rerank { ids: 1_000 }]);
        match store.apply(ops, store.now()).await.as_deref() {
            Ok([Outcome::Reranked(Some(step))]) => {
                ranked += step.rows;
                if step.done {
                    break;
                }
            }
            other => panic!("a step failed: {other:?}"),
        }
    }
    assert_eq!(ranked, 250_000);
    let stale: i64 = sqlx::query_scalar(concat!(
        "SELECT COUNT(*) FROM activities WHERE status = 1 AND (claim_band <> ",
        band!("priority", "concurrency_key"),
        " OR claim_rank <> ",
        rank!("COALESCE(fair_at, next_at)", "priority"),
        ")"
    ))
    .fetch_one(&store.pool)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stale, 0);
}

/// A claim is a range scan of `activities_due`, in order, whatever the planner
/// believes about the table: statistics taken when it was empty, or when every
/// row had finished, or true ones. A plan that sorts, hashes or scans the
/// table reads every waiting row on every claim, which at a million rows is
/// the whole drain's time.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_claim_is_a_range_scan_of_the_due_index_whatever_the_statistics() {
    let store = store_with(&[]).await;
    let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    let check = |plan: String, when: &str| {
        assert!(
            plan.contains("Index Scan using activities_due"),
            "{when}: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{when}: Seq Scan in {plan}");
        // The reads of activities (CTEs `k` and `c`) must not sort or hash; a
        // hash of the claim's own few rows, counting them per key, may.
        for cte in ["k", "c"] {
            let reads = cte_plan(&plan, cte);
            assert!(!reads.is_empty(), "{when}: no CTE {cte} in {plan}");
            for bad in ["Sort", "Hash"] {
                assert!(!reads.contains(bad), "{when}: {bad} in CTE {cte}: {plan}");
            }
        }
    };
    analyze(&mut conn).await;
    fill(&mut conn, 20_000, 1).await;
    check(claim_plan(&mut conn).await, "analyzed empty, then filled");
    sqlx::query("UPDATE activities SET status = 3, finished_at = 1")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fill(&mut conn, 50_000, 3).await;
    analyze(&mut conn).await;
    fill(&mut conn, 20_000, 1).await;
    check(
        claim_plan(&mut conn).await,
        "analyzed all finished, then a backlog",
    );
    analyze(&mut conn).await;
    check(claim_plan(&mut conn).await, "true statistics");
}

/// Reads (`Get`, lists, limits) find connections open from the start and kept
/// open: a request that had to open one waited about 90 ms for it.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn readers_are_connected_before_the_first_read() {
    let store = store_with(&[]).await;
    assert!(
        store.readers.num_idle() >= 1,
        "no reader connection open after opening the store"
    );
    spool_testkit::fixtures::eventually_for(
        std::time::Duration::from_secs(5),
        "two reader connections",
        || async { (store.readers.num_idle() >= 2).then_some(()) },
    )
    .await;
}

/// Once a type's keys outgrow the statistics taken before they existed, the
/// store analyzes them again by itself, and the claim's update of the keys it
/// served reads each key once. On the stale statistics the plan read every key
/// of the type once per key served: a keyed drain of 1,000 keys ran at half
/// speed until autovacuum came by.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn keys_outgrowing_their_statistics_are_analyzed_again() {
    let store = store_with(&[]).await;
    let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::query("ANALYZE concurrency_keys")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    sqlx::query(
        "INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting) \
         SELECT 'ns', 't', 'key-' || g, 40 FROM generate_series(1, 1000) AS g",
    )
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let analyzed: f32 = sqlx::query_scalar(
            "SELECT reltuples FROM pg_class WHERE oid = 'concurrency_keys'::regclass",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        if analyzed >= 1000.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "1,000 keys, statistics of {analyzed} rows after 15 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let plan = claim_plan(&mut conn).await;
    // The stale plan: a nested loop over the type's keys, comparing each with
    // every key served (a hash join, or a lookup by key, reads each once).
    let served = cte_plan(&plan, "kb");
    assert!(
        !served.contains("Join Filter: (q.concurrency_key"),
        "every key of the type read once per key served: {plan}"
    );
}

/// Callers holding every API read connection do not hold up the committer's
/// writes or the server's own reads.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn writes_never_wait_behind_callers_reads() {
    let store = store_with(&[]).await;
    let held = crate::store::tests::hold_every_connection(&store.readers).await;
    crate::store::tests::own_work_never_waits_behind_callers(&store).await;
    drop(held);
}

/// `sslmode` in the URL is honoured: `require` speaks TLS (the server's own
/// certificate here is self-signed), `verify-full` refuses a certificate no
/// trusted CA signed.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn the_urls_sslmode_is_honoured() {
    let url = spool_testkit::fixtures::postgres_url();
    let with = |mode: &str| {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}sslmode={mode}")
    };
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&with("require"))
        .await
        .unwrap_or_else(|e| panic!("sslmode=require: {e}"));
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(encrypted, "sslmode=require must speak TLS");
    let verified = PostgresStore::open(&with("verify-full")).await;
    assert!(
        verified.is_err(),
        "verify-full must refuse the self-signed certificate"
    );
}

/// A node of the version before, sharing the database during a rolling
/// upgrade, counts keyed rows through the per-row triggers; this version's
/// sessions count them in their own statements, and the triggers leave them
/// alone (see the `0016_keyed_endings` migration).
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn sessions_of_the_version_before_count_keys_through_the_triggers() {
    let store = store_with(&[]).await;
    let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    let run = |sql: &'static str| sqlx::query(sql);
    async fn counts(conn: &mut PgConnection) -> Option<(i64, i64)> {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT waiting, running FROM concurrency_keys WHERE concurrency_key = 'k'",
        )
        .fetch_optional(conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }
    let insert = "INSERT INTO activities (namespace, workflow_id, activity_id, \
         activity_type, status, max_attempts, initial_interval_ms, backoff_coefficient, \
         max_interval_ms, input, created_at, next_at, concurrency_key) \
         VALUES ('ns', 'wf', 'a', 't', 1, 3, 1000, 2, 10000, '', 1, 1, 'k')";
    // This version's session: the trigger leaves the row to the statement.
    run(insert)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts(&mut conn).await, None);
    run("DELETE FROM activities")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The version before's: submit, claim and ending counted by the triggers.
    run("SET spool.keyed_counts = ''")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    run(insert)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts(&mut conn).await, Some((1, 0)));
    run("UPDATE activities SET status = 2")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts(&mut conn).await, Some((0, 1)));
    run("UPDATE activities SET status = 3")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts(&mut conn).await, None, "an empty key goes");
    run("RESET spool.keyed_counts")
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A submit to a key already waiting, and an ending, move the key's counts in
/// place: heap-only updates, so no new entry in any index of
/// `concurrency_keys` (see the `0017_hot_key_endings` and `0018_ready_keys`
/// migrations; neither was heap-only before them).
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn submits_and_endings_move_their_keys_counts_in_place() {
    use crate::store::{Attempt, Claim, Transition};
    let store = store_with(&[]).await;
    let keyed = |id: &str| {
        let mut activity = crate::store::new_activity_for_tests(id, "t");
        activity.concurrency_key = Some("k".into());
        activity
    };
    let now = keyed("a").next_at;
    // How many updates of `concurrency_keys` `op` made, and how many of them
    // heap-only, as this session counts them (its counts not yet reported
    // include earlier transactions, hence the difference); rolled back.
    let counted = |op: Op| {
        let store = &store;
        async move {
            let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
            let counts = "SELECT pg_stat_get_xact_tuples_updated(oid), \
                   pg_stat_get_xact_tuples_hot_updated(oid) \
                 FROM pg_class WHERE oid = 'concurrency_keys'::regclass";
            let (updated, in_place): (i64, i64) = sqlx::query_as(counts)
                .fetch_one(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let outcomes = write::apply(&mut tx, &[op], now + 1)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !matches!(outcomes[..], [Outcome::Finished { accepted: false }]),
                "{outcomes:?}"
            );
            let (updated_after, in_place_after): (i64, i64) = sqlx::query_as(counts)
                .fetch_one(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            (updated_after - updated, in_place_after - in_place)
        }
    };
    let claim = Op::Claim(Claim {
        namespace: "default".into(),
        activity_types: vec![Arc::from("t")],
        worker_id: "w".into(),
        identity: "host".into(),
        node: "node".into(),
        limit: 1,
        lease_expires_at: now + 30_000,
        epoch: 0,
    });
    let outcomes = store
        .apply(
            vec![Op::Submit(vec![keyed("a"), keyed("b")]), claim].into(),
            now,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let Some(Outcome::Claimed { rows, .. }) = outcomes.last() else {
        panic!("no claim in {outcomes:?}");
    };
    let [row] = rows.as_slice() else {
        panic!("claimed {rows:?}");
    };
    assert_eq!(
        counted(Op::Submit(vec![keyed("c")])).await,
        (1, 1),
        "a submit: (updates, heap-only updates)"
    );
    let ending = Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition: Transition::Complete {
            output: Default::default(),
        },
        lease_expired_by: None,
    };
    assert_eq!(
        counted(ending).await,
        (1, 1),
        "an ending: (updates, heap-only updates)"
    );
}

/// Every pooled session carries the limits, and a URL's own setting wins.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn sessions_set_statement_lock_and_idle_timeouts() {
    let store = store_with(&[("lock_timeout", "3s")]).await;
    let show = |name: &'static str| {
        let pool = store.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    assert_eq!(show("statement_timeout").await, "30s");
    assert_eq!(show("spool.keyed_counts").await, "statement");
    assert_eq!(show("idle_in_transaction_session_timeout").await, "1min");
    assert_eq!(
        show("lock_timeout").await,
        "3s",
        "the URL's own setting wins"
    );
}

/// A writing session commits durably even when told `synchronous_commit = off`;
/// a stronger setting (waiting on replicas) is kept.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn writing_sessions_never_commit_without_flushing() {
    for (asked, kept) in [("off", "on"), ("remote_apply", "remote_apply")] {
        let store = store_with(&[("synchronous_commit", asked)]).await;
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}")));
        }
        for session in &mut sessions {
            let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&mut **session)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(setting, kept, "a writing session asked for {asked}");
        }
    }
}

/// Two nodes on one schema, eight claimers each, racing for the same rows: every
/// row is claimed once, at attempt 1, by the claimer the row names; and a key
/// limited to two never has more than two claimed at once, counted from the
/// claimers' side (a claim counts once committed and stops counting before its
/// ending commits, so the count never exceeds the stored one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn two_nodes_racing_for_rows_claim_each_once_and_keep_a_keys_limit() {
    use std::{
        collections::HashMap,
        sync::{
            Mutex,
            atomic::{AtomicI64, Ordering},
        },
    };

    use crate::store::{Attempt, Claim, Transition};

    const ROWS: usize = 200;
    const KEYED: usize = 60;
    let url = spool_testkit::fixtures::postgres_schema("pgrace").await;
    let open = || async {
        Arc::new(
            PostgresStore::open(&url)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        )
    };
    let nodes = [open().await, open().await];
    let now = crate::store::new_activity_for_tests("x", "t").next_at;
    let mut activities: Vec<_> = (0..ROWS)
        .map(|i| crate::store::new_activity_for_tests(&format!("a{i}"), "t"))
        .collect();
    activities.extend((0..KEYED).map(|i| {
        let mut activity = crate::store::new_activity_for_tests(&format!("k{i}"), "keyed");
        activity.concurrency_key = Some("k".into());
        activity
    }));
    let limit = Op::Setting(SettingChange::KeyLimit {
        namespace: "default".into(),
        activity_type: "keyed".into(),
        key: "k".into(),
        max_running: Some(2),
        weight: 1,
    });
    nodes[0]
        .apply(vec![limit, Op::Submit(activities)].into(), now)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // Activity id: each claim of it, as (worker, attempt).
    type Claims = HashMap<String, Vec<(String, u32)>>;
    let claimed: Arc<Mutex<Claims>> = Arc::default();
    let keyed_running = Arc::new(AtomicI64::new(0));
    let keyed_most = Arc::new(AtomicI64::new(0));
    let mut claimers = tokio::task::JoinSet::new();
    for (n, node) in nodes.iter().enumerate() {
        for c in 0..8 {
            let (store, claimed) = (node.clone(), claimed.clone());
            let (running, most) = (keyed_running.clone(), keyed_most.clone());
            let worker = format!("node{n}-w{c}");
            claimers.spawn(async move {
                let claim = Op::Claim(Claim {
                    namespace: "default".into(),
                    activity_types: vec![Arc::from("keyed"), Arc::from("t")],
                    worker_id: worker.as_str().into(),
                    identity: "host".into(),
                    node: format!("node{n}").into(),
                    limit: 3,
                    lease_expires_at: now + 60_000,
                    epoch: 0,
                });
                let mut empty = 0;
                while empty < 5 {
                    let outcomes = store
                        .apply(vec![claim.clone()].into(), now)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    let Some(Outcome::Claimed { rows, .. }) = outcomes.last() else {
                        panic!("no claim in {outcomes:?}");
                    };
                    if rows.is_empty() {
                        empty += 1;
                        tokio::task::yield_now().await;
                        continue;
                    }
                    empty = 0;
                    let keyed = rows.iter().filter(|r| r.concurrency_key.is_some()).count();
                    let held = running.fetch_add(keyed as i64, Ordering::SeqCst) + keyed as i64;
                    most.fetch_max(held, Ordering::SeqCst);
                    if let Ok(mut claimed) = claimed.lock() {
                        for row in rows {
                            claimed
                                .entry(row.key.activity_id.to_string())
                                .or_default()
                                .push((worker.clone(), row.attempt));
                        }
                    }
                    if keyed > 0 {
                        // Held a moment, as a worker would, so that claims on
                        // the other node overlap it.
                        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                    }
                    let endings: Vec<Op> = rows
                        .iter()
                        .map(|row| Op::Finish {
                            attempt: Arc::new(Attempt::from_row(row)),
                            transition: Transition::Complete {
                                output: Default::default(),
                            },
                            lease_expired_by: None,
                        })
                        .collect();
                    running.fetch_sub(keyed as i64, Ordering::SeqCst);
                    let ended = store
                        .apply(endings.into(), now + 1)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert!(
                        ended
                            .iter()
                            .all(|o| matches!(o, Outcome::Finished { accepted: true })),
                        "{worker}: an ending of its own claim was refused: {ended:?}"
                    );
                }
            });
        }
    }
    while let Some(joined) = claimers.join_next().await {
        joined.unwrap_or_else(|e| panic!("a claimer failed: {e}"));
    }

    let claimed: Claims = std::mem::take(&mut *claimed.lock().unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(claimed.len(), ROWS + KEYED, "rows never claimed");
    for (id, claims) in claimed.iter() {
        let [(worker, attempt)] = claims.as_slice() else {
            panic!("{id} was claimed {} times: {claims:?}", claims.len());
        };
        assert_eq!(*attempt, 1, "{id}");
        let row = nodes[1]
            .get(&crate::store::Key {
                namespace: "default".into(),
                workflow_id: crate::store::new_activity_for_tests(id, "t")
                    .key
                    .workflow_id,
                activity_id: id.as_str().into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("{id} is gone"));
        assert_eq!(
            row.status,
            spool_proto::v1::ActivityStatus::Completed,
            "{id}"
        );
        assert_eq!(row.worker_id.as_deref(), Some(worker.as_str()), "{id}");
    }
    let most = keyed_most.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "the key limited to 2 had {most} claimed at once"
    );
}
