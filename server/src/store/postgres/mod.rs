//! PostgreSQL, for more than one node: several servers share one database.
//!
//! Each batch is one transaction. Claims take rows with `FOR UPDATE SKIP LOCKED`,
//! so nodes claiming at once never take the same row and never wait on each other;
//! cancels, re-drives and expiries lock the rows they change. A multi-activity
//! submit is all or nothing through a savepoint (cheap here).
//!
//! The schema is `migrations/postgres`, the same table as SQLite's in PostgreSQL's
//! types; statuses are the wire enum's numbers.
//!
//! Time is the database's (`DbClock`): every node stamps leases and due times
//! with it and judges them by it, so skew between the nodes' own clocks cannot
//! reclaim a live attempt or hold a due row back.
//!
//! Every session sets `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout` (unless the URL's `options` do), so a node
//! that stalls mid-transaction cannot block the others for long. The URL's
//! `sslmode` (and `sslrootcert`, `sslcert`, `sslkey`) is honoured, with rustls.
//! A writing session never commits with `synchronous_commit = off`, whatever the
//! database, role or URL say: an acknowledged change must survive a crash of
//! PostgreSQL (see `durable_commits`).
//!
//! Nodes tell each other about committed changes with `NOTIFY` on one channel
//! ([`CHANNEL`]): each notification is a JSON envelope of events from one node,
//! which every other node's listener turns into wake-ups. A node ignores its own.

use std::{str::FromStr, sync::Arc};

use sqlx::{
    Row,
    migrate::Migrator,
    postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow},
};
use tokio::sync::mpsc;

use super::{
    ActivityRow, AttemptRecord, DueTimes, Error, Event, Key, ListPage, ListQuery, Op, Outcome,
    Remote, RunningPage, SessionTicket, StatusCounts, Store, TakeSession, TypeCounts, rate, rows,
};

mod notify;
mod sql;
mod write;

pub use notify::CHANNEL;

use spool_proto::time::UnixMillis;

/// This version's migrations. Migrations a newer version applied are not an
/// error here: during a rolling upgrade a node of the version before must still
/// start (a crash, a probe's restart, a rollback) beside the nodes that
/// migrated, and every migration keeps what the version before relies on
/// (docs/OPERATIONS.md).
fn migrator() -> Migrator {
    let mut migrator = these_migrations();
    migrator.set_ignore_missing(true);
    migrator
}

fn these_migrations() -> Migrator {
    migrations!(
        "postgres",
        "0001_activities",
        "0002_headers",
        "0003_attempts",
        "0004_worker_sessions",
        "0005_claim_plans",
        "0006_queue_vacuum",
        "0007_transition_free_lists",
        "0008_priority_aging",
        "0009_upcoming_rows_only",
        "0010_rate_limits",
        "0011_concurrency_keys",
        "0012_keyed_claims",
        "0013_concurrency_strategies",
        "0014_key_shares",
        "0015_key_rate_limits",
        "0016_keyed_endings",
        "0017_hot_key_endings",
        "0018_ready_keys",
        "0019_fairness_keys",
        "0020_fairness_weights",
        "0021_rerank_in_steps",
        "0022_keys_with_a_row_due",
    )
}

/// How long a statement, a wait for a lock, or an open transaction left idle may
/// last on our sessions, unless the URL's `options` say otherwise: a stalled node
/// must not hold locks that block the others for long.
const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "30s"),
    ("lock_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// The planner settings of the sessions that write (and claim). A claim must read
/// `activities_due` in its order and stop at its `LIMIT`; but on statistics taken
/// when the table was empty, or held only finished rows, every index on SCHEDULED
/// rows looks equally free, and a plan that reads them all and sorts them looks as
/// good, and costs a scan of the whole backlog per claim. No statement these
/// sessions run needs a sort that an index cannot give in order, so sorting is
/// priced out: where an index gives the order, that plan wins whatever the
/// statistics say (PostgreSQL still sorts where nothing else can).
///
/// A sort priced out makes its plan look expensive, and a plan that expensive
/// is compiled by JIT: LLVM took 1.8 s to compile a submit of 500 rows whose
/// fairness keys need a sort. No statement of these sessions runs long enough for
/// compiling to pay, so JIT is off.
const WRITER_PLANNING: [(&str, &str); 2] = [("enable_sort", "off"), ("jit", "off")];

/// Tells the per-row triggers that count keyed rows that this version's statements
/// count them themselves (see the `0016_keyed_endings` migration); nodes of the
/// version before do not set it, and the triggers count theirs.
const KEYED_COUNTS: [(&str, &str); 1] = [("spool.keyed_counts", "statement")];

/// How long taking a pooled connection may wait (and so how long start-up keeps
/// trying an unreachable server).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `options` with [`SESSION_LIMITS`] added where the URL does not set them.
fn session_limits(options: PgConnectOptions) -> PgConnectOptions {
    let set = options.get_options().unwrap_or_default().to_owned();
    let missing: Vec<_> = SESSION_LIMITS
        .iter()
        .filter(|(name, _)| !set.contains(name))
        .copied()
        .collect();
    if missing.is_empty() {
        options
    } else {
        options.options(missing)
    }
}

/// The database's clock, read without a round trip: the database's time at the
/// last sync plus the monotonic time elapsed since. Every node stamps and judges
/// times by it, so their own wall clocks (skewed, or stepped) do not matter: a
/// lease renewed by one node is judged by the same clock on every other.
struct DbClock {
    /// The database's time (Unix ms) at an instant of this process.
    anchor: std::sync::Mutex<super::Anchored>,
}

/// How often the clock is synced with the database (the monotonic clock drifts
/// little between syncs).
const CLOCK_SYNC: std::time::Duration = std::time::Duration::from_secs(10);

impl DbClock {
    fn now(&self) -> UnixMillis {
        self.anchor.lock().unwrap_or_else(|e| e.into_inner()).now()
    }

    /// Reads the database's clock, placing the reading at the middle of the round
    /// trip. The reading is off by at most half its round trip, so it is taken on
    /// a connection already open (not one the pool is still connecting, or one
    /// queued behind another node's migrations) and the best of a few is kept:
    /// nodes that disagree about the time by a slow round trip would start delayed
    /// rows early, or judge leases wrongly.
    async fn sync(&self, pool: &PgPool) -> Result<(), Error> {
        const READINGS: usize = 3;
        let mut connection = pool.acquire().await?;
        let mut best: Option<(std::time::Duration, i64, std::time::Instant)> = None;
        for _ in 0..READINGS {
            let sent = std::time::Instant::now();
            let db: i64 =
                sqlx::query_scalar("SELECT (extract(epoch from clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&mut *connection)
                    .await?;
            let round_trip = sent.elapsed();
            if best.is_none_or(|(fastest, _, _)| round_trip < fastest) {
                best = Some((round_trip, db, sent + round_trip / 2));
            }
        }
        if let Some((_, db, at)) = best {
            *self.anchor.lock().unwrap_or_else(|e| e.into_inner()) = super::Anchored::new(db, at);
        }
        Ok(())
    }

    /// Keeps the clock synced while the store lives.
    fn keep_synced(clock: &Arc<Self>, pool: PgPool) {
        let clock = Arc::downgrade(clock);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CLOCK_SYNC).await;
                let Some(clock) = clock.upgrade() else { return };
                if let Err(e) = clock.sync(&pool).await {
                    tracing::warn!(error = %e, "cannot read the database's clock; keeping the last reading");
                }
            }
        });
    }
}

/// How often a node checks whether `concurrency_keys` has outgrown its statistics.
const KEY_STATISTICS: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps the planner's statistics of `concurrency_keys` in step with its size
/// until `stop`: `ANALYZE` once the table holds more than twice the rows it held
/// when last analyzed. A claim's statement joins the keys it served to their
/// rows; on statistics taken before a type had its keys the planner believes
/// the type has one, and reads all of them once per key served (1,000 keys, a
/// claim of 50: 50,000 comparisons, 18 ms a claim), until autovacuum, which
/// looks once a minute by default, analyzes the table.
fn keep_key_statistics(pool: PgPool, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(KEY_STATISTICS) => {}
                _ = stop.cancelled() => return,
            }
            if let Err(e) = analyze_keys_if_grown(&pool).await {
                tracing::debug!(error = %e, "cannot refresh the statistics of concurrency_keys");
            }
        }
    });
}

async fn analyze_keys_if_grown(pool: &PgPool) -> Result<(), Error> {
    let sizes: Option<(i64, f32)> = sqlx::query_as(
        "SELECT s.n_live_tup, c.reltuples FROM pg_stat_user_tables AS s \
         JOIN pg_class AS c ON c.oid = s.relid WHERE s.relid = 'concurrency_keys'::regclass",
    )
    .fetch_optional(pool)
    .await?;
    if let Some((live, analyzed)) = sizes
        && live > 100
        && live as f32 > 2.0 * analyzed.max(0.0)
    {
        sqlx::query("ANALYZE concurrency_keys")
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// How long a pooled connection may sit unused before it is checked on the way out.
const PING_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Pool options that check a connection only when it has sat unused a while. The
/// pool's default pings PostgreSQL before every acquire: a round trip in front of
/// every batch the committer writes. A connection in steady use that breaks fails
/// its request (which is retried or answered with an error) and is closed when it
/// goes back; one idle through a restart is caught here.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Turns `synchronous_commit = off` (from the server's configuration, the
/// database's or role's defaults, or the URL) back to `on` on a writing session.
/// With it off, a commit returns before its WAL reaches the disk, and a crash of
/// PostgreSQL can lose a submit or a result already acknowledged to its caller.
/// `local`, `remote_write` and `remote_apply` all flush locally first and are
/// kept: an operator waiting on replicas keeps that.
async fn durable_commits(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let raised: Option<String> = sqlx::query_scalar(
        "SELECT set_config('synchronous_commit', 'on', false) \
         WHERE current_setting('synchronous_commit') = 'off'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if raised.is_some() {
        WARNED.call_once(|| {
            tracing::warn!(
                "synchronous_commit is off for this database or role: \
                 Spool's writing sessions turn it on, so acknowledged work survives a crash"
            );
        });
    }
    Ok(())
}

pub struct PostgresStore {
    /// Time as the database tells it (see [`DbClock`]).
    clock: Arc<DbClock>,
    /// Writes (the committer's transactions) and the server's own reads (due
    /// times, reclaims), apart from the API's callers so the committer never waits
    /// behind a caller's List.
    pool: PgPool,
    /// Reads for callers of the API (Get, List, Stats, Waits).
    readers: PgPool,
    /// This node on the notification channel: its id (so it can ignore its own),
    /// its schema, and the other nodes it has heard.
    channel: Arc<notify::Channel>,
    /// Ends the store's background upkeep when the store goes.
    _upkeep: tokio_util::sync::DropGuard,
}

impl PostgresStore {
    /// Connects to `postgres://…` and runs migrations.
    pub async fn open(url: &str) -> Result<Self, Error> {
        Self::open_with(PgConnectOptions::from_str(url)?).await
    }

    pub async fn open_with(options: PgConnectOptions) -> Result<Self, Error> {
        let options = session_limits(options).options(KEYED_COUNTS);
        let pool = pool_options()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(|conn, _| Box::pin(durable_commits(conn)))
            .connect_with(options.clone().options(WRITER_PLANNING))
            .await?;
        // Two readers are kept open: a new connection cost a request about 90 ms
        // in the tests (loopback, TLS negotiated by default; the client mostly
        // waiting, not computing). The first `Get` of a node paid it, and so did
        // a `Get` whose second read came before its first connection was back in
        // the pool.
        let readers = pool_options()
            .max_connections(8)
            .min_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        let mut conn = pool.acquire().await?;
        migrator().run_direct(None, &mut *conn, false).await?;
        drop(conn);
        let clock = Arc::new(DbClock {
            anchor: std::sync::Mutex::new(super::Anchored::new(
                spool_proto::time::now_millis(),
                std::time::Instant::now(),
            )),
        });
        clock.sync(&pool).await?;
        DbClock::keep_synced(&clock, pool.clone());
        let upkeep = tokio_util::sync::CancellationToken::new();
        keep_key_statistics(readers.clone(), upkeep.clone());
        let scope: String = sqlx::query_scalar("SELECT current_schema()::TEXT")
            .fetch_one(&pool)
            .await?;
        Ok(Self {
            clock,
            pool,
            readers,
            channel: notify::Channel::new(uuid::Uuid::now_v7().to_string(), scope),
            _upkeep: upkeep.drop_guard(),
        })
    }
}

fn decode(row: &PgRow) -> Result<ActivityRow, Error> {
    rows::decode(&rows::Sqlx(row))
}

shared_reads!(PostgresStore, row: sqlx::postgres::PgRow, callers: readers, own: pool);

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        if let Some(batch) = write::OneStatement::of(&ops) {
            let mut conn = self.pool.acquire().await?;
            return write::apply_one_statement(&mut conn, batch, now).await;
        }
        let mut tx = self.pool.begin().await?;
        let outcomes = write::apply(&mut tx, &ops, now).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn save_ticket(&self, ticket: &SessionTicket) -> Result<(), Error> {
        sqlx::query(sql::SAVE_TICKET)
            .bind(&ticket.worker_id)
            .bind(&ticket.secret)
            .bind(&ticket.caller)
            .bind(&ticket.registration)
            .bind(ticket.at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn take_session(&self, take: &TakeSession) -> Result<Option<Vec<ActivityRow>>, Error> {
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(sql::TAKE_TICKET)
            .bind(&take.ticket.worker_id)
            .bind(&take.old_secret)
            .bind(&take.ticket.secret)
            .bind(&take.ticket.caller)
            .bind(&take.ticket.registration)
            .bind(take.ticket.at)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let rows = sqlx::query(sql::ADOPT)
            .bind(&take.ticket.worker_id)
            .bind(&take.node)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(rows::decode_all(&rows, "adopt")))
    }

    fn single_node(&self) -> bool {
        false
    }

    fn others_staying(&self) -> bool {
        self.channel.others_staying()
    }

    async fn set_draining(&self, draining: bool) {
        self.channel.set_draining(draining);
        notify::announce(&self.pool, &self.channel).await;
    }

    fn writers(&self) -> usize {
        2
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    async fn publish(&self, events: Vec<Event>) -> Result<(), Error> {
        notify::publish(&self.pool, &self.channel, events).await
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, Error> {
        notify::subscribe(self.pool.clone(), self.channel.clone())
            .await
            .map(Some)
    }

    async fn set_priority_aging(
        &self,
        per_level: Option<std::time::Duration>,
    ) -> Result<bool, Error> {
        let changed = sqlx::query(sql::SET_PRIORITY_AGING)
            .bind(super::priority_aging_ms(per_level))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(changed > 0)
    }
}

#[cfg(test)]
mod tests;
