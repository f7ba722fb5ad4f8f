//! Fixtures every test package (the server's unit tests, the e2e tests and the
//! process tests) shares: a fresh PostgreSQL schema per test, and polling until a
//! condition holds.

use std::time::Duration;

pub use crate::services::postgres_url;

/// A database URL for a fresh schema of its own (named `{prefix}_…`) on the tests'
/// PostgreSQL server (`services::postgres_url`), so tests run in parallel. Tests
/// that call it are ignored where PostgreSQL cannot be had (`spool_test_postgres`);
/// where they run, a missing server fails them.
pub async fn postgres_schema(prefix: &str) -> String {
    use sqlx::Connection;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let base = postgres_url();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let schema = format!("{prefix}_{nanos:x}_{:x}_{n}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("connect to PostgreSQL at {base}: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create schema {schema}: {e}"));
    let separator = if base.contains('?') { '&' } else { '?' };
    format!("{base}{separator}options=-csearch_path%3D{schema}")
}

/// Polls `check` until it yields a value, failing the test after `within`.
pub async fn eventually_for<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
