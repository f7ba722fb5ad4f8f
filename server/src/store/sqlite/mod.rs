//! The embedded default: one SQLite file in WAL mode.
//!
//! Writes go through one dedicated connection on its own thread
//! (`writer`; SQLite has one writer anyway), each batch in a `BEGIN
//! IMMEDIATE` transaction committed with `synchronous=FULL`, so a commit is on disk
//! before any caller hears of it. Reads use small sqlx pools of other connections,
//! which WAL lets run beside the writer: one for the API's callers, one for the
//! server's own reads (so the committer never waits behind a caller's List).
//! Migrations run through sqlx at open.
//!
//! Every statement is in `sql`; what each write does is decided in `store::change`.
//!
//! The process holds an exclusive `flock` on the database file for its lifetime:
//! two servers on one file would both reclaim each other's RUNNING rows at start-up.

use std::{fs::File, str::FromStr, sync::Arc, time::Duration};

use super::{
    ActivityRow, AttemptRecord, DueTimes, Error, Key, ListPage, ListQuery, Op, Outcome,
    RunningPage, StatusCounts, Store, TypeCounts, rate, rows,
};

mod raw;
mod sql;
mod writer;

use spool_proto::time::UnixMillis;
use sqlx::{
    Connection, Row, SqliteConnection,
    migrate::Migrator,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};
pub use writer::WRITER_THREAD;
use writer::Writer;

fn migrator() -> Migrator {
    migrations!(
        "sqlite",
        "0001_activities",
        "0002_integer_times",
        "0003_headers",
        "0004_attempts",
        "0005_transition_free_lists",
        "0006_priority_aging",
        "0007_upcoming_rows_only",
        "0008_rate_limits",
        "0009_concurrency_keys",
        "0010_keyed_claims",
        "0011_concurrency_strategies",
        "0012_key_shares",
        "0013_key_rate_limits",
        "0014_keyed_endings",
        "0015_fairness_keys",
        "0016_fairness_weights",
        "0017_moves_on_expires_at",
        "0018_keyed_waiting_in_memory",
        "0019_rerank_in_steps",
    )
}

pub struct SqliteStore {
    /// The thread that owns the one writing connection (dropped first: it closes
    /// the connection before the lock below is released).
    writer: Writer,
    /// Reads for callers of the API (Get, List, Stats, Waits).
    readers: SqlitePool,
    /// The server's own reads (due times, reclaims), on a connection of their own,
    /// so the committer never waits behind the API's reads.
    internal: SqlitePool,
    /// Holds the process-wide `flock` until the store is dropped.
    _lock: File,
    /// What `now` reads: the wall clock at open, never behind the newest time
    /// stored, read forward by the monotonic clock.
    clock: super::Anchored,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`), takes the
    /// file lock and runs migrations.
    pub async fn open(url: &str) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .statement_cache_capacity(64);
        let path = options.get_filename().to_path_buf();
        if path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:") {
            // Each pooled connection would get its own empty in-memory database.
            return Err(Error::UnsupportedUrl(url.to_owned()));
        }
        let mut setup = SqliteConnection::connect_with(&options).await?;
        let lock = File::open(&path).map_err(|source| Error::Open {
            path: path.display().to_string(),
            source,
        })?;
        if lock.try_lock().is_err() {
            return Err(Error::Locked(path.display().to_string()));
        }
        migrator().run_direct(None, &mut setup, false).await?;
        // A clock stepped back while the server was down must not make times
        // already stored lie ahead: due rows would wait out the step.
        let newest: Option<i64> = sqlx::query_scalar(sql::NEWEST_TIME)
            .fetch_one(&mut setup)
            .await?;
        let wall = spool_proto::time::now_millis();
        if let Some(newest) = newest.filter(|&n| n > wall) {
            tracing::warn!(
                ahead_ms = newest - wall,
                "the wall clock is behind the newest time stored: times go on from that one"
            );
        }
        let clock = super::Anchored::new(
            newest.map_or(wall, |n| n.max(wall)),
            std::time::Instant::now(),
        );
        setup.close().await?;
        let writer = Writer::start(&path)?;
        // A connection to a local file does not go stale, so the pool's ping before
        // each acquire (a round trip to the connection's thread) buys nothing.
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        let internal = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        Ok(Self {
            writer,
            readers,
            internal,
            _lock: lock,
            clock,
        })
    }
}

shared_reads!(SqliteStore, row: sqlx::sqlite::SqliteRow, callers: readers, own: internal);

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        self.writer.apply(ops, now).await
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    fn single_node(&self) -> bool {
        true
    }

    /// The writer thread runs batches in turn, so the second one queues behind
    /// the first; meanwhile the committer lands the first (hands out its rows,
    /// answers its requests), which in a drain is a fifth of each cycle.
    fn writers(&self) -> usize {
        2
    }

    /// Under light load a batch is a row or two, and landing it is nothing to
    /// overlap: writing two such batches in turn would cost two fsyncs for what
    /// one covers.
    fn beside_min_rows(&self) -> usize {
        16
    }

    async fn set_priority_aging(
        &self,
        per_level: Option<std::time::Duration>,
    ) -> Result<bool, Error> {
        // On the writer's connection, the only one that writes.
        self.writer
            .set_priority_aging(super::priority_aging_ms(per_level))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        crate::store::migrations_are_numbered_in_order(&migrator());
    }

    /// One process per file: a second open of a file in use is refused, and the
    /// file is free again once the first store is gone.
    #[tokio::test]
    async fn a_database_file_is_held_by_one_store_at_a_time() {
        let (_dir, url) = crate::store::tests::sqlite_url_for_tests();
        let first = SqliteStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        match SqliteStore::open(&url).await {
            Err(Error::Locked(path)) => assert!(path.ends_with("spool.db"), "{path}"),
            other => panic!("expected Locked, got {:?}", other.err()),
        }
        drop(first);
        assert!(SqliteStore::open(&url).await.is_ok());
    }

    /// Callers holding every API read connection do not hold up the server's own
    /// work (see `own_work_never_waits_behind_callers`).
    #[tokio::test]
    async fn the_servers_own_work_never_waits_behind_callers() {
        let (_dir, store) = crate::store::tests::sqlite_for_tests().await;
        let held = crate::store::tests::hold_every_connection(&store.readers).await;
        crate::store::tests::own_work_never_waits_behind_callers(&store).await;
        drop(held);
    }
}
