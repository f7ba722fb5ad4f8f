//! The size of PostgreSQL's queue table over a run: `activities` and its
//! indexes, live and dead rows, every few seconds. Under steady churn with a short
//! retention, pruning and vacuum must make these level off; a table that grows
//! without bound is bloat.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};
use tokio_util::sync::CancellationToken;

const EVERY: Duration = Duration::from_secs(10);

const SIZES: &str = "SELECT pg_table_size(s.relid), pg_indexes_size(s.relid), \
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count \
     FROM pg_stat_user_tables s WHERE s.relname = 'activities' \
       AND s.schemaname = current_schema()";

/// Samples `database`'s queue table until `stop`; the samples as JSON.
pub async fn watch(database: String, stop: CancellationToken) -> Result<serde_json::Value, String> {
    let mut conn = PgConnection::connect(&database)
        .await
        .map_err(|e| format!("cannot watch the queue table: {e}"))?;
    let started = Instant::now();
    let mut samples = Vec::new();
    loop {
        let row = sqlx::query(SIZES)
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| format!("cannot read the queue table's size: {e}"))?;
        if let Some(row) = row {
            let get = |i: usize| row.try_get::<i64, _>(i).unwrap_or(-1);
            samples.push(serde_json::json!({
                "at_s": started.elapsed().as_secs(),
                "table_bytes": get(0),
                "index_bytes": get(1),
                "live_rows": get(2),
                "dead_rows": get(3),
                "autovacuums": get(4),
            }));
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.cancelled() => break,
        }
    }
    Ok(serde_json::Value::Array(samples))
}
