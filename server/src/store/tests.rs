//! Tests of the store's shared types.

use super::error::postgres_class;
use super::*;

/// A fresh SQLite file in its own directory, which must outlive the store.
pub(crate) async fn sqlite_for_tests() -> (tempfile::TempDir, SqliteStore) {
    let (dir, url) = sqlite_url_for_tests();
    let store = SqliteStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    (dir, store)
}

/// The URL of a fresh SQLite file, with the directory that holds it.
pub(crate) fn sqlite_url_for_tests() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}", dir.path().join("spool.db").display());
    (dir, url)
}

/// Holds every connection of a pool, as callers' slow reads would.
pub(crate) async fn hold_every_connection<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Vec<sqlx::pool::PoolConnection<DB>> {
    let mut held = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        held.push(pool.acquire().await.unwrap_or_else(|e| panic!("{e}")));
    }
    held
}

/// With every callers' read connection held, the server's own work does not
/// wait: a write, the committer's due times, the sweep's reclaims. Each
/// dialect's test holds its connections and then calls this.
pub(crate) async fn own_work_never_waits_behind_callers(store: &dyn Store) {
    let quick = Duration::from_secs(2);
    let prune = Arc::from(vec![Op::Prune {
        before: 0,
        limit: 1,
    }]);
    let applied = tokio::time::timeout(quick, store.apply(prune, 0)).await;
    assert!(matches!(applied, Ok(Ok(_))), "a write waited: {applied:?}");
    let due = tokio::time::timeout(quick, store.due_times(0, 10)).await;
    assert!(matches!(due, Ok(Ok(_))), "due times waited: {due:?}");
    let leases = tokio::time::timeout(quick, store.expired_leases(0, 10)).await;
    assert!(matches!(leases, Ok(Ok(_))), "reclaim waited");
}

#[test]
fn only_what_may_pass_is_transient() {
    let sqlite = |code| {
        Error::Sqlite {
            code,
            message: String::new(),
        }
        .class()
    };
    assert_eq!(sqlite(5), Class::Transient, "SQLITE_BUSY");
    assert_eq!(
        sqlite(5 | (1 << 8)),
        Class::Transient,
        "SQLITE_BUSY_RECOVERY"
    );
    assert_eq!(sqlite(13), Class::Transient, "SQLITE_FULL");
    assert_eq!(
        sqlite(10 | (3 << 8)),
        Class::Transient,
        "SQLITE_IOERR_WRITE"
    );
    assert_eq!(sqlite(20), Class::InvalidInput, "SQLITE_MISMATCH");
    assert_eq!(sqlite(18), Class::InvalidInput, "SQLITE_TOOBIG");
    assert_eq!(sqlite(19), Class::Conflict, "SQLITE_CONSTRAINT");
    assert_eq!(sqlite(11), Class::Internal, "SQLITE_CORRUPT");
    assert_eq!(
        postgres_class("08006"),
        Class::Transient,
        "connection failure"
    );
    assert_eq!(postgres_class("40001"), Class::Transient, "serialization");
    assert_eq!(
        postgres_class("57014"),
        Class::Transient,
        "statement timeout"
    );
    assert_eq!(postgres_class("55P03"), Class::Transient, "lock timeout");
    assert_eq!(postgres_class("22003"), Class::InvalidInput, "out of range");
    assert_eq!(postgres_class("22021"), Class::InvalidInput, "NUL in text");
    assert_eq!(postgres_class("23505"), Class::Conflict, "unique violation");
    assert_eq!(postgres_class("42P01"), Class::Internal, "undefined table");
    assert_eq!(
        Error::Database(sqlx::Error::PoolTimedOut).class(),
        Class::Transient
    );
    assert_eq!(Error::Corrupt(String::new()).class(), Class::Internal);
}
