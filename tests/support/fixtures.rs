//! Fixtures both test packages (the e2e tests and the process tests) share: a fresh
//! PostgreSQL schema per test, and polling until a condition holds.

use std::time::Duration;

/// The environment variable naming a PostgreSQL server for the tests that need one.
pub const POSTGRES_URL: &str = "SPOOL_TEST_POSTGRES_URL";

/// A database URL for a fresh schema of its own (named `{prefix}_…`) on the
/// PostgreSQL server the environment names, so tests run in parallel. Tests that
/// call it are ignored where none is configured (`spool_test_postgres`); where
/// they run, a missing server fails them.
pub async fn postgres_schema(prefix: &str) -> String {
    use sqlx::Connection;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let base = std::env::var(POSTGRES_URL)
        .unwrap_or_else(|_| panic!("{POSTGRES_URL} must name a PostgreSQL server"));
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
