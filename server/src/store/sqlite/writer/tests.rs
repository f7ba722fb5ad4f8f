//! Tests of `writer`.

use super::*;

/// A migrated database file in `dir`, and a writing connection to it.
async fn fresh(dir: &tempfile::TempDir) -> (std::path::PathBuf, Connection) {
    let path = dir.path().join("spool.db");
    let url = format!("sqlite://{}", path.display());
    // Creates and migrates the file; the store's own writer is dropped with it.
    drop(
        super::super::SqliteStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let conn = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
    (path, conn)
}

#[tokio::test]
async fn a_connection_left_in_a_transaction_is_replaced() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (path, mut conn) = fresh(&dir).await;
    // As a failed ROLLBACK would leave it.
    conn.batch("BEGIN IMMEDIATE")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(conn.in_transaction());
    recover(&mut conn, &path);
    assert!(!conn.in_transaction());
    let outcome = run_batch(
        &mut conn,
        &[Op::Prune {
            before: 0,
            limit: 1,
        }],
        0,
    );
    assert!(outcome.is_ok(), "batches run again: {outcome:?}");
}

/// The bundled SQLite is built with the options in `.cargo/config.toml`:
/// statement journals in memory up to 1 MiB (a statement over many
/// concurrency keys journals more than the default 64 KiB, which went to a
/// temporary file with a `write` per page, 33 KB per activity), and no
/// memory statistics (a global mutex on every allocation).
#[tokio::test]
async fn the_bundled_sqlite_is_built_with_our_options() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_, mut conn) = fresh(&dir).await;
    let mut q = conn
        .query("PRAGMA compile_options")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut options = Vec::new();
    while q.step().unwrap_or_else(|e| panic!("{e}")) {
        options.push(q.text(0).unwrap_or_else(|e| panic!("{e:?}")));
    }
    for wanted in ["STMTJRNL_SPILL=1048576", "DEFAULT_MEMSTATUS=0"] {
        assert!(options.iter().any(|o| o == wanted), "{wanted}: {options:?}");
    }
}

/// Text that is not UTF-8 makes the row unreadable (an error the reads count
/// and skip), never a silently repaired string.
#[tokio::test]
async fn text_that_is_not_utf8_is_an_error_not_a_repair() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_, mut conn) = fresh(&dir).await;
    let key = Key {
        namespace: "default".into(),
        workflow_id: "wf".into(),
        activity_id: "a".into(),
    };
    let new = crate::store::new_activity_for_tests("a", "t");
    run_batch(&mut conn, &[Op::Submit(vec![new])], 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        select_one(&mut conn, &key, sql::SELECT_BY_KEY)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_some()
    );
    conn.batch("UPDATE activities SET worker_id = CAST(X'C328' AS TEXT)")
        .unwrap_or_else(|e| panic!("{e}"));
    match select_one(&mut conn, &key, sql::SELECT_BY_KEY) {
        Err(Error::Corrupt(why)) => assert!(why.contains("UTF-8"), "{why}"),
        other => panic!("expected a corrupt row, got {other:?}"),
    }
}
