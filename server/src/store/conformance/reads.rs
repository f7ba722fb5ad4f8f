//! Reads: list pages (filters, both orders, a byte budget), counts by status and
//! by type, running rows and due times, and rows no read may trip on.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn list_pages_and_filters(store: &dyn Store, _raw: &Raw) {
    for i in 0..7 {
        submit(
            store,
            new(&format!("a{i}"), if i % 2 == 0 { "even" } else { "odd" }),
        )
        .await;
    }
    claim(store, &["odd"], 1, T0).await;
    let page = |after_id, status, ty: Option<&str>| ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status,
        activity_type: ty.map(Into::into),
        after_id,
        limit: 3,
        max_bytes: 1 << 20,
    };
    let list = |query: ListQuery| async move {
        store
            .list(&query)
            .await
            .unwrap_or_else(|e| panic!("list: {e}"))
    };
    let first = list(page(0, None, None)).await;
    assert_eq!(first.rows.len(), 3);
    let last_id = first.rows.last().map_or(0, |r| r.id);
    assert_eq!(first.next_after, Some(last_id));
    let second = list(page(last_id, None, None)).await;
    assert_eq!(second.rows.len(), 3);
    assert!(second.rows.iter().all(|r| r.id > last_id));
    let third = list(page(second.next_after.unwrap_or(0), None, None)).await;
    assert_eq!(
        (third.rows.len(), third.next_after),
        (1, None),
        "the last page says no more follow"
    );
    let evens = list(page(0, None, Some("even"))).await;
    assert!(evens.rows.iter().all(|r| r.activity_type == "even"));
    assert_eq!(evens.rows.len(), 3);
    let running = list(page(0, Some(ActivityStatus::Running), None)).await;
    assert_eq!(running.rows.len(), 1);
    let other = ListQuery {
        namespace: "other".into(),
        ..page(0, None, None)
    };
    assert!(list(other).await.rows.is_empty());

    // Newest first: seven rows, pages of three, each page below the last.
    let newest = |after_id| ListQuery {
        newest_first: true,
        ..page(after_id, None, None)
    };
    let first = list(newest(0)).await;
    let ids: Vec<i64> = first.rows.iter().map(|r| r.id).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "descending: {ids:?}");
    assert_eq!(first.rows[0].key.activity_id, "a6", "the newest first");
    let second = list(newest(first.next_after.unwrap_or(0))).await;
    assert_eq!(second.rows.len(), 3);
    assert!(second.rows.iter().all(|r| r.id < ids[2]));
    let third = list(newest(second.next_after.unwrap_or(0))).await;
    assert_eq!((third.rows.len(), third.next_after), (1, None));
    assert_eq!(third.rows[0].key.activity_id, "a0");
}

pub(super) async fn list_pages_are_bounded_by_bytes(store: &dyn Store, _raw: &Raw) {
    let big = |id: &str, size: usize| {
        let mut a = new(id, "t");
        a.input.data = vec![b'x'; size];
        a
    };
    submit(store, big("a", 400_000)).await;
    submit(store, big("b", 400_000)).await;
    submit(store, big("c", 2_000_000)).await;
    submit(store, big("d", 10)).await;
    let page = |after_id| ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status: None,
        activity_type: None,
        after_id,
        limit: 100,
        max_bytes: 1_000_000,
    };
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let p = store
            .list(&page(after))
            .await
            .unwrap_or_else(|e| panic!("list: {e}"));
        pages.push(
            p.rows
                .iter()
                .map(|r| r.key.activity_id.clone())
                .collect::<Vec<_>>(),
        );
        match p.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![vec!["a", "b"], vec!["c"], vec!["d"]],
        "pages fit the byte budget; a row larger than it comes alone"
    );
}

/// Each status is read along its own index (the SQLite store lists and counts
/// without an index on status): pages of every status, in both orders, hold
/// exactly that status's rows of the namespace, whose ids interleave with another's.
pub(super) async fn every_status_lists_in_order_and_counts_apart_from_other_namespaces(
    store: &dyn Store,
    _raw: &Raw,
) {
    let in_ns = |ns: &str, id: &str| Key {
        namespace: ns.into(),
        ..key(id)
    };
    for i in 0..9 {
        for ns in ["default", "other"] {
            let mut activity = new(&format!("a{i}"), "t");
            activity.key = in_ns(ns, &format!("a{i}"));
            submit(store, activity).await;
        }
    }
    for ns in ["default", "other"] {
        let claim = Op::Claim(Claim {
            namespace: ns.into(),
            limit: 6,
            ..match claim_for(&["t"], 6) {
                Op::Claim(c) => c,
                other => panic!("{other:?}"),
            }
        });
        let Outcome::Claimed { rows, .. } = one(store, claim, T0).await else {
            panic!("expected Claimed");
        };
        let ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.as_str()).collect();
        assert_eq!(
            ids,
            ["a0", "a1", "a2", "a3", "a4", "a5"],
            "oldest first in {ns}"
        );
        assert!(finish(store, &rows[0], output("ok"), T0 + 1).await);
        assert!(finish(store, &rows[1], output("ok"), T0 + 1).await);
        let error = crate::store::server_error(ErrorKind::Terminal, "Fatal", "no".into());
        assert!(finish(store, &rows[2], Transition::Fail { error }, T0 + 1).await);
        let cancel = Op::Cancel {
            key: in_ns(ns, "a8"),
            reason: String::new(),
        };
        one(store, cancel, T0 + 1).await;
    }
    let expected = [
        (
            None,
            vec!["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"],
        ),
        (Some(ActivityStatus::Scheduled), vec!["a6", "a7"]),
        (Some(ActivityStatus::Running), vec!["a3", "a4", "a5"]),
        (Some(ActivityStatus::Completed), vec!["a0", "a1"]),
        (Some(ActivityStatus::Failed), vec!["a2"]),
        (Some(ActivityStatus::Cancelled), vec!["a8"]),
    ];
    for ns in ["default", "other"] {
        for (status, ids) in &expected {
            for newest_first in [false, true] {
                let mut seen = Vec::new();
                let mut after_id = 0;
                loop {
                    let page = store
                        .list(&ListQuery {
                            namespace: ns.into(),
                            status: *status,
                            newest_first,
                            after_id,
                            ..everything(2)
                        })
                        .await
                        .unwrap_or_else(|e| panic!("list: {e}"));
                    assert!(page.rows.len() <= 2);
                    for row in &page.rows {
                        assert_eq!(row.key.namespace, ns);
                        seen.push(row.key.activity_id.clone());
                    }
                    match page.next_after {
                        Some(next) => after_id = next,
                        None => break,
                    }
                }
                let mut want = ids.clone();
                if newest_first {
                    want.reverse();
                }
                assert_eq!(seen, want, "{ns}, {status:?}, newest first: {newest_first}");
            }
        }
        assert_eq!(
            store.stats(ns).await.unwrap_or_else(|e| panic!("{e}")),
            StatusCounts {
                scheduled: 2,
                running: 3,
                completed: 2,
                failed: 1,
                cancelled: 1,
            },
            "{ns}"
        );
    }
    assert_eq!(
        backlog_at(store, T0 + 1, |c| c.namespace.clone()).await,
        [
            ("default".to_owned(), 2, 0, 3, 1),
            ("other".to_owned(), 2, 0, 3, 1)
        ]
    );
}

pub(super) async fn stats_count_by_status(store: &dyn Store, _raw: &Raw) {
    for i in 0..5 {
        submit(store, new(&format!("a{i}"), "t")).await;
    }
    let rows = claim(store, &["t"], 2, T0).await;
    finish(store, &rows[0], output("ok"), T0).await;
    one(
        store,
        Op::Cancel {
            key: key("a4"),
            reason: String::new(),
        },
        T0,
    )
    .await;
    let counts = store.stats("default").await.unwrap_or_default();
    assert_eq!(
        counts,
        StatusCounts {
            scheduled: 2,
            running: 1,
            completed: 1,
            failed: 0,
            cancelled: 1,
        }
    );
    assert_eq!(
        store.stats("other").await.unwrap_or_default(),
        StatusCounts::default()
    );
}

pub(super) async fn type_counts_split_the_backlog(store: &dyn Store, _raw: &Raw) {
    submit(store, new("due-1", "a")).await;
    submit(store, new("due-2", "a")).await;
    let mut later = new("later", "a");
    later.next_at = T0 + 60_000;
    submit(store, later).await;
    submit(store, new("run", "b")).await;
    submit(store, new("dead", "b")).await;
    claim(store, &["b"], 2, T0).await;
    let dead = get(store, "dead").await;
    let error = crate::store::server_error(ErrorKind::Terminal, "Fatal", "no".into());
    assert!(finish(store, &dead, Transition::Fail { error }, T0 + 1).await);
    assert_eq!(
        backlog_at(store, T0 + 10, |c| c.activity_type.clone()).await,
        [("a".to_owned(), 2, 1, 0, 0), ("b".to_owned(), 0, 0, 1, 1)]
    );
}

/// The type counts at `now`, each as its name (`name` picks namespace or type),
/// due, delayed, running and failed.
async fn backlog_at(
    store: &dyn Store,
    now: i64,
    name: impl Fn(&TypeCounts) -> String,
) -> Vec<(String, u64, u64, u64, u64)> {
    let counts = store
        .type_counts(now)
        .await
        .unwrap_or_else(|e| panic!("type_counts: {e}"));
    counts
        .iter()
        .map(|c| (name(c), c.due, c.delayed, c.running, c.failed))
        .collect()
}

pub(super) async fn running_and_due_times(store: &dyn Store, _raw: &Raw) {
    let mut later = new("later", "t");
    later.next_at = T0 + 5_000;
    let mut later_too = new("later-too", "t");
    later_too.next_at = T0 + 5_000;
    let mut other = new("other", "u");
    other.next_at = T0 + 9_000;
    submit(store, new("now", "t")).await;
    submit(store, later).await;
    submit(store, later_too).await;
    submit(store, other).await;
    let due = |after, limit| async move { store.due_times(after, limit).await.unwrap_or_default() };
    let ns = || "default".to_string();
    let all = due(T0, 10).await;
    assert_eq!(
        all.times,
        vec![
            (T0 + 5_000, ns(), "t".to_string()),
            (T0 + 9_000, ns(), "u".to_string())
        ],
        "one entry per time, namespace and type"
    );
    assert!(all.complete);
    let first = due(T0 - 1, 1).await;
    assert_eq!(
        first.times,
        vec![(T0 + 5_000, ns(), "t".to_string())],
        "a row due when written ('now') is not read: its type was marked due then"
    );
    assert!(!first.complete, "a read that stopped at its limit says so");
    claim(store, &["t"], 2, T0 + 5_000).await;
    let first = store.running(0, 1).await.unwrap_or_default();
    assert_eq!(first.rows.len(), 1);
    assert_eq!(first.rows[0].key.activity_id, "now");
    assert!(
        first.rows[0].input.data.is_empty(),
        "running rows are read without their payloads"
    );
    let rest = store
        .running(first.next_after.unwrap_or(i64::MAX), 10)
        .await
        .unwrap_or_default();
    assert_eq!(rest.rows.len(), 1);
    assert_eq!(rest.next_after, None);
}

pub(super) async fn an_unreadable_row_is_left_out_of_every_read(store: &dyn Store, raw: &Raw) {
    for id in ["a", "b", "c", "d"] {
        submit(store, new(id, "t")).await;
    }
    claim(store, &["t"], 4, T0).await;
    // An unknown status and a broken policy: no version writes them, and every read
    // must survive them.
    raw.execute("UPDATE activities SET status = 99 WHERE activity_id = 'b'")
        .await;
    raw.execute("UPDATE activities SET non_retryable = '{broken' WHERE activity_id = 'd'")
        .await;
    if raw.is_sqlite() {
        // What an older version stored when a time overflowed: a REAL.
        raw.execute("UPDATE activities SET expires_at = 1e30 WHERE activity_id = 'c'")
            .await;
    }
    let page = store
        .list(&everything(10))
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    let ids: Vec<_> = page
        .rows
        .iter()
        .map(|r| r.key.activity_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "c"]);
    if raw.is_sqlite() {
        assert_eq!(page.rows[1].expires_at, Some(i64::MAX), "a REAL saturates");
    }
    let running = store.running(0, 10).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(running.rows.len(), 2);
    raw.execute("UPDATE activities SET lease_expires_at = 0")
        .await;
    let expired = store
        .expired_leases(T0, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(expired.len(), 2);
    let counts = store
        .stats("default")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts.running, 3, "the unknown status is left out of Stats");
    assert!(matches!(store.get(&key("b")).await, Err(Error::Corrupt(_))));
}
